"""Upstream v0.4's catalog-side routing fields (``V04-DELTA.md`` §2g), with upstream's names:

- ``routing.candidate_requirements`` (acted on: vllm_sr/router/selection/candidates.py);
- ``routing.data_policy.replay`` (acted on: false turns router_replay off for the recipe, and
  no decision can turn it back on, as upstream says);
- ``routing.model_bindings`` / ``global.model_catalog.bindings`` (metadata: the consumers they
  bind are upstream's classifiers and system roles; vllm-sr's heads are named on the signal);
- the top-level ``evaluation`` (benchmarks, indices, records): a record of upstream's legacy
  scalar benchmark ``vllm-sr/operator-rating@1.0.0`` (``metrics.score``) is the model card's
  quality when the card has no ``quality_score`` (upstream's migration moves ``quality_score``
  there); the rest is metadata;
- the modelCard fields v0.4 added (display_name, publisher, presentation, distribution, family,
  revision, released_at, knowledge_cutoff, lifecycle, max_output_tokens, modalities): metadata,
  except ``max_output_tokens`` and ``modalities.input``, which candidate filtering reads."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vllm_sr.config.routing_base import Strict

OPERATOR_RATING = "vllm-sr/operator-rating@1.0.0"


class CandidateRequirements(Strict):
    capabilities: Literal["declared"] | None = None
    """declared: a candidate whose card declares what it can take (capabilities, or
    modalities.input) must declare what the request needs (tools, images, audio)."""

    context: Literal["known_limits"] | None = None
    """known_limits: a candidate whose card states its context window (or max output tokens)
    is dropped when the request's estimated tokens (or asked output) exceed it."""


class DataPolicy(Strict):
    replay: bool | None = None
    """false: no router_replay record for this recipe, whatever a decision or
    global.services.router_replay says."""


class PairScorer(Strict):
    layer: int | None = None
    """Upstream: the pair scorer's layer."""

    dimension: int | None = None
    """Upstream: the pair scorer's dimension."""


class OperatingPoint(Strict):
    path: str
    """Upstream: the operating point file."""

    sha256: str
    """Upstream: its digest."""


class ModelBinding(Strict):
    """Upstream: which deployment (and head, adapter, contract) answers a model consumer
    (metadata here)."""

    deployment: str | None = None
    """Upstream: the deployment."""

    contract: str | None = None
    """Upstream: the result contract (label_distribution.v1, label_scores.v1, ...)."""

    adapter: str | None = None
    """Upstream: the runtime adapter."""

    head: str | None = None
    """Upstream: the head."""

    mapping_path: str | None = None
    """Upstream: a label mapping file."""

    pair_scorer: PairScorer | None = None
    """Upstream: a pair scorer."""

    operating_point: OperatingPoint | None = None
    """Upstream: calibrated thresholds."""


class Admission(Strict):
    max_concurrency: int | None = None
    """Upstream v0.4: requests in flight on the deployment."""

    max_queue: int | None = None
    """Upstream: requests waiting."""

    queue_timeout_ms: int | None = None
    """Upstream: a queued request's limit."""

    on_overflow: str | None = None
    """Upstream: what a full queue does."""


class Presentation(Strict):
    logo: str | None = None
    """Upstream: a logo."""

    monogram: str | None = None
    """Upstream: a monogram."""

    monochrome: bool | None = None
    """Upstream: a monochrome logo."""


class Distribution(Strict):
    type: str | None = None
    """Upstream: open weights, API, ..."""

    source: str | None = None
    """Upstream: where it comes from."""

    license: str | None = None
    """Upstream: its license."""


class Modalities(Strict):
    input: list[str] = Field(default_factory=list, max_length=16)
    """What the model takes (text, image, audio, video): candidate filtering reads it."""

    output: list[str] = Field(default_factory=list, max_length=16)
    """What it produces (metadata)."""


class NormalizationPoint(Strict):
    input: float | None = None
    """Upstream: input."""

    output: float | None = None
    """Upstream: output."""


class Normalization(Strict):
    type: str | None = None
    """Upstream: the normalisation."""

    min: float | None = None
    """Upstream: lower bound."""

    max: float | None = None
    """Upstream: upper bound."""

    k: float | None = None
    """Upstream: logistic slope."""

    x0: float | None = None
    """Upstream: logistic midpoint."""

    points: list[NormalizationPoint] = Field(default_factory=list)
    """Upstream: a piecewise map."""

    values: dict[str, float] = Field(default_factory=dict)
    """Upstream: a categorical map."""


