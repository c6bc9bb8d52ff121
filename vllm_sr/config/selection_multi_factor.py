"""``multi_factor``'s settings (upstream's ``pkg/selection/multi_factor.go``) and the rules on
its raw ``algorithm.multi_factor`` block (the load-time checks of
``pkg/config/validator_decision.go``), as typed models and as rules that name the field, the
value and what is accepted.

Upstream's rules, kept here: the block is required when the type names it (checked by
:func:`vllm_sr.config.routing_selection.selector_block_problems`);
``weights.{quality,latency,cost,load}`` finite and non-negative (all zero: equal weights),
``latency_percentile`` within 1-100 (0 or absent: 95), ``on_no_candidates`` one of cheapest
(default), first, fail; ``slo.{max_tpot_ms,max_ttft_ms,max_cost_per_1m,max_inflight}`` 0 or
absent for no ceiling (ours: a negative one is refused, upstream reads it as no ceiling).

The v0.4 keys (upstream's ``cli/algorithms.py`` in the vllm-sr 0.4.0 wheel and
``pkg/selection/multi_factor_objective.go``): ``objective.strategy`` weighted (default) or
lexicographic; ``priorities`` only with lexicographic and required by it, each
``{factor: quality|latency|cost|load, tolerance: 0-1}`` with no factor repeated; ``weights``
not with a lexicographic objective; ``quality.{index (non-empty, no surrounding blanks),
on_missing: exclude (default) | disable_quality, min_score (finite; only with exclude),
min_coverage (0-1)}``; ``latency_metric`` ttft or tpot.

v0.4's ``expected_output_tokens`` is refused by name with why (:data:`OUTPUT_FORECAST_REFUSAL`).
Unknown keys are refused with the accepted ones named."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from vllm_sr.config.routing_base import Path, Strict, is_number, problem, refusal
from vllm_sr.config.selection_checks import non_negative_problems, percentile_problems, unknown_keys

if TYPE_CHECKING:
    from vllm_sr.config.problems import Problem
    from vllm_sr.jsontypes import JsonObject

DEFAULT_LATENCY_PERCENTILE = 95
ON_NO_CANDIDATES = ("cheapest", "first", "fail")


class MultiFactorWeights(Strict):
    quality: float = Field(default=0.25, ge=0.0)
    """Weight of the modelCard's quality_score (higher is better)."""

    latency: float = Field(default=0.25, ge=0.0)
    """Weight of the observed TPOT (else TTFT) percentile (lower is better)."""

    cost: float = Field(default=0.25, ge=0.0)
    """Weight of the prompt price per 1M tokens (lower is better)."""

    load: float = Field(default=0.25, ge=0.0)
    """Weight of the requests in flight to the model (lower is better)."""

    def normalised(self) -> MultiFactorWeights:
        """Summing to 1 (all zero: equal weights), as upstream's selector does."""
        total = self.quality + self.latency + self.cost + self.load
        if total <= 0:
            return MultiFactorWeights()
        return MultiFactorWeights(
            quality=self.quality / total,
            latency=self.latency / total,
            cost=self.cost / total,
            load=self.load / total,
        )


class MultiFactorSLO(Strict):
    max_tpot_ms: float = Field(default=0.0, ge=0.0)
    """Drop a model whose TPOT percentile is above this (0: no ceiling)."""

    max_ttft_ms: float = Field(default=0.0, ge=0.0)
    """Drop a model whose TTFT percentile is above this (0: no ceiling)."""

    max_cost_per_1m: float = Field(default=0.0, ge=0.0)
    """Drop a model whose prompt price per 1M tokens is above this (0: no ceiling)."""

    max_inflight: int = Field(default=0, ge=0)
    """Drop a model with more requests in flight than this (0: no ceiling)."""


FACTORS = ("quality", "latency", "cost", "load")
OBJECTIVES = ("weighted", "lexicographic")
ON_MISSING_QUALITY = ("exclude", "disable_quality")
LATENCY_METRICS = ("ttft", "tpot")


