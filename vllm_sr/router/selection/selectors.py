"""The ``latency_aware`` and ``multi_factor`` selectors, pure on what they are given: the
decision's candidate modelRefs, their settings and a :class:`Facts` reader (observed
latencies, in-flight counts, prices, quality scores). Upstream's rules
(``pkg/selection/latency_aware.go``, ``multi_factor.go`` at 3d48f8c9):

latency_aware
    Each configured percentile (TPOT, TTFT) of each candidate, divided by the candidates'
    smallest, averaged over the configured metrics; the lowest wins (the first on ties). A
    candidate missing a configured metric is left out; none left: the first modelRef.

multi_factor
    The SLO filter drops a candidate whose TPOT / TTFT percentile (``latency_percentile``)
    is above ``max_tpot_ms`` / ``max_ttft_ms``, whose prompt price per 1M is above
    ``max_cost_per_1m`` or with more than ``max_inflight`` requests in flight (a ceiling of 0
    is none; a model with no data for a ceiling is kept). Then each survivor scores
    ``sum(w * f) / sum(w)`` over the factors it has data for and whose weight is above 0:
    quality (modelCards quality_score, min-max normalised, higher better), latency (TPOT
    percentile, else TTFT), cost (prompt price) and load (in flight), the last three min-max
    normalised and inverted; equal values across candidates score 0.5. The highest score
    wins (the first on ties). Nobody left after the SLO filter: ``on_no_candidates`` picks
    the cheapest by prompt price (a model without a price never; none priced: the first), the
    first modelRef, or fails (:class:`NoCandidates`).

multi_factor's v0.4 keys (``pkg/selection/multi_factor_objective.go``)
    ``latency_metric`` names the latency observation (``tpot`` or ``ttft``; absent: TPOT,
    else TTFT), for the SLO-free latency factor. ``quality`` requires quality evidence: after
    the SLO filter, ``on_missing: exclude`` drops a candidate without a quality figure or
    below ``min_score``; ``disable_quality`` leaves the quality factor out of the selection
    when any candidate lacks one. The figure is :meth:`Facts.quality` (the modelCard's); the
    ``index`` it stands for is named in the reason. ``objective.strategy: lexicographic``
    compares the ``priorities`` in order: at each stage the candidates with a value for the
    factor are compared, those within ``tolerance`` x |best| of the best (higher quality,
    lower latency / cost / load) stay, the rest (and those without a value, when another
    has one) leave with score ``stage / (len(priorities) + 1)``; a stage where no candidate
    has a value is skipped; one left ends it. The survivors score 1 and the first of them
    wins."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    from vllm_sr.config.routing import ModelRef
    from vllm_sr.config.routing_selection import LatencyAwareSettings
    from vllm_sr.config.selection_multi_factor import MultiFactorSettings


class Facts(Protocol):
    """What the selectors read about a model."""

    def tpot(self, model: str, percentile: int) -> float | None:
        """Seconds per output token at ``percentile``, None without observations."""
        ...

    def ttft(self, model: str, percentile: int) -> float | None:
        """Seconds to the first token at ``percentile``, None without observations."""
        ...

    def inflight(self, model: str) -> int:
        """Chats in flight to the model's backends."""
        ...

    def prompt_price(self, model: str) -> float | None:
        """Prompt price per 1M tokens, None when the model has no pricing."""
        ...

    def quality(self, model: str) -> float | None:
        """The modelCard's quality_score, None when it has none."""
        ...


@dataclass(frozen=True)
class Selection:
    ref: ModelRef  # the chosen modelRef
    method: str
    reason: str
    scores: dict[str, float] = field(default_factory=dict)


class NoCandidates(Exception):
    """multi_factor with ``on_no_candidates: fail`` dropped every candidate."""