class BenchmarkProfile(Strict):
    id: str | None = None
    """Upstream: profile id."""

    display_name: str | None = None
    """Upstream: its name."""

    description: str | None = None
    """Upstream: free text."""


class BenchmarkMetric(Strict):
    id: str | None = None
    """Upstream: metric id."""

    unit: str | None = None
    """Upstream: its unit."""

    direction: str | None = None
    """Upstream: higher or lower is better."""

    range: list[float] | None = Field(default=None, min_length=2, max_length=2)
    """Upstream: its range."""

    normalization: Normalization | None = None
    """Upstream: how it maps to a score."""


class Benchmark(Strict):
    id: str | None = None
    """Upstream: benchmark id."""

    display_name: str | None = None
    """Upstream: its name."""

    domain: str | None = None
    """Upstream: its domain."""

    tags: list[str] = Field(default_factory=list)
    """Upstream: tags."""

    source: str | None = None
    """Upstream: where it comes from."""

    default_profile: str | None = None
    """Upstream: the default profile."""

    profiles: list[BenchmarkProfile] = Field(default_factory=list)
    """Upstream: its profiles."""

    metrics: list[BenchmarkMetric] = Field(default_factory=list)
    """Upstream: its metrics."""


class MissingPolicy(Strict):
    policy: str | None = None
    """Upstream: what a missing component does."""

    minimum: float | None = None
    """Upstream: least coverage."""


class IndexComponent(Strict):
    benchmark: str | None = None
    """Upstream: the benchmark."""

    metric: str | None = None
    """Upstream: its metric."""

    benchmark_profile: str | None = None
    """Upstream: one profile."""

    benchmark_profiles: list[str] = Field(default_factory=list)
    """Upstream: several profiles."""

    index: str | None = None
    """Upstream: another index."""

    weight: float | None = None
    """Upstream: its weight."""

    normalization: Normalization | None = None
    """Upstream: how it maps to a score."""


class QualityIndex(Strict):
    id: str | None = None
    """Upstream: index id (multi_factor's quality.index names one)."""

    display_name: str | None = None
    """Upstream: its name."""

    description: str | None = None
    """Upstream: free text."""

    methodology: str | None = None
    """Upstream: how it is built."""

    aggregation: str | None = None
    """Upstream: how components combine."""

    scale: list[float] | None = Field(default=None, min_length=2, max_length=2)
    """Upstream: its scale."""

    missing: MissingPolicy | None = None
    """Upstream: missing components."""

    domains: dict[str, float] = Field(default_factory=dict)
    """Upstream: domain weights."""

    components: list[IndexComponent] = Field(default_factory=list)
    """Upstream: its components."""


class EvaluationRecord(Strict):
    model: str | None = None
    """The model measured."""

    benchmark: str | None = None
    """The benchmark (``vllm-sr/operator-rating@1.0.0``: the legacy quality score)."""

    benchmark_profile: str | None = None
    """Upstream: the profile."""

    reasoning_effort: str | None = None
    """Upstream: the effort measured at."""

    metrics: dict[str, float] = Field(default_factory=dict)
    """Metric values (operator-rating: ``score``)."""

    source: str | None = None
    """Upstream: where the number comes from."""

    measured_at: str | None = None
    """Upstream: when."""

    metadata: dict[str, object] = Field(default_factory=dict)
    """Upstream: free metadata."""


class Evaluation(Strict):
    benchmarks: list[Benchmark] = Field(default_factory=list)
    """Upstream: benchmark definitions (metadata)."""

    indices: list[QualityIndex] = Field(default_factory=list)
    """Upstream: quality indices (metadata)."""

    records: list[EvaluationRecord] = Field(default_factory=list)
    """Measured results; operator-rating records give cards their quality."""

    def operator_ratings(self) -> dict[str, float]:
        """model -> its operator-rating score (the last record wins)."""
        out: dict[str, float] = {}
        for rec in self.records:
            score = rec.metrics.get("score")
            if rec.benchmark == OPERATOR_RATING and rec.model and score is not None:
                out[rec.model] = float(score)
        return out