class MultiFactorPriority(Strict):
    factor: Literal["quality", "latency", "cost", "load"]
    """The factor compared at this stage (quality higher is better, the others lower)."""

    tolerance: float = Field(default=0.0, ge=0.0, le=1.0)
    """Keep every candidate within this fraction of the stage's best value (0: only the best)."""


class MultiFactorObjective(Strict):
    strategy: Literal["weighted", "lexicographic"] = "weighted"
    """weighted: the weights' sum; lexicographic: the priorities in order."""

    priorities: list[MultiFactorPriority] = Field(default_factory=list)
    """The ordered factors of a lexicographic objective (each factor at most once)."""

    @property
    def lexicographic(self) -> bool:
        return self.strategy == "lexicographic"

    @model_validator(mode="after")
    def _priority_rules(self) -> MultiFactorObjective:
        if self.strategy == "weighted" and self.priorities:
            raise ValueError("priorities require strategy lexicographic")
        if self.lexicographic and not self.priorities:
            raise ValueError("a lexicographic objective requires priorities")
        factors = [p.factor for p in self.priorities]
        if len(factors) != len(set(factors)):
            raise ValueError(f"priorities repeat a factor: {factors}")
        return self


class QualityEvidence(Strict):
    index: str = Field(min_length=1)
    """The upstream catalog quality index the figure stands for (for example
    ``vllm-sr/general@1.0.0``); vllm-sr reads the modelCard's quality figure and records the
    index in the selection's reason (docs/router.md "Model selection")."""

    on_missing: Literal["exclude", "disable_quality"] = "exclude"
    """A candidate without a quality figure: dropped before scoring (exclude), or the quality
    factor left out of this selection (disable_quality)."""

    min_score: float | None = None
    """Drop a candidate whose quality figure is below this (only with on_missing exclude)."""

    min_coverage: float | None = Field(default=None, ge=0.0, le=1.0)
    """Upstream: the least share of the index's components measured. A modelCard's figure is
    one complete measurement (coverage 1.0), so it never drops a candidate here."""

    @model_validator(mode="after")
    def _evidence_rules(self) -> QualityEvidence:
        if self.index != self.index.strip():
            raise ValueError(f"index {self.index!r} has surrounding blanks")
        if self.min_score is not None and not math.isfinite(self.min_score):
            raise ValueError(f"min_score {self.min_score!r} is not finite")
        if self.min_score is not None and self.on_missing == "disable_quality":
            raise ValueError("min_score requires on_missing exclude")
        return self


class MultiFactorSettings(Strict):
    weights: MultiFactorWeights = Field(default_factory=MultiFactorWeights)
    """The factors' weights (normalised to sum to 1)."""

    objective: MultiFactorObjective = Field(default_factory=MultiFactorObjective)
    """How the factors are combined: weighted (default) or lexicographic priorities."""

    quality: QualityEvidence | None = None
    """The quality evidence required of a candidate (absent: a candidate without a quality
    figure is scored without it, as at 3d48f8c9)."""

    latency_metric: Literal["ttft", "tpot"] | None = None
    """The latency factor's observation: TTFT or TPOT (absent: TPOT, else TTFT)."""

    slo: MultiFactorSLO = Field(default_factory=MultiFactorSLO)
    """Hard ceilings applied before scoring."""

    latency_percentile: int = Field(default=0, ge=0, le=100)
    """The latency percentile read (1-100; 0: 95)."""

    on_no_candidates: Literal["cheapest", "first", "fail"] = "cheapest"
    """When the SLO drops every model: the cheapest by prompt price, the first modelRef, or
    fail (the chat then goes to the first modelRef, as upstream does on a selector error)."""

    @property
    def percentile(self) -> int:
        return self.latency_percentile or DEFAULT_LATENCY_PERCENTILE

    @model_validator(mode="after")
    def _objective_rules(self) -> MultiFactorSettings:
        if self.objective.lexicographic and "weights" in self.model_fields_set:
            raise ValueError("weights cannot be combined with a lexicographic objective")
        return self


