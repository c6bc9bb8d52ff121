"""Decisions, pure on data: rule trees over signal results, winner selection among matching
decisions, and the model a decision ends at. Upstream's semantics (``pkg/decision/engine.go``):

- a leaf is its signal's result (confidence 1.0 when the family gives none); a leaf with a
  ``predicate`` instead compares the signal's raw value (else, for a match, its confidence)
  with the bounds and matches with confidence 1.0; a leaf whose signal is unknown on this
  request (vllm_sr/router/unknown.py) does not match, unless it has ``on_error: match``;
- ``AND`` matches when every condition does, with their mean confidence (an empty AND matches
  with confidence 0); ``NOT`` (exactly one condition) when its condition does not, with
  confidence 1.0; ``OR`` (and any other operator) when some condition does, with the best one's
  confidence (the first on ties);
- a decision without ``rules`` always matches, with confidence 0;
- v0.4's ``rules.on_unknown`` (on the root node; ``engine_unknown.go``): set, the tree is
  evaluated in three values (:func:`evaluate3`: Kleene logic, an unknown leaf is unknown even
  with ``on_error: match``) and an unknown root counts as not matched (``no_match``), matched
  with confidence 1.0 (``match``), or fails the request (``fail_request``: every decision is
  still evaluated, then :class:`~vllm_sr.router.unknown.DecisionUnresolved` is raised, even
  when another decision matched);
- the winner: when some matching decision has ``tier`` > 0, by tier ascending, confidence,
  priority, name; else strategy ``confidence`` orders by confidence, priority, name and strategy
  ``priority`` (the default) by priority, confidence, name.

A decision's model is picked by the ``static`` algorithm (``pkg/selection/static.go``): its only
modelRef, else the modelRef the domain named like the decision scores best in ``model_scores``
(the first modelRef when none scores other than 1.0); then, ours, the next healthy modelRef when
that one's backends are all down, else ``providers.defaults.default_model``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_sr.config.routing_tree import RuleLeaf
from vllm_sr.jsontypes import JsonObject
from vllm_sr.router.signals import SignalResult
from vllm_sr.router.unknown import DecisionUnresolved

if TYPE_CHECKING:
    from vllm_sr.config.routing import Decision, ModelRef
    from vllm_sr.config.routing_tree import Predicate, RuleNode
    from vllm_sr.router.decision_index import DecisionIndex


SignalKey = tuple[str, str]  # (type, name), e.g. ("keyword", "code")


@dataclass(slots=True)  # several per chat: not frozen (a frozen __init__ sets each field by a call)
class RuleValue:
    matched: bool
    confidence: float


MISS = RuleValue(False, 0.0)
ALWAYS = RuleValue(True, 0.0)


def leaf_key(node: RuleLeaf) -> SignalKey:
    """A leaf's signal key; a classifier leaf with a ``label`` reads ``NAME:LABEL``. (The
    leaf's type is stored lowercase.)"""
    if node.label is not None:
        return (node.type, f"{node.name}:{node.label}")
    return (node.type, node.name)


def predicate_holds(value: float, predicate: Predicate) -> bool:
    if math.isnan(value) or math.isinf(value):
        return False
    checks = (
        (predicate.gt, lambda b: value > b),
        (predicate.gte, lambda b: value >= b),
        (predicate.lt, lambda b: value < b),
        (predicate.lte, lambda b: value <= b),
    )
    return all(test(bound) for bound, test in checks if bound is not None)


def _leaf(node: RuleLeaf, results: Mapping[SignalKey, SignalResult]) -> RuleValue:
    key = leaf_key(node)
    res = results.get(key)
    predicate = node.predicate
    if res is not None and res.unknown is not None:
        return RuleValue(True, 1.0) if node.on_error == "match" else MISS
    if predicate is not None:
        # Upstream reads the signal's recorded value, else its recorded confidence (recorded
        # for a match); with neither the leaf does not match.
        if res is None or (res.value is None and not res.matched):
            return MISS
        value = res.value if res.value is not None else res.confidence
        return RuleValue(True, 1.0) if predicate_holds(float(value), predicate) else MISS
    if res is None or not res.matched:
        return MISS
    return RuleValue(True, res.confidence)


