"""Decision rules on data: rule trees and their confidence, strategies, model fallbacks."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_sr.config.routing import Decision
from vllm_sr.config.routing_tree import RuleNode
from vllm_sr.router.rules import RuleValue, choose_model, evaluate, leaves, rank
from vllm_sr.router.signals import SignalResult

R = {
    ("keyword", "code"): SignalResult(True, 1.0),
    ("embedding", "billing"): SignalResult(True, 0.6),
    ("domain", "math"): SignalResult(True, 0.8),
    ("domain", "law"): SignalResult(False, 0.1),
}


def node(raw: dict[str, Any]) -> RuleNode:
    return RuleNode.model_validate(raw)


def leaf(kind: str, name: str) -> dict[str, str]:
    return {"type": kind, "name": name}


def test_and_averages_its_children() -> None:
    tree = node(
        {"operator": "AND", "conditions": [leaf("keyword", "code"), leaf("embedding", "billing")]}
    )
    assert evaluate(tree, R) == RuleValue(True, pytest.approx(0.8))  # type: ignore[arg-type]


def test_and_fails_when_one_child_fails() -> None:
    tree = node({"operator": "AND", "conditions": [leaf("keyword", "code"), leaf("domain", "law")]})
    assert evaluate(tree, R) == RuleValue(False, 0.0)


def test_or_takes_the_best_matching_child() -> None:
    tree = node(
        {
            "operator": "OR",
            "conditions": [
                leaf("embedding", "billing"),
                leaf("domain", "math"),
                leaf("domain", "law"),
            ],
        }
    )
    assert evaluate(tree, R) == RuleValue(True, 0.8)


def test_not_is_unary() -> None:
    assert evaluate(
        node({"operator": "NOT", "conditions": [leaf("domain", "law")]}), R
    ) == RuleValue(True, 1.0)
    assert not evaluate(
        node({"operator": "NOT", "conditions": [leaf("keyword", "code")]}), R
    ).matched


def test_unknown_or_unevaluated_signal_is_not_matched() -> None:
    assert not evaluate(
        node({"operator": "OR", "conditions": [leaf("keyword", "absent")]}), R
    ).matched


def test_nested_trees() -> None:
    tree = node(
        {
            "operator": "AND",
            "conditions": [
                leaf("domain", "math"),
                {
                    "operator": "OR",
                    "conditions": [leaf("domain", "law"), leaf("embedding", "billing")],
                },
                {"operator": "NOT", "conditions": [leaf("domain", "law")]},
            ],
        }
    )
    value = evaluate(tree, R)
    assert value.matched and value.confidence == pytest.approx((0.8 + 0.6 + 1.0) / 3)
    assert sorted(leaves(tree)) == [
        ("domain", "law"),
        ("domain", "law"),
        ("domain", "math"),
        ("embedding", "billing"),
    ]


def decision(
    name: str, priority: int, *conds: dict[str, str], models: tuple[str, ...] = ("m",)
) -> Decision:
    return Decision.model_validate(
        {
            "name": name,
            "priority": priority,
            "rules": {"operator": "OR", "conditions": list(conds)},
            "modelRefs": [{"model": m} for m in models],
        }
    )


DECISIONS = [
    decision("billing", 10, leaf("embedding", "billing")),  # confidence 0.6
    decision("math", 10, leaf("domain", "math")),  # 0.8
    decision("coding", 5, leaf("keyword", "code")),  # 1.0
    decision("legal", 100, leaf("domain", "law")),  # not matched
]


def test_priority_strategy_orders_by_priority_then_confidence_then_name() -> None:
    order = [m.decision.name for m in rank(DECISIONS, R, "priority")]
    assert order == ["math", "billing", "coding"]


def test_priority_ties_on_confidence_break_by_name() -> None:
    twins = [
        decision("zeta", 1, leaf("keyword", "code")),
        decision("alpha", 1, leaf("keyword", "code")),
    ]
    assert [m.decision.name for m in rank(twins, R, "priority")] == ["alpha", "zeta"]


def test_confidence_strategy_orders_by_confidence_first() -> None:
    order = [m.decision.name for m in rank(DECISIONS, R, "confidence")]
    assert order == ["coding", "math", "billing"]


def test_no_match_is_empty() -> None:
    assert rank(DECISIONS, {}, "priority") == []


def test_first_healthy_model_ref_else_default() -> None:
    dec = decision("d", 1, leaf("keyword", "code"), models=("a", "b"))
    assert choose_model(dec, "general", lambda m: True).model == "a"
    choice = choose_model(dec, "general", lambda m: m == "b")
    assert (choice.model, choice.fallback) == ("b", None)
    choice = choose_model(dec, "general", lambda m: False)
    assert (choice.model, choice.fallback) == ("general", "models_unhealthy")
    assert choose_model(None, "general", lambda m: False).model == "general"