OUTPUT_FORECAST_REFUSAL = (
    "upstream v0.4's forecast of a request's output tokens: its cost factor is the request's "
    "estimated price (input tokens x prompt price + this forecast x completion price); "
    "vllm-sr's cost factor is the prompt price per 1M tokens (as at 3d48f8c9), which needs "
    "no forecast"
)


def multi_factor_problems(base: Path, block: JsonObject) -> list[Problem]:
    """The problems of an ``algorithm.multi_factor`` mapping at ``base``: upstream's checks
    (its v0.4 keys' included) and the refusal of ``expected_output_tokens``."""
    accepted = tuple(MultiFactorSettings.model_fields)
    problems = unknown_keys(
        base, {k: v for k, v in block.items() if k != "expected_output_tokens"}, accepted
    )
    if "expected_output_tokens" in block:
        value = block["expected_output_tokens"]
        problems.append(
            refusal(
                (*base, "expected_output_tokens"),
                f"expected_output_tokens {value!r} ({OUTPUT_FORECAST_REFUSAL})",
                ", ".join(accepted),
            )
        )
    weights = block.get("weights")
    if weights is not None and not isinstance(weights, dict):
        problems.append(problem((*base, "weights"), f"{weights!r}; accepted: a mapping"))
    elif isinstance(weights, dict):
        problems += unknown_keys(
            (*base, "weights"), weights, tuple(MultiFactorWeights.model_fields)
        )
        for key in MultiFactorWeights.model_fields:
            problems += non_negative_problems(
                (*base, "weights", key), weights.get(key), "a weight; all zero: equal weights"
            )
    slo = block.get("slo")
    if slo is not None and not isinstance(slo, dict):
        problems.append(problem((*base, "slo"), f"{slo!r}; accepted: a mapping"))
    elif isinstance(slo, dict):
        problems += unknown_keys((*base, "slo"), slo, tuple(MultiFactorSLO.model_fields))
        for key in MultiFactorSLO.model_fields:
            problems += non_negative_problems(
                (*base, "slo", key), slo.get(key), "0: no ceiling", integer=key == "max_inflight"
            )
    problems += percentile_problems(
        (*base, "latency_percentile"), block.get("latency_percentile"), "0 or absent: 95"
    )
    problems += _objective_problems((*base, "objective"), block.get("objective"))
    problems += _quality_problems((*base, "quality"), block.get("quality"))
    metric = block.get("latency_metric")
    if metric is not None and metric not in LATENCY_METRICS:
        problems.append(
            problem(
                (*base, "latency_metric"),
                f"{metric!r}; accepted: one of {', '.join(LATENCY_METRICS)} (absent: TPOT, "
                "else TTFT)",
            )
        )
    objective = block.get("objective")
    strategy = objective.get("strategy") if isinstance(objective, dict) else None
    if strategy == "lexicographic" and "weights" in block:
        problems.append(
            problem(
                (*base, "weights"),
                f"{block['weights']!r} with objective.strategy lexicographic; accepted: "
                "weights only with the weighted objective (as upstream)",
            )
        )
    mode = block.get("on_no_candidates")
    if mode is not None and mode != "" and mode not in ON_NO_CANDIDATES:
        problems.append(
            problem(
                (*base, "on_no_candidates"),
                f"{mode!r}; accepted: one of {', '.join(ON_NO_CANDIDATES)} (default cheapest)",
            )
        )
    return problems


