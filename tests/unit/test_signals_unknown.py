"""Signals fail one by one (vllm_sr/router/unknown.py): a deployment whose question fails makes
only its own signals unknown; unknown signals match no rule leaf (``on_error: match`` aside),
leave a partition's default and a projection's outputs unknown, and the decisions that do not
read them still match."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.backends import FakeWorkerExchange
from tests.unit.test_signals_projections import PROJECTIONS, routing
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.config.routing_tree import RuleLeaf, RuleNode
from vllm_sr.errors import DeadlineExceeded, Overloaded, VllmSrError, WorkerFailed
from vllm_sr.router.backends import BackendSet
from vllm_sr.router.request_view import RequestView
from vllm_sr.router.route import Router
from vllm_sr.router.rules import RuleValue, SignalKey, evaluate, rank
from vllm_sr.router.signals import SignalResult
from vllm_sr.router.signals_projections import apply_partitions, apply_projections
from vllm_sr.router.unknown import REASONS, Unknown, reason_of, unknown_of

BUSY = Unknown("overloaded", "every replica is full")


def node(raw: dict[str, Any]) -> RuleNode:
    return RuleNode.model_validate(raw)


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (Overloaded("full"), "overloaded"),
        (DeadlineExceeded("late"), "timeout"),
        (WorkerFailed("reset"), "failed"),
        (VllmSrError("boom"), "failed"),
    ],
)
def test_an_error_code_names_its_reason(error: VllmSrError, reason: str) -> None:
    why = unknown_of(error.code, error.message)
    assert why.reason == reason
    assert error.message in why.describe()
    assert why.describe().startswith(f"{reason}: ")


def test_http_statuses_and_unknown_reasons() -> None:
    assert [reason_of(c) for c in ("http_429", "http_503", "http_504", "http_500")] == [
        "overloaded",
        "unavailable",
        "timeout",
        "failed",
    ]
    assert unknown_of("http_503").describe() == "unavailable: http_503"
    with pytest.raises(ValueError, match="reason: 'busy' is not one of"):
        Unknown("busy")
    assert set(REASONS) == {"overloaded", "unavailable", "timeout", "failed"}


def test_an_unknown_leaf_does_not_match_unless_on_error_says_so() -> None:
    results = {
        ("embedding", "e"): SignalResult.unknown_because(BUSY),
        ("classifier", "c:x"): SignalResult.unknown_because(BUSY),  # a leaf with label x
    }
    leaf = {"type": "embedding", "name": "e"}
    assert evaluate(RuleLeaf.model_validate(leaf), results) == RuleValue(False, 0.0)
    with_predicate = RuleLeaf.model_validate({**leaf, "predicate": {"gte": 0.0}})
    assert evaluate(with_predicate, results) == RuleValue(False, 0.0)
    # without rules.on_unknown (as before v0.4): NOT over an unknown signal matches
    assert evaluate(node({"operator": "NOT", "conditions": [leaf]}), results).matched
    # a classifier leaf with on_error: match matches (confidence 1.0), as upstream's does
    classifier = {"type": "classifier", "name": "c", "label": "x", "predicate": {"gte": 0.5}}
    assert not evaluate(RuleLeaf.model_validate(classifier), results).matched
    on_error = RuleLeaf.model_validate({**classifier, "on_error": "match"})
    assert evaluate(on_error, results) == RuleValue(True, 1.0)
    # a result that was evaluated is read as ever
    results[("classifier", "c:x")] = SignalResult(False, 0.0, 0.2)
    assert evaluate(on_error, results) == RuleValue(False, 0.0)


def test_decisions_not_reading_an_unknown_signal_still_match() -> None:
    rt = Routing.model_validate(
        {
            "signals": {
                "keywords": [{"name": "code", "operator": "OR", "keywords": ["code"]}],
                "embeddings": [{"name": "e", "threshold": 0.5, "candidates": ["x"]}],
            },
            "decisions": [
                {"name": "semantic", "priority": 200, "modelRefs": [{"model": "m"}],
                 "rules": {"type": "embedding", "name": "e"}},
                {"name": "coding", "priority": 100, "modelRefs": [{"model": "m"}],
                 "rules": {"type": "keyword", "name": "code"}},
            ],
        }
    )  # fmt: skip
    results: dict[SignalKey, SignalResult] = {
        ("keyword", "code"): SignalResult(True, 1.0),
        ("embedding", "e"): SignalResult.unknown_because(BUSY),
    }
    assert [m.decision.name for m in rank(rt.decisions, results, "priority")] == ["coding"]


DOMAINS = [{"name": n, "description": n} for n in ("math", "law")]
PARTITION = {
    "partitions": [
        {"name": "p", "semantics": "exclusive", "members": ["math", "law"], "default": "law"}
    ]
}


def test_a_partition_with_an_unknown_member_adds_no_default() -> None:
    rt = routing(PARTITION, domains=DOMAINS)
    results: dict[SignalKey, SignalResult] = {
        ("domain", "math"): SignalResult.unknown_because(BUSY),
        ("domain", "law"): SignalResult.unknown_because(BUSY),
    }
    apply_partitions(rt, results)
    assert results[("domain", "law")].unknown == BUSY
    assert not results[("domain", "law")].matched
    # a member that was evaluated and matched is kept as ever
    results[("domain", "math")] = SignalResult(True, 0.9, 0.9)
    apply_partitions(rt, results)
    assert results[("domain", "math")].matched


def test_a_score_reading_an_unknown_signal_leaves_its_outputs_unknown() -> None:
    rt = routing(PROJECTIONS)
    results: dict[SignalKey, SignalResult] = {
        ("keyword", "hard_words"): SignalResult(True, 1.0),
        ("keyword", "easy_words"): SignalResult(False, 0.0),
        ("embedding", "reasoning"): SignalResult.unknown_because(BUSY),
        ("context", "long"): SignalResult(False, 0.0, 200.0),
    }
    apply_projections(rt, results)
    outputs = ("low", "mid", "high", "above_one", "above_two")  # escalate reads difficulty
    for name in outputs:
        res = results[("projection", name)]
        assert res.unknown == BUSY and not res.matched, name
    # the same inputs all known: the bands are emitted
    results[("embedding", "reasoning")] = SignalResult(True, 0.4, 0.4)
    for name in outputs:
        del results[("projection", name)]
    apply_projections(rt, results)
    assert results[("projection", "high")].matched
    assert all(results[("projection", n)].unknown is None for n in outputs)


PROVIDERS = Providers.model_validate(
    {
        "defaults": {"default_model": "general"},
        "models": [
            {"name": "general", "backend_refs": [{"endpoint": "127.0.0.1:9"}]},
            {"name": "coder", "backend_refs": [{"endpoint": "127.0.0.1:9"}]},
        ],
    }
)

TWO_DEPLOYMENTS = {
    "signals": {
        "keywords": [{"name": "code", "operator": "OR", "keywords": ["code"]}],
        "embeddings": [{"name": "emb", "threshold": 0.0, "candidates": ["debug this code"]}],
        "jailbreak": [
            {"name": "guard", "method": "classifier", "threshold": 0.5, "deployment": "guard"}
        ],
    },
    "decisions": [
        {"name": "blocked", "priority": 300, "modelRefs": [{"model": "general"}],
         "rules": {"type": "jailbreak", "name": "guard"}},
        {"name": "semantic", "priority": 200, "modelRefs": [{"model": "coder"}],
         "rules": {"operator": "AND", "conditions": [
             {"type": "embedding", "name": "emb"}, {"type": "keyword", "name": "code"}]}},
    ],
}  # fmt: skip


async def test_a_failed_deployment_leaves_only_its_own_signals_unknown() -> None:
    exchange = FakeWorkerExchange({"primary", "guard"})
    exchange.fail["guard"] = Overloaded("every replica of 'guard' is full")
    router = Router(
        PROVIDERS,
        Routing.model_validate(TWO_DEPLOYMENTS),
        exchange=exchange,
        backends=BackendSet(PROVIDERS),
        decision_deployment="primary",
    )
    assert sorted(router.plan.deployments) == ["guard", "primary"]
    chat = {"messages": [{"role": "user", "content": "debug this code"}]}
    view = RequestView.from_chat(chat, {})
    run = await router.signals(view, router.plan)
    assert run.unknown() == {
        ("jailbreak", "guard"): Unknown("overloaded", "every replica of 'guard' is full")
    }
    assert run.results[("embedding", "emb")].matched  # primary answered
    assert "jailbreak" not in run.timings_ms and "embedding" in run.timings_ms
    result = await router.route(view)
    assert (result.decision, result.model, result.fallback) == ("semantic", "coder", None)
    assert result.unknown_signals == ("jailbreak:guard",)
    assert router.stats.unknown == {("jailbreak", "overloaded"): 1}
    assert exchange.calls == {"primary": 2, "guard": 2}