def latency_aware(
    refs: Sequence[ModelRef], settings: LatencyAwareSettings, facts: Facts
) -> Selection:
    tpot_p, ttft_p = settings.tpot_percentile, settings.ttft_percentile
    rows: list[tuple[ModelRef, float | None, float | None]] = []
    for ref in refs:
        tpot = facts.tpot(ref.model, tpot_p) if tpot_p else None
        ttft = facts.ttft(ref.model, ttft_p) if ttft_p else None
        if (tpot_p and tpot is None) or (ttft_p and ttft is None):
            continue
        rows.append((ref, tpot, ttft))
    if not rows:
        return Selection(refs[0], "latency_aware", "no latency observations: the first modelRef")
    min_tpot = min((r[1] for r in rows if r[1] is not None), default=0.0)
    min_ttft = min((r[2] for r in rows if r[2] is not None), default=0.0)
    scores: dict[str, float] = {}
    best: tuple[float, ModelRef] | None = None
    for ref, tpot, ttft in rows:
        parts = []
        if tpot is not None:
            parts.append(tpot / (min_tpot if min_tpot > 0 else 1.0))
        if ttft is not None:
            parts.append(ttft / (min_ttft if min_ttft > 0 else 1.0))
        score = sum(parts) / len(parts)
        scores.setdefault(ref.model, score)
        if best is None or score < best[0]:
            best = (score, ref)
    assert best is not None
    used = " + ".join(f"{name} p{p}" for name, p in (("TPOT", tpot_p), ("TTFT", ttft_p)) if p)
    return Selection(best[1], "latency_aware", f"latency_aware: lowest {used}", scores)


@dataclass
class _Row:
    ref: ModelRef
    quality: float | None
    latency: float | None
    cost: float | None
    load: float


def _slo_breach(ref: ModelRef, s: MultiFactorSettings, facts: Facts) -> str | None:
    slo, p, model = s.slo, s.percentile, ref.model
    if slo.max_tpot_ms > 0:
        tpot = facts.tpot(model, p)
        if tpot is not None and tpot * 1000.0 > slo.max_tpot_ms:
            return f"tpot_p{p}={tpot * 1000.0:.1f}ms>{slo.max_tpot_ms:g}ms"
    if slo.max_ttft_ms > 0:
        ttft = facts.ttft(model, p)
        if ttft is not None and ttft * 1000.0 > slo.max_ttft_ms:
            return f"ttft_p{p}={ttft * 1000.0:.1f}ms>{slo.max_ttft_ms:g}ms"
    if slo.max_cost_per_1m > 0:
        price = facts.prompt_price(model)
        if price is not None and price > slo.max_cost_per_1m:
            return f"cost={price:g}>{slo.max_cost_per_1m:g} per 1M"
    if slo.max_inflight > 0:
        inflight = facts.inflight(model)
        if inflight > slo.max_inflight:
            return f"inflight={inflight}>{slo.max_inflight}"
    return None


def _spread(values: list[float | None]) -> tuple[float, float] | None:
    present = [v for v in values if v is not None]
    return (min(present), max(present)) if present else None


def _normal(value: float, span: tuple[float, float], inverted: bool) -> float:
    low, high = span
    if high - low <= 0:
        return 0.5
    x = (value - low) / (high - low)
    return 1.0 - x if inverted else x


def _latency(model: str, settings: MultiFactorSettings, facts: Facts) -> float | None:
    p = settings.percentile
    if settings.latency_metric == "ttft":
        return facts.ttft(model, p)
    latency = facts.tpot(model, p)
    if latency is None and settings.latency_metric is None:
        latency = facts.ttft(model, p)
    return latency


def _quality_evidence(
    rows: list[_Row], settings: MultiFactorSettings
) -> tuple[list[_Row], list[str]]:
    """The rows kept by ``quality`` and why each other one left; under disable_quality with a
    figure missing, every row loses its quality figure instead."""
    evidence = settings.quality
    if evidence is None:
        return rows, []
    if evidence.on_missing == "disable_quality":
        if any(r.quality is None for r in rows):
            for r in rows:
                r.quality = None
        return rows, []
    kept: list[_Row] = []
    lacking: list[str] = []
    for r in rows:
        if r.quality is None:
            lacking.append(f"{r.ref.model}:no quality for {evidence.index}")
        elif evidence.min_score is not None and r.quality < evidence.min_score:
            lacking.append(f"{r.ref.model}:quality={r.quality:g}<{evidence.min_score:g}")
        else:
            kept.append(r)
    return kept, lacking