def _objective_problems(path: Path, objective: object) -> list[Problem]:
    if objective is None:
        return []
    if not isinstance(objective, dict):
        return [problem(path, f"{objective!r}; accepted: a mapping (strategy, priorities)")]
    problems = unknown_keys(path, objective, tuple(MultiFactorObjective.model_fields))
    strategy = objective.get("strategy", "weighted")
    if strategy not in OBJECTIVES:
        problems.append(
            problem(
                (*path, "strategy"),
                f"{strategy!r}; accepted: one of {', '.join(OBJECTIVES)} (default weighted)",
            )
        )
    priorities = objective.get("priorities")
    if priorities is not None and not isinstance(priorities, list):
        return [
            *problems,
            problem((*path, "priorities"), f"{priorities!r}; accepted: a list of factors"),
        ]
    rows = priorities or []
    if strategy == "weighted" and rows:
        problems.append(
            problem(
                (*path, "priorities"),
                f"{len(rows)} priorities with strategy weighted; accepted: priorities only "
                "with strategy lexicographic (as upstream)",
            )
        )
    if strategy == "lexicographic" and not rows:
        problems.append(
            problem(
                (*path, "priorities"),
                f"{priorities!r} with strategy lexicographic; accepted: at least one "
                "{factor, tolerance} (as upstream)",
            )
        )
    seen: set[object] = set()
    for i, row in enumerate(rows):
        at = (*path, "priorities", i)
        if not isinstance(row, dict):
            problems.append(problem(at, f"{row!r}; accepted: a mapping (factor, tolerance)"))
            continue
        problems += unknown_keys(at, row, tuple(MultiFactorPriority.model_fields))
        factor = row.get("factor")
        if factor not in FACTORS:
            problems.append(
                problem((*at, "factor"), f"{factor!r}; accepted: one of {', '.join(FACTORS)}")
            )
        elif factor in seen:
            problems.append(
                problem(
                    (*at, "factor"),
                    f"{factor!r} repeats an earlier priority; accepted: each factor at most once",
                )
            )
        seen.add(factor)
        tolerance = row.get("tolerance")
        if tolerance is not None and not (is_number(tolerance) and 0 <= tolerance <= 1):
            problems.append(
                problem(
                    (*at, "tolerance"),
                    f"{tolerance!r}; accepted: a number from 0 to 1 (a fraction of the best "
                    "value; absent: 0)",
                )
            )
    return problems


def _quality_problems(path: Path, quality: object) -> list[Problem]:
    if quality is None:
        return []
    if not isinstance(quality, dict):
        return [problem(path, f"{quality!r}; accepted: a mapping (index, on_missing, ...)")]
    problems = unknown_keys(path, quality, tuple(QualityEvidence.model_fields))
    index = quality.get("index")
    if not isinstance(index, str) or not index.strip() or index != index.strip():
        problems.append(
            problem(
                (*path, "index"),
                f"{index!r}; accepted: a quality index id such as 'vllm-sr/general@1.0.0' "
                "(non-empty, no surrounding blanks)",
            )
        )
    on_missing = quality.get("on_missing", "exclude")
    if on_missing not in ON_MISSING_QUALITY:
        problems.append(
            problem(
                (*path, "on_missing"),
                f"{on_missing!r}; accepted: one of {', '.join(ON_MISSING_QUALITY)} "
                "(default exclude)",
            )
        )
    min_score = quality.get("min_score")
    if min_score is not None:
        if not is_number(min_score):
            problems.append(
                problem((*path, "min_score"), f"{min_score!r}; accepted: a finite number")
            )
        elif on_missing == "disable_quality":
            problems.append(
                problem(
                    (*path, "min_score"),
                    f"{min_score!r} with on_missing disable_quality; accepted: min_score only "
                    "with on_missing exclude (as upstream)",
                )
            )
    coverage = quality.get("min_coverage")
    if coverage is not None and not (is_number(coverage) and 0 <= coverage <= 1):
        problems.append(
            problem((*path, "min_coverage"), f"{coverage!r}; accepted: a number from 0 to 1")
        )
    return problems
