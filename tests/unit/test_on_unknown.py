"""v0.4's ``rules.on_unknown`` (no_match, match, fail_request) on the unknown signals of
vllm_sr/router/unknown.py: three-valued rule trees, the policy at the root, fail_request failing
the request even when another decision matched, complexity composers, and the refusal of
on_unknown below the root (upstream's ``engine_unknown.go`` and its tests)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_rules import routing_local_problems
from vllm_sr.config.routing_tree import RuleLeaf, RuleNode
from vllm_sr.router.rules import RuleValue, SignalKey, evaluate3, rank, rank_all
from vllm_sr.router.signals import SignalResult
from vllm_sr.router.signals_embedded import apply_composers
from vllm_sr.router.unknown import DecisionUnresolved, Unknown

LATE = Unknown("timeout", "deadline passed")
UNKNOWN = {"type": "embedding", "name": "risk"}
TRUTHY = {"type": "keyword", "name": "present"}
FALSY = {"type": "keyword", "name": "missing"}
RESULTS: dict[SignalKey, SignalResult] = {
    ("keyword", "present"): SignalResult(True, 0.6),
    ("keyword", "missing"): SignalResult(False, 0.0),
    ("embedding", "risk"): SignalResult.unknown_because(LATE),
}


def tree(raw: dict[str, Any]) -> RuleNode | RuleLeaf:
    return (RuleNode if "operator" in raw else RuleLeaf).model_validate(raw)


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ({"operator": "NOT", "conditions": [UNKNOWN]}, None),
        ({"operator": "AND", "conditions": [FALSY, UNKNOWN]}, RuleValue(False, 0.0)),
        ({"operator": "AND", "conditions": [TRUTHY, UNKNOWN]}, None),
        ({"operator": "OR", "conditions": [TRUTHY, UNKNOWN]}, RuleValue(True, 0.6)),
        ({"operator": "OR", "conditions": [FALSY, UNKNOWN]}, None),
        ({"operator": "AND", "conditions": [TRUTHY]}, RuleValue(True, 0.6)),
        (UNKNOWN, None),
    ],
)
def test_the_three_valued_truth_table(raw: dict[str, Any], want: RuleValue | None) -> None:
    # upstream's TestUnknownTruthTable
    assert evaluate3(tree(raw), RESULTS) == want


def routing(rules: dict[str, Any], *more: dict[str, Any]) -> Routing:
    return Routing.model_validate(
        {
            "signals": {
                "keywords": [
                    {"name": "present", "operator": "OR", "keywords": ["present"]},
                    {"name": "missing", "operator": "OR", "keywords": ["missing"]},
                ],
                "embeddings": [{"name": "risk", "threshold": 0.5, "candidates": ["x"]}],
            },
            "decisions": [
                {"name": "guarded", "priority": 1, "rules": rules, "modelRefs": [{"model": "m"}]},
                *more,
            ],
        }
    )


GOOD = {"name": "good", "priority": 100, "rules": TRUTHY, "modelRefs": [{"model": "m"}]}


@pytest.mark.parametrize(
    ("policy", "matched", "applied"),
    [
        (None, False, {}),
        ("no_match", False, {"guarded": "no_match"}),
        ("match", True, {"guarded": "match"}),
    ],
)
def test_the_policy_applies_only_where_the_root_is_unknown(
    policy: str | None, matched: bool, applied: dict[str, str]
) -> None:
    rules: dict[str, Any] = {"operator": "NOT", "conditions": [UNKNOWN]}
    if policy is not None:
        rules["on_unknown"] = policy
    ranking = rank_all(routing(rules).decisions, RESULTS, "priority")
    names = [m.decision.name for m in ranking.matches]
    # without a policy, as before v0.4: the unknown leaf does not match, so NOT matches
    assert names == (["guarded"] if matched or policy is None else [])
    assert ranking.applied == applied
    if policy == "match":
        assert ranking.matches[0].confidence == 1.0
    # a resolved tree ignores the policy: OR(true, unknown) is true
    resolved = {"operator": "OR", "conditions": [TRUTHY, UNKNOWN], "on_unknown": "no_match"}
    ranking = rank_all(routing(resolved).decisions, RESULTS, "priority")
    assert [(m.decision.name, m.confidence) for m in ranking.matches] == [("guarded", 0.6)]
    assert ranking.applied == {}


def test_an_explicit_policy_overrides_a_classifier_leafs_on_error() -> None:
    leaf = {"type": "classifier", "name": "c", "label": "x", "predicate": {"gte": 0.5}}
    results = {("classifier", "c:x"): SignalResult.unknown_because(LATE)}
    legacy = RuleLeaf.model_validate({**leaf, "on_error": "match"})
    policy = RuleLeaf.model_validate({**leaf, "on_error": "match", "on_unknown": "no_match"})
    decisions = [
        type("D", (), {"name": "legacy", "rules": legacy, "priority": 0, "tier": 0})(),
        type("D", (), {"name": "policy", "rules": policy, "priority": 0, "tier": 0})(),
    ]
    ranking = rank_all(decisions, results, "priority")
    assert [m.decision.name for m in ranking.matches] == ["legacy"]
    assert ranking.applied == {"policy": "no_match"}


@pytest.mark.parametrize("order", ["guarded first", "good first"])
def test_fail_request_fails_even_when_a_higher_priority_decision_matched(order: str) -> None:
    rules = {**UNKNOWN, "on_unknown": "fail_request"}
    rt = routing(rules, GOOD)
    decisions = rt.decisions if order == "guarded first" else list(reversed(rt.decisions))
    ranking = rank_all(decisions, RESULTS, "priority")
    assert ranking.unresolved == ("guarded",)
    assert [m.decision.name for m in ranking.matches] == ["good"]  # every decision evaluated
    with pytest.raises(DecisionUnresolved) as err:
        rank(decisions, RESULTS, "priority")
    assert err.value.decision == "guarded"
    assert err.value.http_status == 503
    assert err.value.applied == {"guarded": "fail_request"}
    # the signal known: no failure
    known = {**RESULTS, ("embedding", "risk"): SignalResult(False, 0.1, 0.1)}
    assert [m.decision.name for m in rank(decisions, known, "priority")] == ["good"]


def test_on_unknown_is_refused_below_the_root() -> None:
    nested = {
        "operator": "AND",
        "conditions": [TRUTHY, {"operator": "OR", "conditions": [UNKNOWN], "on_unknown": "match"}],
    }
    with pytest.raises(ValidationError, match=r"conditions\[1\]\.on_unknown.*only on the root"):
        routing(nested)
    problems = routing_local_problems(
        {"decisions": [{"name": "d", "rules": {"operator": "AND", "conditions": [
            {**TRUTHY, "on_unknown": "no_match"}]}}]}
    )  # fmt: skip
    assert [p.path for p in problems] == [
        ("routing", "decisions", 0, "rules", "conditions", 0, "on_unknown")
    ]
    with pytest.raises(ValidationError, match="on_unknown"):
        routing({**UNKNOWN, "on_unknown": "maybe"})


def complexity(policy: str | None) -> Routing:
    composer: dict[str, Any] = {"operator": "AND", "conditions": [UNKNOWN]}
    if policy is not None:
        composer["on_unknown"] = policy
    return Routing.model_validate(
        {
            "signals": {
                "embeddings": [{"name": "risk", "threshold": 0.5, "candidates": ["x"]}],
                "complexity": [
                    {
                        "name": "code",
                        "threshold": 0.1,
                        "hard": {"candidates": ["prove it"]},
                        "easy": {"candidates": ["hi"]},
                        "composer": composer,
                    }
                ],
            }
        }
    )


@pytest.mark.parametrize(
    ("policy", "hard"),
    [(None, False), ("no_match", False), ("match", True), ("fail_request", None)],
)
def test_a_complexity_composers_on_unknown(policy: str | None, hard: bool | None) -> None:
    results: dict[SignalKey, SignalResult] = {
        ("embedding", "risk"): SignalResult.unknown_because(LATE),
        ("complexity", "code:hard"): SignalResult(True, 0.4, 0.4),
        ("complexity", "code:medium"): SignalResult(False, 0.4, 0.4),
        ("complexity", "code:easy"): SignalResult(False, 0.4, 0.4),
    }
    apply_composers(complexity(policy).signals, results)
    res = results[("complexity", "code:hard")]
    if hard is None:  # fail_request: the rule itself is unknown, with its input's reason
        assert res.unknown is not None and res.unknown.reason == "timeout"
        assert results[("complexity", "code:easy")].unknown is not None
    else:
        assert res.unknown is None and res.matched is hard
