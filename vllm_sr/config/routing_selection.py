"""The settings of the selectors vllm-sr runs besides ``static``: ``latency_aware`` and
``multi_factor`` (upstream's ``pkg/selection/latency_aware.go``, ``multi_factor.go``; the
load-time checks of ``pkg/config/validator_decision.go``), as typed models and as rules on the
raw ``algorithm.<type>`` block that name the field, the value and what is accepted.

Upstream's rules, kept here:

- both blocks are required when the type names them;
- ``latency_aware``: at least one of ``tpot_percentile`` / ``ttft_percentile`` set (> 0), each
  one set within 1-100 (ours: a negative one is refused too; upstream fails it at request time
  and falls back to the first modelRef);
- ``multi_factor``: ``weights.{quality,latency,cost,load}`` finite and non-negative (all zero:
  equal weights), ``latency_percentile`` within 1-100 (0 or absent: 95), ``on_no_candidates``
  one of cheapest (default), first, fail; ``slo.{max_tpot_ms,max_ttft_ms,max_cost_per_1m,
  max_inflight}`` 0 or absent for no ceiling (ours: a negative one is refused, upstream reads it
  as no ceiling).

Unknown keys are refused with the accepted ones named (upstream's later ``objective``,
``quality`` and ``latency_metric`` keys are not in the 3d48f8c9 surface vllm-sr follows)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal, TypeGuard

from pydantic import Field

from vllm_sr.config.routing_base import Path, Strict, as_dict, problem
from vllm_sr.jsontypes import JsonObject

if TYPE_CHECKING:
    from vllm_sr.config.problems import Problem

LATENCY_AWARE = "latency_aware"
MULTI_FACTOR = "multi_factor"
RUN_SELECTORS = (LATENCY_AWARE, MULTI_FACTOR)
DEFAULT_LATENCY_PERCENTILE = 95
ON_NO_CANDIDATES = ("cheapest", "first", "fail")


class LatencyAwareSettings(Strict):
    tpot_percentile: int = Field(default=0, ge=0, le=100)
    """The TPOT percentile compared (1-100; 0: TPOT not used)."""

    ttft_percentile: int = Field(default=0, ge=0, le=100)
    """The TTFT percentile compared (1-100; 0: TTFT not used)."""

    description: str | None = Field(default=None, max_length=4000)
    """Free text for people (upstream's reference config writes one)."""


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


class MultiFactorSettings(Strict):
    weights: MultiFactorWeights = Field(default_factory=MultiFactorWeights)
    """The factors' weights (normalised to sum to 1)."""

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


def parse_settings(kind: str, block: object) -> LatencyAwareSettings | MultiFactorSettings:
    """The typed settings of a checked block (``selector_block_problems`` found none)."""
    if kind == LATENCY_AWARE:
        return LatencyAwareSettings.model_validate(as_dict(block))
    if kind == MULTI_FACTOR:
        raw = dict(as_dict(block))
        if raw.get("on_no_candidates") == "":  # upstream: empty means the default
            del raw["on_no_candidates"]
        return MultiFactorSettings.model_validate(raw)
    raise ValueError(f"{kind!r} is not a selector vllm-sr runs; accepted: {RUN_SELECTORS}")


# -- the raw rules ---------------------------------------------------------------------------


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _unknown(path: Path, block: JsonObject, accepted: tuple[str, ...]) -> list[Problem]:
    return [
        problem(
            (*path, key),
            f"unknown key {key!r} (value {block[key]!r}); accepted: {', '.join(accepted)}",
        )
        for key in block
        if key not in accepted
    ]


def _percentile(path: Path, value: object, allow_zero: str) -> list[Problem]:
    if value is None or (_is_int(value) and 0 <= value <= 100):
        return []
    return [
        problem(path, f"{value!r}; accepted: an integer from 1 to 100 ({allow_zero})"),
    ]


def _non_negative(path: Path, value: object, what: str, integer: bool = False) -> list[Problem]:
    ok = _is_int(value) if integer else _is_number(value)
    if value is None or (ok and isinstance(value, (int, float)) and value >= 0):
        return []
    kind = "an integer" if integer else "a finite number"
    return [problem(path, f"{value!r}; accepted: {kind} >= 0 ({what})")]


def selector_block_problems(path: Path, kind: str, algo: JsonObject) -> list[Problem]:
    """Upstream's checks of a latency_aware / multi_factor decision's block; ``path`` is the
    decision's ``algorithm``."""
    block = algo.get(kind)
    if block is None:
        return [
            problem(
                (*path, kind),
                f"algorithm.type {kind} without an algorithm.{kind} block; accepted: "
                + (
                    "a block with tpot_percentile and/or ttft_percentile (1-100)"
                    if kind == LATENCY_AWARE
                    else "a block (weights, slo, latency_percentile, on_no_candidates)"
                )
                + " (as upstream)",
            )
        ]
    base = (*path, kind)
    if not isinstance(block, dict):
        return [problem(base, f"{block!r}; accepted: a mapping")]
    if kind == LATENCY_AWARE:
        return _latency_aware_problems(base, block)
    return _multi_factor_problems(base, block)


def _latency_aware_problems(base: Path, block: JsonObject) -> list[Problem]:
    problems = _unknown(base, block, tuple(LatencyAwareSettings.model_fields))
    for key in ("tpot_percentile", "ttft_percentile"):
        problems += _percentile((*base, key), block.get(key), "0 or absent: not used")
    tpot, ttft = block.get("tpot_percentile"), block.get("ttft_percentile")
    if not problems and not any(isinstance(v, int) and v > 0 for v in (tpot, ttft)):
        problems.append(
            problem(
                base,
                f"tpot_percentile {tpot!r} and ttft_percentile {ttft!r}; accepted: at least "
                "one of them from 1 to 100 (upstream recommends both)",
            )
        )
    return problems


def _multi_factor_problems(base: Path, block: JsonObject) -> list[Problem]:
    problems = _unknown(base, block, tuple(MultiFactorSettings.model_fields))
    weights = block.get("weights")
    if weights is not None and not isinstance(weights, dict):
        problems.append(problem((*base, "weights"), f"{weights!r}; accepted: a mapping"))
    elif isinstance(weights, dict):
        problems += _unknown((*base, "weights"), weights, tuple(MultiFactorWeights.model_fields))
        for key in MultiFactorWeights.model_fields:
            problems += _non_negative(
                (*base, "weights", key), weights.get(key), "a weight; all zero: equal weights"
            )
    slo = block.get("slo")
    if slo is not None and not isinstance(slo, dict):
        problems.append(problem((*base, "slo"), f"{slo!r}; accepted: a mapping"))
    elif isinstance(slo, dict):
        problems += _unknown((*base, "slo"), slo, tuple(MultiFactorSLO.model_fields))
        for key in MultiFactorSLO.model_fields:
            problems += _non_negative(
                (*base, "slo", key), slo.get(key), "0: no ceiling", integer=key == "max_inflight"
            )
    problems += _percentile(
        (*base, "latency_percentile"), block.get("latency_percentile"), "0 or absent: 95"
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