def evaluate(
    node: RuleNode | RuleLeaf | None, results: Mapping[SignalKey, SignalResult]
) -> RuleValue:
    """The value of a rule tree (None: a decision without rules); a signal without a result,
    or with an unknown one, counts as not matched."""
    if node is None:
        return ALWAYS
    if isinstance(node, RuleLeaf):
        return _leaf(node, results)
    operator = node.operator
    if operator == "NOT" or operator == "AND":
        values = [evaluate(child, results) for child in node.conditions]
        if operator == "NOT":
            if len(values) != 1:
                return MISS
            return MISS if values[0].matched else RuleValue(True, 1.0)
        if not values:
            return ALWAYS
        if all(v.matched for v in values):
            return RuleValue(True, sum(v.confidence for v in values) / len(values))
        return MISS
    best: RuleValue | None = None
    for child in node.conditions:  # OR (and any other operator): the best, the first on ties
        v = evaluate(child, results)
        if v.matched and (best is None or v.confidence > best.confidence):
            best = v
    return best if best is not None else MISS


def evaluate3(
    node: RuleNode | RuleLeaf | None, results: Mapping[SignalKey, SignalResult]
) -> RuleValue | None:
    """The value of a rule tree in three values: None is unknown (a leaf whose signal is
    unknown on this request; NOT of unknown; AND with no false condition and an unknown one;
    OR with no true condition and an unknown one)."""
    if node is None:
        return ALWAYS
    if isinstance(node, RuleLeaf):
        res = results.get(leaf_key(node))
        if res is not None and res.unknown is not None:
            return None
        return _leaf(node, results)
    values = [evaluate3(child, results) for child in node.conditions]
    if node.operator == "NOT":
        if len(values) != 1:
            return MISS
        if values[0] is None:
            return None
        return MISS if values[0].matched else RuleValue(True, 1.0)
    if node.operator == "AND":
        if not values:
            return ALWAYS
        if any(v is not None and not v.matched for v in values):
            return MISS
        known = [v for v in values if v is not None]
        if len(known) < len(values):
            return None
        return RuleValue(True, sum(v.confidence for v in known) / len(known))
    best: RuleValue | None = None
    for v in values:
        if v is not None and v.matched and (best is None or v.confidence > best.confidence):
            best = v
    if best is not None:
        return best
    return None if any(v is None for v in values) else MISS


def on_unknown_of(rules: RuleNode | RuleLeaf | None) -> str | None:
    """The root node's ``on_unknown`` policy (None: not set)."""
    return rules.on_unknown if rules is not None else None


@dataclass(frozen=True)
class DecisionValue:
    """One decision's rule value, with the on_unknown policy applied when its tree was
    unknown (``applied``: that policy, else None)."""

    value: RuleValue
    applied: str | None = None
    unresolved: bool = False  # fail_request applied


def decision_value(
    rules: RuleNode | RuleLeaf | None, results: Mapping[SignalKey, SignalResult]
) -> DecisionValue:
    policy = on_unknown_of(rules)
    if policy is None:
        return DecisionValue(evaluate(rules, results))
    value = evaluate3(rules, results)
    if value is not None:
        return DecisionValue(value)
    if policy == "match":
        return DecisionValue(RuleValue(True, 1.0), policy)
    return DecisionValue(MISS, policy, unresolved=policy == "fail_request")


def trace(
    node: RuleNode | RuleLeaf | None, results: Mapping[SignalKey, SignalResult]
) -> JsonObject:
    """The rule tree with each node's value, in upstream's eval_trace shape."""
    if node is None:
        return {"node_type": "fallback", "matched": True, "confidence": 0.0}
    value = evaluate(node, results)
    if isinstance(node, RuleLeaf):
        kind, name = leaf_key(node)
        return {
            "node_type": "leaf",
            "signal_type": kind,
            "signal_name": name,
            "matched": value.matched,
            "confidence": value.confidence,
        }
    return {
        "node_type": node.operator,
        "matched": value.matched,
        "confidence": value.confidence,
        "children": [trace(child, results) for child in node.conditions],
    }


def leaves(node: RuleNode | RuleLeaf | None) -> list[SignalKey]:
    if node is None:
        return []
    if isinstance(node, RuleLeaf):
        return [leaf_key(node)]
    return [key for child in node.conditions for key in leaves(child)]


@dataclass(slots=True)  # one per chat: not frozen (a frozen __init__ sets each field by a call)
class Match:
    decision: Decision
    confidence: float


