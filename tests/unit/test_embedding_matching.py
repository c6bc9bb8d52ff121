"""Embedding signals as upstream's embedding classifier scores and matches them: prototype
scores (``mean`` the plain mean, ``max``/``any`` the best/support blend), soft matching at
``min_score_threshold`` when nothing matched hard, and ``top_k`` after partitions and
composers. On upstream's own fragments (``signal/embedding/support.yaml``) and
``embedding_config`` blocks (the reference config's and multi-objective's)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy
import pytest
import yaml

from tests.support.backends import FakeWorkerExchange, answer_bundle
from vllm_sr.config.files import parse_config
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.config.routing_signals import EmbeddingSignal
from vllm_sr.router.backends import BackendSet
from vllm_sr.router.embedding_matching import EmbeddingMatching, embedding_score
from vllm_sr.router.questions import QuestionPlan, declared_keys
from vllm_sr.router.request_view import RequestView
from vllm_sr.router.route import Router
from vllm_sr.router.signals import SignalResult
from vllm_sr.router.signals_prototypes import PrototypeOptions
from vllm_sr.router.unknown import Unknown

FIXTURES = Path(__file__).parents[1] / "fixtures" / "upstream"
SUPPORT = yaml.safe_load((FIXTURES / "fragments/signal/embedding/support.yaml").read_text())
PROVIDERS = Providers.model_validate(
    {
        "defaults": {"default_model": "general"},
        "models": [
            {"name": "general", "backend_refs": [{"endpoint": "127.0.0.1:9"}]},
            {"name": "tech", "backend_refs": [{"endpoint": "127.0.0.1:9"}]},
            {"name": "accounts", "backend_refs": [{"endpoint": "127.0.0.1:9"}]},
        ],
    }
)


def unit(*pairs: tuple[int, float]) -> numpy.ndarray:
    """A unit vector in 8 dimensions with the given (axis, value) entries, the rest filling
    axis 7."""
    vec = numpy.zeros(8, dtype=numpy.float32)
    for axis, value in pairs:
        vec[axis] = value
    vec[7] = math.sqrt(max(0.0, 1.0 - float(vec @ vec)))
    return vec


def candidate(similarity: float, axis: int) -> numpy.ndarray:
    """A candidate whose cosine to the query (axis 0) is ``similarity``."""
    v = numpy.zeros(8, dtype=numpy.float32)
    v[0], v[axis] = similarity, math.sqrt(1.0 - similarity**2)
    return v


QUERY = unit((0, 1.0))
SIMS = (0.9, 0.5, 0.1)


def scored(method: str, threshold: float, matching: EmbeddingMatching) -> SignalResult:
    sig = EmbeddingSignal.model_validate(
        {
            "name": "e",
            "threshold": threshold,
            "aggregation_method": method,
            "candidates": ["a", "b", "c"],
        }
    )
    rows = numpy.stack([candidate(s, i + 1) for i, s in enumerate(SIMS)])
    return embedding_score(sig, matching.bank(sig, rows), QUERY)


# -- scoring -------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["max", "any"])
def test_max_and_any_blend_the_best_with_the_top_m_mean(method: str) -> None:
    res = scored(method, 0.8, EmbeddingMatching())
    expected = 0.75 * 0.9 + 0.25 * (0.9 + 0.5) / 2  # best_weight 0.75, top_m 2
    assert res.value == pytest.approx(expected, abs=1e-6)
    assert res.matched and res.confidence == pytest.approx(expected, abs=1e-6)
    # not the best cosine alone (0.9): a threshold between the blend and the best misses
    assert not scored(method, 0.87, EmbeddingMatching()).matched


def test_mean_is_the_plain_mean_over_the_prototypes() -> None:
    res = scored("mean", 0.5, EmbeddingMatching())
    assert res.value == pytest.approx(sum(SIMS) / 3, abs=1e-6) and res.matched
    assert not scored("mean", 0.51, EmbeddingMatching()).matched


def test_prototype_scoring_options_weigh_the_score() -> None:
    options = PrototypeOptions(best_weight=0.5, top_m=3)
    res = scored("max", 0.0, EmbeddingMatching(prototypes=options))
    assert res.value == pytest.approx(0.5 * 0.9 + 0.5 * sum(SIMS) / 3, abs=1e-6)


def test_near_duplicate_candidates_are_one_prototype_unless_disabled() -> None:
    sig = EmbeddingSignal(name="e", threshold=0.5, candidates=["a", "a'", "b"])
    a = candidate(0.9, 1)
    near = unit((0, 0.88), (1, 0.47))  # cosine to a >= 0.9: one cluster with a
    far = candidate(0.2, 2)
    rows = numpy.stack([a, near, far])
    on = EmbeddingMatching().bank(sig, rows)
    off = EmbeddingMatching(prototypes=PrototypeOptions(enabled=False)).bank(sig, rows)
    assert on.score(QUERY).count == 2 and off.score(QUERY).count == 3
    # clustered, the support is the near pair's medoid and the far one; unclustered the pair
    assert on.score(QUERY).support < off.score(QUERY).support


# -- upstream's embedding_config ----------------------------------------------------------


def test_options_from_upstreams_blocks_and_defaults() -> None:
    assert EmbeddingMatching.of(None) == EmbeddingMatching(1, True, 0.5, PrototypeOptions())
    reference = yaml.safe_load((FIXTURES / "config.yaml").read_text())
    cfg = reference["global"]["model_catalog"]["embeddings"]["semantic"]["embedding_config"]
    assert (cfg["top_k"], cfg["min_score_threshold"]) == (1, 0.45)
    doc: dict[str, Any] = {
        "providers": {
            "defaults": {"default_model": "general"},
            "models": [{"name": "general", "backend_refs": [{"endpoint": "127.0.0.1:9"}]}],
        },
        "routing": {"signals": SUPPORT["routing"]["signals"]},
        "global": {"model_catalog": {"embeddings": {"semantic": {"embedding_config": cfg}}}},
    }
    matching = EmbeddingMatching.of(parse_config(yaml.safe_dump(doc)).global_)
    assert (matching.top_k, matching.soft_matching, matching.min_score) == (1, True, 0.45)
    assert matching.prototypes == PrototypeOptions(True, 0.9, 8, 0.75, 2)
    cfg = dict(cfg, top_k=0, enable_soft_matching=False, min_score_threshold=0)
    doc["global"]["model_catalog"]["embeddings"]["semantic"]["embedding_config"] = cfg
    matching = EmbeddingMatching.of(parse_config(yaml.safe_dump(doc)).global_)
    assert (matching.top_k, matching.soft_matching, matching.min_score) == (0, False, 0.5)


# -- soft matching and top_k on results ----------------------------------------------------


def results(**values: float) -> dict[tuple[str, str], SignalResult]:
    """Embedding results by name: matched when the value is >= 0.7 (a hard threshold)."""
    return {("embedding", n): SignalResult(v >= 0.7, v, v) for n, v in values.items()}


def matched(res: dict[tuple[str, str], SignalResult]) -> list[str]:
    return sorted(n for (k, n), r in res.items() if k == "embedding" and r.matched)


def test_soft_matching_only_when_nothing_matched_hard() -> None:
    res = results(technical_support=0.6, account_management=0.55, other=0.4)
    assert EmbeddingMatching().soft_match(res) == ["account_management", "technical_support"]
    assert matched(res) == ["account_management", "technical_support"]
    assert res[("embedding", "technical_support")].confidence == pytest.approx(0.6)
    hard = results(technical_support=0.75, account_management=0.55)
    assert EmbeddingMatching().soft_match(hard) == []
    assert matched(hard) == ["technical_support"]
    off = results(technical_support=0.6)
    assert EmbeddingMatching(soft_matching=False).soft_match(off) == [] and matched(off) == []
    floor = results(technical_support=0.6, account_management=0.55)
    EmbeddingMatching(min_score=0.58).soft_match(floor)
    assert matched(floor) == ["technical_support"]


def test_unknown_signals_take_no_part_in_soft_matching() -> None:
    res = results(technical_support=0.6)
    res[("embedding", "down")] = SignalResult.unknown_because(Unknown("overloaded", "full"))
    EmbeddingMatching().soft_match(res)
    assert matched(res) == ["technical_support"]
    assert res[("embedding", "down")].unknown is not None


def test_top_k_keeps_the_best_confidences_ties_by_name() -> None:
    res = results(b=0.8, a=0.8, c=0.9, d=0.5)
    assert EmbeddingMatching(top_k=2).keep_top_k(res) == ["b"]
    assert matched(res) == ["a", "c"]
    assert res[("embedding", "b")].value == pytest.approx(0.8)  # the score stays readable
    res = results(b=0.8, a=0.8, c=0.9)
    EmbeddingMatching().keep_top_k(res)  # upstream's default top_k 1
    assert matched(res) == ["c"]
    res = results(b=0.8, a=0.8, c=0.9)
    assert EmbeddingMatching(top_k=0).keep_top_k(res) == [] and matched(res) == ["a", "b", "c"]
    other = {("domain", "x"): SignalResult(True, 0.99)}
    EmbeddingMatching().keep_top_k(other)
    assert other[("domain", "x")].matched  # only embedding signals are limited


# -- through the router (support.yaml, toy embeddings in the worker's answer format) ---------

TEXT = "account settings troubleshooting steps"  # under both thresholds, over 0.5 for both


def support_routing(**extra: Any) -> Routing:
    return Routing.model_validate(
        {
            "signals": SUPPORT["routing"]["signals"],
            "decisions": [
                {
                    "name": "support",
                    "priority": 20,
                    "rules": {"type": "embedding", "name": "technical_support"},
                    "modelRefs": [{"model": "tech"}],
                },
                {
                    "name": "account",
                    "priority": 10,
                    "rules": {"type": "embedding", "name": "account_management"},
                    "modelRefs": [{"model": "accounts"}],
                },
            ],
            **extra,
        }
    )


def router(routing: Routing, embedding_config: dict[str, Any] | None = None) -> Router:
    global_ = None
    if embedding_config is not None:
        doc = {
            "providers": PROVIDERS.model_dump(exclude_none=True),
            "global": {
                "model_catalog": {
                    "embeddings": {"semantic": {"embedding_config": embedding_config}}
                }
            },
        }
        global_ = parse_config(yaml.safe_dump(doc)).global_
    return Router(
        PROVIDERS,
        routing,
        exchange=FakeWorkerExchange({"primary"}),
        backends=BackendSet(PROVIDERS),
        decision_deployment="primary",
        global_=global_,
    )


def view(text: str) -> RequestView:
    return RequestView.from_chat({"messages": [{"role": "user", "content": text}]}, {})


def hard_scores(text: str) -> dict[str, float]:
    """The two rules' scores as the deployment answers them (before soft matching)."""
    rt = support_routing()
    q = QuestionPlan(rt, "primary", wanted=declared_keys(rt)).deployments["primary"]
    answer = q.read(answer_bundle(q.bundle(text, view(text))), view=view(text))
    assert not any(r.matched for r in answer.values())
    return {name: r.value or 0.0 for (_, name), r in answer.items()}