def multi_factor(
    refs: Sequence[ModelRef], settings: MultiFactorSettings, facts: Facts
) -> Selection:
    kept: list[ModelRef] = []
    dropped: list[str] = []
    for ref in refs:
        breach = _slo_breach(ref, settings, facts)
        if breach is None:
            kept.append(ref)
        else:
            dropped.append(f"{ref.model}:{breach}")
    if not kept:
        return _no_candidates(refs, settings, facts, dropped, "the SLO dropped every candidate")
    rows = [
        _Row(
            ref,
            facts.quality(ref.model),
            _latency(ref.model, settings, facts),
            facts.prompt_price(ref.model),
            float(facts.inflight(ref.model)),
        )
        for ref in kept
    ]
    rows, lacking = _quality_evidence(rows, settings)
    dropped += lacking
    if not rows:
        cause = "the SLO and the quality evidence dropped every candidate"
        return _no_candidates(refs, settings, facts, dropped, cause)
    if settings.objective.lexicographic:
        best, scores, how = _lexicographic(rows, settings)
    else:
        best, scores, how = _weighted(rows, settings)
    p = settings.percentile
    metric = settings.latency_metric or "tpot|ttft"
    reason = f"multi_factor: {how}, latency {metric} p{p}, kept={len(rows)}, dropped={len(dropped)}"
    if settings.quality is not None:
        reason += f", quality index {settings.quality.index}"
    if dropped:
        reason += " (" + ", ".join(dropped) + ")"
    return Selection(best, "multi_factor", reason, scores)


def _weighted(
    rows: list[_Row], settings: MultiFactorSettings
) -> tuple[ModelRef, dict[str, float], str]:
    w = settings.weights.normalised()
    spans = {
        "quality": _spread([r.quality for r in rows]),
        "latency": _spread([r.latency for r in rows]),
        "cost": _spread([r.cost for r in rows]),
        "load": _spread([r.load for r in rows]),
    }
    scores: dict[str, float] = {}
    best: tuple[float, ModelRef] | None = None
    for row in rows:
        total = weight = 0.0
        for name, value, inverted, factor_w in (
            ("quality", row.quality, False, w.quality),
            ("latency", row.latency, True, w.latency),
            ("cost", row.cost, True, w.cost),
            ("load", row.load, True, w.load),
        ):
            span = spans[name]
            if factor_w <= 0 or value is None or span is None:
                continue
            total += factor_w * _normal(value, span, inverted)
            weight += factor_w
        score = total / weight if weight > 0 else 0.0
        scores.setdefault(row.ref.model, score)
        if best is None or score > best[0]:
            best = (score, row.ref)
    assert best is not None
    how = f"weights q={w.quality:.2f} l={w.latency:.2f} c={w.cost:.2f} L={w.load:.2f}"
    return best[1], scores, how


def _factor(row: _Row, factor: str) -> float | None:
    if factor == "quality":
        return row.quality
    if factor == "latency":
        return row.latency
    if factor == "cost":
        return row.cost
    return row.load


def _lexicographic(
    rows: list[_Row], settings: MultiFactorSettings
) -> tuple[ModelRef, dict[str, float], str]:
    priorities = settings.objective.priorities
    denominator = float(len(priorities) + 1)
    scores: dict[str, float] = {}
    active = list(rows)
    for stage, priority in enumerate(priorities):
        values = {id(r): v for r in active if (v := _factor(r, priority.factor)) is not None}
        if not values:
            continue
        higher = priority.factor == "quality"
        best = max(values.values()) if higher else min(values.values())
        margin = abs(best) * priority.tolerance
        retained = []
        for r in active:
            value = values.get(id(r))
            within = value is not None and (
                value >= best - margin if higher else value <= best + margin
            )
            if within:
                retained.append(r)
            else:
                scores.setdefault(r.ref.model, stage / denominator)
        active = retained
        if len(active) == 1:
            break
    for r in active:
        scores.setdefault(r.ref.model, 1.0)
    how = "lexicographic[" + ",".join(f"{p.factor}±{p.tolerance:g}" for p in priorities) + "]"
    return active[0].ref, scores, how


def _no_candidates(
    refs: Sequence[ModelRef],
    settings: MultiFactorSettings,
    facts: Facts,
    why: list[str],
    cause: str,
) -> Selection:
    cause = f"{cause} (" + ", ".join(why) + ")"
    if settings.on_no_candidates == "fail":
        raise NoCandidates(f"multi_factor: {cause}")
    if settings.on_no_candidates == "first":
        return Selection(refs[0], "multi_factor", f"multi_factor: {cause}: the first modelRef")
    best, best_cost = refs[0], float("inf")
    for ref in refs:
        price = facts.prompt_price(ref.model)
        if price is not None and price < best_cost:
            best, best_cost = ref, price
    return Selection(best, "multi_factor", f"multi_factor: {cause}: the cheapest")