def _tier(dec: Decision) -> int:
    return dec.tier


@dataclass(slots=True)  # one per chat: not frozen (a frozen __init__ sets each field by a call)
class Ranking:
    """The matching decisions, best first; the on_unknown policies applied, by decision name;
    the decisions whose ``fail_request`` applied (the request fails when any did)."""

    matches: list[Match]
    applied: dict[str, str]
    unresolved: tuple[str, ...] = ()


def rank(
    decisions: Sequence[Decision],
    results: Mapping[SignalKey, SignalResult],
    strategy: str,
    index: DecisionIndex | None = None,
) -> list[Match]:
    """The matching decisions, best first. Raises DecisionUnresolved when some decision's
    ``on_unknown: fail_request`` applied."""
    ranking = rank_all(decisions, results, strategy, index)
    if ranking.unresolved:
        raise DecisionUnresolved(ranking.unresolved[0], ranking.applied)
    return ranking.matches


def rank_all(
    decisions: Sequence[Decision],
    results: Mapping[SignalKey, SignalResult],
    strategy: str,
    index: DecisionIndex | None = None,
) -> Ranking:
    """Every decision evaluated (with its on_unknown policy), the matching ones ranked.
    ``index``: ``decisions``' :class:`~vllm_sr.router.decision_index.DecisionIndex`, to
    evaluate only those the results may make match (the same ranking, for less)."""
    matches = []
    applied: dict[str, str] = {}
    unresolved: list[str] = []
    for dec in decisions if index is None else index.candidates(results):
        if on_unknown_of(dec.rules) is None:  # decision_value's own path, without its record
            value = evaluate(dec.rules, results)
            if value.matched:
                matches.append(Match(dec, value.confidence))
            continue
        dv = decision_value(dec.rules, results)
        if dv.applied is not None:
            applied[dec.name] = dv.applied
        if dv.unresolved:
            unresolved.append(dec.name)
        if dv.value.matched:
            matches.append(Match(dec, dv.value.confidence))
    if len(matches) > 1:  # the usual chat has one match or none: nothing to order
        _order(matches, strategy)
    return Ranking(matches, applied, tuple(unresolved))


def _order(matches: list[Match], strategy: str) -> None:
    """``matches`` best first: by tier when some has one, else by ``strategy``."""
    if any(_tier(m.decision) > 0 for m in matches):
        matches.sort(
            key=lambda m: (
                _tier(m.decision),
                -m.confidence,
                -m.decision.priority,
                m.decision.name,
            )
        )
    elif strategy == "confidence":
        matches.sort(key=lambda m: (-m.confidence, -m.decision.priority, m.decision.name))
    else:
        matches.sort(key=lambda m: (-m.decision.priority, -m.confidence, m.decision.name))


@dataclass(slots=True)  # one per chat: not frozen (a frozen __init__ sets each field by a call)
class ModelChoice:
    model: str
    fallback: str | None  # why the default model was used instead of the decision's, if so
    ref: ModelRef | None = None  # the decision's modelRef that was chosen (None: the default model)
    method: str = "default"  # upstream's selection method: single, static or default


def static_order(decision: Decision, model_scores: Mapping[str, float] | None) -> list[ModelRef]:
    """The decision's modelRefs in static's order: the pick first, then the rest as written."""
    refs = list(decision.model_refs)
    if len(refs) <= 1 or not model_scores:
        return refs
    scores = [float(model_scores.get(r.model, 1.0)) for r in refs]
    best = max(scores)
    if best == 1.0:
        return refs
    pick = scores.index(best)
    return [refs[pick], *refs[:pick], *refs[pick + 1 :]]


def choose_model(
    decision: Decision | None,
    default_model: str,
    healthy: Callable[[str], bool],
    model_scores: Mapping[str, float] | None = None,
) -> ModelChoice:
    """Static's pick when its backends are up, else the next healthy modelRef, else the
    default model."""
    if decision is None:
        return ModelChoice(default_model, None)
    refs = static_order(decision, model_scores)
    if not refs:
        return ModelChoice(default_model, None)
    method = "single" if len(refs) == 1 else "static"
    for ref in refs:
        if healthy(ref.model):
            return ModelChoice(ref.model, None, ref, method)
    return ModelChoice(default_model, "models_unhealthy")