async def test_upstreams_defaults_soft_match_then_keep_the_best() -> None:
    scores = hard_scores(TEXT)
    assert 0.5 <= scores["technical_support"] < scores["account_management"] < 0.72
    result = await router(support_routing()).route(view(TEXT))
    assert result.matched_signals == ("embedding:account_management",)
    assert (result.decision, result.model) == ("account", "accounts")
    both = await router(support_routing(), {"top_k": 0}).route(view(TEXT))
    assert both.matched_signals == (
        "embedding:account_management",
        "embedding:technical_support",
    )
    assert both.decision == "support"  # the higher priority, now that both match
    none = await router(support_routing(), {"top_k": 0, "enable_soft_matching": False}).route(
        view(TEXT)
    )
    assert none.matched_signals == () and none.decision is None and none.model == "general"
    floor = await router(support_routing(), {"min_score_threshold": 0.7}).route(view(TEXT))
    assert floor.decision is None


async def test_unreferenced_embedding_signals_still_compete_for_top_k() -> None:
    """Upstream evaluates every embedding rule once the family is used: a decision on
    technical_support alone still loses it to account_management's better soft score."""
    rt = Routing.model_validate(
        {
            "signals": SUPPORT["routing"]["signals"],
            "decisions": [
                {
                    "name": "support",
                    "rules": {"type": "embedding", "name": "technical_support"},
                    "modelRefs": [{"model": "tech"}],
                }
            ],
        }
    )
    result = await router(rt).route(view(TEXT))
    assert result.decision is None
    assert "embedding:account_management" in result.matched_signals
    assert (await router(rt, {"top_k": 0}).route(view(TEXT))).decision == "support"


async def test_soft_matching_runs_before_partitions() -> None:
    """As upstream's classifier: the partition sees the soft matches and keeps the better one;
    its default (technical_support) fires only when nothing matched at all."""
    partition = {
        "partitions": [
            {
                "name": "desk",
                "members": ["technical_support", "account_management"],
                "semantics": "exclusive",
                "default": "technical_support",
            }
        ]
    }
    rt = support_routing(projections=partition)
    for config, kept in (
        ({"top_k": 0}, "account_management"),
        ({"top_k": 0, "enable_soft_matching": False}, "technical_support"),
    ):
        r = router(rt, config)
        run = await r.signals(view(TEXT), r.plan)
        hits = [n for (k, n), res in run.results.items() if k == "embedding" and res.matched]
        assert hits == [kept], config
