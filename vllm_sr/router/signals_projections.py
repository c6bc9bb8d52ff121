"""``routing.projections`` after the signals, deterministically (upstream
``pkg/classification/classifier_projection*.go``, ``classifier_signal_group_resolution.go``):

- partitions: among a partition's matched members (all domains or all embeddings) the one
  with the highest raw value stays matched (the first in ``members`` on ties) and the others
  are dropped; none matched -> ``default`` is added with confidence 1.0; the kept member's
  confidence is its raw value (``exclusive``) or its softmax share at ``temperature``
  (``softmax_exclusive``);
- scores: ``weighted_sum`` of inputs (``raw``: the signal's value, 0 when absent;
  ``confidence``: its confidence when matched, 1 when that is <= 0, else 0; ``binary`` or
  omitted: ``match`` (0 -> 1) when matched, else ``miss``; ``kb_metric``: a KB metric value;
  ``projection``: another score, or a projection output's confidence with ``confidence``),
  in dependency order;
- mappings: each output band (gt/gte/lt/lte) of a score becomes a ``projection`` signal,
  the first matching band (``threshold_bands``) or every one (``multi_emit``), confidence
  1/(1 + e^(-slope * d)) with d the distance to the nearest bound (slope 12 unless
  calibrated; no bound: d = 1). Scores and mappings run only when both are configured.

An unknown signal (vllm_sr/router/unknown.py) is not a miss here: a partition with an unknown
member and no matched one leaves its default unknown (not added), and a score reading an unknown
signal (or an unknown projection) leaves its mappings' outputs unknown.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from vllm_sr.router.rules import SignalKey
from vllm_sr.router.signals import SignalResult
from vllm_sr.router.unknown import Unknown

if TYPE_CHECKING:
    from vllm_sr.config.routing import Routing
    from vllm_sr.config.routing_projections import (
        ProjectionMapping,
        ProjectionOutput,
        Projections,
        ProjectionScore,
        ProjectionScoreInput,
    )

DEFAULT_SLOPE = 12.0
Results = dict[SignalKey, SignalResult]


def projection_inputs(routing: Routing, output: str) -> set[SignalKey]:
    """The signal keys a projection output reads (its mapping's score's inputs; other
    projections through their own keys)."""
    proj = routing.projections
    scores = {s.name: s for s in proj.scores}
    out: set[SignalKey] = set()
    for mapping in proj.mappings:
        if not any(o.name == output for o in mapping.outputs):
            continue
        score = scores.get(mapping.source)
        if score is None:
            continue
        for inp in score.inputs:
            kind = inp.type.strip().lower()
            if kind == "kb_metric":
                out.add(("kb_metric", f"{inp.kb}:{inp.metric}"))
            elif kind == "projection":
                out |= {("projection", o.name) for o in _outputs_of(routing, inp.name or "")}
            elif inp.name:
                out.add((kind, inp.name))
    return out


def _outputs_of(routing: Routing, score_or_output: str) -> list[ProjectionOutput]:
    proj = routing.projections
    outs = [o for m in proj.mappings if m.source == score_or_output for o in m.outputs]
    return outs or [o for m in proj.mappings for o in m.outputs if o.name == score_or_output]


def apply_partitions(routing: Routing, results: Results) -> None:
    """Each partition leaves at most one of its members matched (or its default)."""
    for part in routing.projections.partitions:
        keys = [(kind, m) for m in part.members for kind in ("domain", "embedding")]
        present = [k for k in keys if k in results]
        kind = present[0][0] if present else "domain"
        hits = [
            ((kind, m), results[(kind, m)]) for m in part.members if _matched(results, (kind, m))
        ]
        if not hits:
            why = _first_unknown(results, keys)
            if part.default and why is not None:
                results[(kind, part.default)] = SignalResult.unknown_because(why)
            elif part.default:
                results[(kind, part.default)] = SignalResult(True, 1.0, 1.0)
            continue
        raw = [r.value if r.value is not None else r.confidence for _, r in hits]
        best = max(range(len(hits)), key=lambda i: (raw[i], -i))
        for i, (key, res) in enumerate(hits):
            if i != best:
                results[key] = SignalResult(False, res.confidence, res.value)
        key, res = hits[best]
        conf = raw[best]
        if part.semantics == "softmax_exclusive" and part.temperature > 0:
            top = max(raw)
            weights = [math.exp((x - top) / part.temperature) for x in raw]
            conf = weights[best] / sum(weights)
        results[key] = SignalResult(True, conf, res.value)


def apply_projections(routing: Routing, results: Results) -> dict[str, float]:
    """Scores and their bands into ``results`` as ``projection`` signals. -> the scores.
    (A router applies its generation's :class:`ProjectionPlan`, built once.)"""
    return ProjectionPlan(routing).apply(results)


class ProjectionPlan:
    """One generation's projections, worked out once: the scores in dependency order, each
    with the keys it reads and the mappings it feeds. The order only depends on the config
    (which scores are done, not their values): the scores ready in a pass, in config order,
    then the next pass's; a cycle (config rules refuse it) scores the first one left as is."""

    def __init__(self, routing: Routing) -> None:
        proj = routing.projections
        self.steps: list[tuple[ProjectionScore, list[SignalKey], list[ProjectionMapping]]] = []
        if not proj.scores or not proj.mappings:
            return
        done: set[str] = set()
        pending = list(proj.scores)
        while pending:
            ready = [s for s in pending if all(_ready(i, done, proj) for i in s.inputs)]
            if not ready:
                ready = pending[:1]
            for score in ready:
                pending.remove(score)
                done.add(score.name)
                keys = [k for i in score.inputs for k in _keys_read(i, proj)]
                feeds = [m for m in proj.mappings if m.source == score.name]
                self.steps.append((score, keys, feeds))

    def apply(self, results: Results) -> dict[str, float]:
        """Scores and their bands into ``results`` as ``projection`` signals. -> the scores
        (empty when the generation has no scores or no mappings)."""
        scores: dict[str, float] = {}
        for score, keys, feeds in self.steps:
            value = scores[score.name] = sum(
                i.weight * _input(i, results, scores) for i in score.inputs
            )
            why = _first_unknown(results, keys)
            for mapping in feeds:
                if why is None:
                    _emit(mapping, value, results)
                    continue
                for out in mapping.outputs:
                    results[("projection", out.name)] = SignalResult.unknown_because(why)
        return scores


def _keys_read(inp: ProjectionScoreInput, proj: Projections) -> list[SignalKey]:
    """The result keys a score input reads (a projection input: the outputs of the score it
    names, or the output itself)."""
    kind = inp.type.strip().lower()
    if kind == "kb_metric":
        return [("kb_metric", f"{inp.kb}:{inp.metric}")]
    if kind == "projection":
        outs = [o for m in proj.mappings if m.source == inp.name for o in m.outputs]
        names = [o.name for o in outs] or [inp.name or ""]
        return [("projection", n) for n in names]
    return [(kind, inp.name or "")]


def _first_unknown(results: Results, keys: list[SignalKey]) -> Unknown | None:
    for key in keys:
        res = results.get(key)
        if res is not None and res.unknown is not None:
            return res.unknown
    return None


def _ready(inp: ProjectionScoreInput, done: set[str], proj: Projections) -> bool:
    """Whether an input can be read once the scores in ``done`` are."""
    if inp.type.strip().lower() != "projection":
        return True
    names = {s.name for s in proj.scores}
    if inp.name in names:
        return inp.name in done
    sources = [m.source for m in proj.mappings if any(o.name == inp.name for o in m.outputs)]
    return all(src in done for src in sources)


def _matched(results: Results, key: SignalKey) -> bool:
    res = results.get(key)
    return res is not None and res.matched


def _input(inp: ProjectionScoreInput, results: Results, scores: dict[str, float]) -> float:
    kind = inp.type.strip().lower()
    if kind == "kb_metric":
        res = results.get(("kb_metric", f"{inp.kb}:{inp.metric}"))
        return float(res.value or 0.0) if res is not None else 0.0
    if kind == "projection":
        if (inp.value_source or "") == "confidence":
            res = results.get(("projection", inp.name or ""))
            return res.confidence if res is not None and res.matched else 0.0
        return scores.get(inp.name or "", 0.0)
    key = (kind, inp.name or "")
    source = inp.value_source or "binary"
    if source == "raw":
        res = results.get(key)
        return float(res.value) if res is not None and res.value is not None else 0.0
    if source == "confidence":
        res = results.get(key)
        if res is None or not res.matched:
            return 0.0
        return res.confidence if res.confidence > 0 else 1.0
    return (inp.match or 1.0) if _matched(results, key) else inp.miss


def _holds(out: ProjectionOutput, value: float) -> bool:
    return (
        (out.gt is None or value > out.gt)
        and (out.gte is None or value >= out.gte)
        and (out.lt is None or value < out.lt)
        and (out.lte is None or value <= out.lte)
    )


def _emit(mapping: ProjectionMapping, value: float, results: Results) -> None:
    slope = DEFAULT_SLOPE
    if mapping.calibration is not None and mapping.calibration.slope > 0:
        slope = mapping.calibration.slope
    hit_one = False
    for out in mapping.outputs:
        hit = _holds(out, value) and not (hit_one and mapping.method == "threshold_bands")
        if hit:
            hit_one = True
            bounds = [b for b in (out.gt, out.gte, out.lt, out.lte) if b is not None]
            d = min((abs(value - b) for b in bounds), default=1.0)
            conf = 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, slope * d))))
            results[("projection", out.name)] = SignalResult(True, conf, value)
        else:
            results.setdefault(("projection", out.name), SignalResult(False, 0.0, value))
