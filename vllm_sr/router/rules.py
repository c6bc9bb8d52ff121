"""Decisions, pure on data: rule trees over signal results, the strategy that orders matching
decisions, and the model a decision ends at.

Rule confidence as upstream: a leaf is its signal's result; AND matches when every condition
does, with the mean of their confidences; OR when any does, with the best matching one's; NOT
(one condition) when its condition does not, with confidence 1. Strategy ``priority`` orders
matches by priority (high first), then confidence, then name; ``confidence`` by confidence,
then priority, then name. A decision's model is its first modelRef whose model is healthy;
with none (or no decision) it is ``providers.defaults.default_model``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from vllm_sr.config.routing import Decision, RuleLeaf, RuleNode
from vllm_sr.router.signals import SignalResult

SignalKey = tuple[str, str]  # (type, name), e.g. ("keyword", "code")


@dataclass(frozen=True)
class RuleValue:
    matched: bool
    confidence: float


MISS = RuleValue(False, 0.0)


def evaluate(node: RuleNode | RuleLeaf, results: Mapping[SignalKey, SignalResult]) -> RuleValue:
    """The value of a rule tree; a signal without a result counts as not matched."""
    if isinstance(node, RuleLeaf):
        res = results.get((node.type, node.name))
        if res is None or not res.matched:
            return MISS
        return RuleValue(True, res.confidence)
    values = [evaluate(child, results) for child in node.conditions]
    if node.operator == "NOT":
        return MISS if values[0].matched else RuleValue(True, 1.0)
    if node.operator == "AND":
        if all(v.matched for v in values):
            return RuleValue(True, sum(v.confidence for v in values) / len(values))
        return MISS
    matched = [v.confidence for v in values if v.matched]
    return RuleValue(True, max(matched)) if matched else MISS


def leaves(node: RuleNode | RuleLeaf) -> list[SignalKey]:
    if isinstance(node, RuleLeaf):
        return [(node.type, node.name)]
    return [key for child in node.conditions for key in leaves(child)]


@dataclass(frozen=True)
class Match:
    decision: Decision
    confidence: float


def rank(
    decisions: list[Decision], results: Mapping[SignalKey, SignalResult], strategy: str
) -> list[Match]:
    """The matching decisions, best first."""
    matches = []
    for dec in decisions:
        value = evaluate(dec.rules, results)
        if value.matched:
            matches.append(Match(dec, value.confidence))
    if strategy == "confidence":
        matches.sort(key=lambda m: (-m.confidence, -m.decision.priority, m.decision.name))
    else:
        matches.sort(key=lambda m: (-m.decision.priority, -m.confidence, m.decision.name))
    return matches


@dataclass(frozen=True)
class ModelChoice:
    model: str
    fallback: str | None  # why the default model was used instead of the decision's, if so


def choose_model(
    decision: Decision | None, default_model: str, healthy: Callable[[str], bool]
) -> ModelChoice:
    """The decision's first healthy modelRef, else the default model."""
    if decision is None:
        return ModelChoice(default_model, None)
    for ref in decision.model_refs:
        if healthy(ref.model):
            return ModelChoice(ref.model, None)
    return ModelChoice(default_model, "models_unhealthy")
