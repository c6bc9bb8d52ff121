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
    first modelRef, or fails (:class:`NoCandidates`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    from vllm_sr.config.routing import ModelRef
    from vllm_sr.config.routing_selection import LatencyAwareSettings, MultiFactorSettings


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


def multi_factor(
    refs: Sequence[ModelRef], settings: MultiFactorSettings, facts: Facts
) -> Selection:
    kept: list[tuple[ModelRef, None]] = []
    dropped: list[tuple[ModelRef, str]] = []
    for ref in refs:
        breach = _slo_breach(ref, settings, facts)
        if breach is None:
            kept.append((ref, None))
        else:
            dropped.append((ref, breach))
    if not kept:
        return _no_candidates(refs, settings, facts, [f"{r.model}:{b}" for r, b in dropped])
    p = settings.percentile
    rows = []
    for ref, _ in kept:
        latency = facts.tpot(ref.model, p)
        if latency is None:
            latency = facts.ttft(ref.model, p)
        rows.append(
            _Row(
                ref,
                facts.quality(ref.model),
                latency,
                facts.prompt_price(ref.model),
                float(facts.inflight(ref.model)),
            )
        )
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
    reason = (
        f"multi_factor: weights q={w.quality:.2f} l={w.latency:.2f} c={w.cost:.2f} "
        f"L={w.load:.2f}, latency p{p}, kept={len(kept)}, dropped={len(dropped)}"
    )
    if dropped:
        reason += " (" + ", ".join(f"{r.model}:{b}" for r, b in dropped) + ")"
    return Selection(best[1], "multi_factor", reason, scores)


def _no_candidates(
    refs: Sequence[ModelRef], settings: MultiFactorSettings, facts: Facts, why: list[str]
) -> Selection:
    cause = "the SLO dropped every candidate (" + ", ".join(why) + ")"
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
