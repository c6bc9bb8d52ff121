"""pydantic models of ``routing.projections`` (upstream ``C/projection_config.go``):
partitions, weighted scores and their bands. vllm-sr does not evaluate projections; they are
typed so that an upstream file parses (a typo is still an unknown key) and ``routing_support``
refuses each non-empty list by name."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vllm_sr.config.routing_base import Strict


class ProjectionPartition(Strict):
    name: str = Field(min_length=1, max_length=128)
    """The partition's name."""

    semantics: Literal["exclusive", "softmax_exclusive"]
    """How members compete."""

    temperature: float = Field(default=0.0, ge=0.0)
    """softmax_exclusive: the temperature (> 0)."""

    members: list[str] = Field(min_length=1, max_length=256)
    """Domain or embedding names."""

    default: str | None = Field(default=None, max_length=128)
    """The member kept when none matches."""


class ProjectionScoreInput(Strict):
    type: str = Field(min_length=1, max_length=32)
    """A signal type, projection or kb_metric."""

    name: str | None = Field(default=None, max_length=256)
    """The signal's name."""

    kb: str | None = Field(default=None, max_length=128)
    """kb_metric: the KB."""

    metric: str | None = Field(default=None, max_length=128)
    """kb_metric: the metric."""

    weight: float
    """The input's weight."""

    value_source: Literal["score", "binary", "confidence", "raw"] | None = None
    """Which number of the signal is read."""

    match: float = 0.0
    """binary: the value when matched (0: 1)."""

    miss: float = 0.0
    """binary: the value when not matched."""


class ProjectionScore(Strict):
    name: str = Field(min_length=1, max_length=128)
    """The score's name."""

    method: Literal["weighted_sum"]
    """How inputs combine."""

    inputs: list[ProjectionScoreInput] = Field(min_length=1, max_length=256)
    """The inputs."""


class ProjectionCalibration(Strict):
    method: Literal["sigmoid_distance"]
    """How confidence is computed."""

    slope: float = 0.0
    """The sigmoid's slope (0: 12)."""


class ProjectionOutput(Strict):
    name: str = Field(min_length=1, max_length=128)
    """The projection signal's name."""

    gt: float | None = None
    """Lower bound (exclusive)."""

    gte: float | None = None
    """Lower bound."""

    lt: float | None = None
    """Upper bound (exclusive)."""

    lte: float | None = None
    """Upper bound."""


class ProjectionMapping(Strict):
    name: str = Field(min_length=1, max_length=128)
    """The mapping's name."""

    source: str = Field(min_length=1, max_length=128)
    """A score name."""

    method: Literal["threshold_bands", "multi_emit"]
    """First matching band, or all."""

    calibration: ProjectionCalibration | None = None
    """Confidence calibration."""

    outputs: list[ProjectionOutput] = Field(min_length=1, max_length=256)
    """Bands, each a projection signal."""


class Projections(Strict):
    partitions: list[ProjectionPartition] = Field(default_factory=list, max_length=256)
    """Mutually exclusive groups of domains or embeddings."""

    scores: list[ProjectionScore] = Field(default_factory=list, max_length=256)
    """Weighted sums of signals."""

    mappings: list[ProjectionMapping] = Field(default_factory=list, max_length=256)
    """Score bands that become projection signals."""
