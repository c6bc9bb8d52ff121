"""routing.projections after the signals: partitions keep one member, weighted scores read
signals as binary / confidence / raw values (and other projections), threshold bands become
projection signals with a sigmoid-distance confidence. Pure on signal results."""

from __future__ import annotations

import math
from typing import Any

import pytest

from vllm_sr.config.routing import Routing
from vllm_sr.router.questions import QuestionPlan
from vllm_sr.router.rules import SignalKey
from vllm_sr.router.signals import SignalResult
from vllm_sr.router.signals_projections import (
    ProjectionPlan,
    apply_partitions,
    apply_projections,
)

Results = dict[SignalKey, SignalResult]


def routing(projections: dict[str, Any], **signals: Any) -> Routing:
    return Routing.model_validate({"signals": signals, "projections": projections})


DOMAINS = [{"name": n, "description": n} for n in ("math", "law", "other")]


def test_exclusive_partition_keeps_the_highest_member() -> None:
    rt = routing(
        {"partitions": [{"name": "p", "semantics": "exclusive", "members": ["math", "law"],
                         "default": "law"}]},
        domains=DOMAINS,
    )  # fmt: skip
    results: Results = {
        ("domain", "math"): SignalResult(True, 0.6, 0.6),
        ("domain", "law"): SignalResult(True, 0.7, 0.7),
    }
    apply_partitions(rt, results)
    assert results[("domain", "law")] == SignalResult(True, 0.7, 0.7)
    assert not results[("domain", "math")].matched
    # none matched: the default joins with confidence 1.0
    none: Results = {("domain", "math"): SignalResult(False, 0.1, 0.1)}
    apply_partitions(rt, none)
    assert none[("domain", "law")] == SignalResult(True, 1.0, 1.0)


def test_softmax_partition_confidence_is_the_share() -> None:
    rt = routing(
        {"partitions": [{"name": "p", "semantics": "softmax_exclusive", "temperature": 0.1,
                         "members": ["math", "law"], "default": "math"}]},
        domains=DOMAINS,
    )  # fmt: skip
    results: Results = {
        ("domain", "math"): SignalResult(True, 0.6, 0.6),
        ("domain", "law"): SignalResult(True, 0.7, 0.7),
    }
    apply_partitions(rt, results)
    share = 1.0 / (1.0 + math.exp(-1.0))  # e^0 / (e^0 + e^-1)
    assert results[("domain", "law")].confidence == pytest.approx(share)


PROJECTIONS: dict[str, Any] = {
    "scores": [
        {"name": "difficulty", "method": "weighted_sum", "inputs": [
            {"type": "keyword", "name": "hard_words", "weight": 0.5},
            {"type": "keyword", "name": "easy_words", "weight": -0.5, "value_source": "binary",
             "match": 1.0},
            {"type": "embedding", "name": "reasoning", "weight": 1.0,
             "value_source": "confidence"},
            {"type": "context", "name": "long", "weight": 0.001, "value_source": "raw"},
        ]},
        {"name": "escalate", "method": "weighted_sum", "inputs": [
            {"type": "projection", "name": "difficulty", "weight": 2.0},
        ]},
    ],
    "mappings": [
        {"name": "bands", "source": "difficulty", "method": "threshold_bands", "outputs": [
            {"name": "low", "lt": 0.5}, {"name": "mid", "gte": 0.5, "lt": 1.0},
            {"name": "high", "gte": 1.0},
        ]},
        {"name": "multi", "source": "escalate", "method": "multi_emit",
         "calibration": {"method": "sigmoid_distance", "slope": 4}, "outputs": [
            {"name": "above_one", "gt": 1.0}, {"name": "above_two", "gt": 2.0},
        ]},
    ],
}  # fmt: skip


def test_scores_and_bands() -> None:
    rt = routing(PROJECTIONS)
    results: Results = {
        ("keyword", "hard_words"): SignalResult(True, 1.0),
        ("keyword", "easy_words"): SignalResult(False, 0.0),
        ("embedding", "reasoning"): SignalResult(True, 0.4, 0.4),
        ("context", "long"): SignalResult(False, 0.0, 200.0),
    }
    scores = apply_projections(rt, results)
    # 0.5 * 1 + -0.5 * 0 + 1.0 * 0.4 + 0.001 * 200
    assert scores["difficulty"] == pytest.approx(1.1)
    assert scores["escalate"] == pytest.approx(2.2)
    assert {k[1] for k, r in results.items() if k[0] == "projection" and r.matched} == {
        "high",
        "above_one",
        "above_two",
    }
    # confidence 1 / (1 + e^(-slope * distance to the nearest bound))
    assert results[("projection", "high")].confidence == pytest.approx(
        1.0 / (1.0 + math.exp(-12 * 0.1))
    )
    assert results[("projection", "above_two")].confidence == pytest.approx(
        1.0 / (1.0 + math.exp(-4 * 0.2))
    )
    assert not results[("projection", "low")].matched


def test_a_plan_orders_scores_by_dependency_once_and_serves_every_chat() -> None:
    """The scores listed after those reading them still go first (the plan's order is worked
    out once, from the config), and one plan gives each chat its own values."""
    chained = {
        "scores": [
            {"name": "top", "method": "weighted_sum", "inputs": [
                {"type": "projection", "name": "middle", "weight": 10.0}]},
            {"name": "middle", "method": "weighted_sum", "inputs": [
                {"type": "projection", "name": "base", "weight": 2.0}]},
            {"name": "base", "method": "weighted_sum", "inputs": [
                {"type": "keyword", "name": "k", "weight": 1.0}]},
        ],
        "mappings": [{"name": "m", "source": "top", "method": "multi_emit",
                      "outputs": [{"name": "big", "gte": 15.0}]}],
    }  # fmt: skip
    plan = ProjectionPlan(routing(chained))
    assert [score.name for score, _, _ in plan.steps] == ["base", "middle", "top"]
    hit: Results = {("keyword", "k"): SignalResult(True, 1.0)}
    assert plan.apply(hit) == {"base": 1.0, "middle": 2.0, "top": 20.0}
    assert hit[("projection", "big")].matched
    miss: Results = {("keyword", "k"): SignalResult(False, 0.0)}
    assert plan.apply(miss) == {"base": 0.0, "middle": 0.0, "top": 0.0}
    assert not miss[("projection", "big")].matched


def test_threshold_bands_emit_only_the_first_band() -> None:
    rt = routing(
        {"scores": [{"name": "s", "method": "weighted_sum",
                     "inputs": [{"type": "keyword", "name": "k", "weight": 1.0}]}],
         "mappings": [{"name": "m", "source": "s", "method": "threshold_bands",
                       "outputs": [{"name": "a", "gte": 0.5}, {"name": "b", "gte": 0.0}]}]},
    )  # fmt: skip
    results: Results = {("keyword", "k"): SignalResult(True, 1.0)}
    apply_projections(rt, results)
    assert results[("projection", "a")].matched and not results[("projection", "b")].matched


def test_a_referenced_projection_evaluates_its_inputs() -> None:
    rt = Routing.model_validate(
        {
            "signals": {
                "keywords": [
                    {"name": n, "keywords": [n]} for n in ("hard_words", "easy_words", "unused")
                ]
            },
            "projections": PROJECTIONS,
            "decisions": [{"name": "d", "rules": {"type": "projection", "name": "above_two"}}],
        }
    )
    plan = QuestionPlan(rt, "primary")
    # above_two <- escalate <- difficulty's projection outputs <- their inputs
    assert {("keyword", "hard_words"), ("keyword", "easy_words")} <= plan.referenced
    assert ("keyword", "unused") not in plan.referenced
    assert set(plan.keywords) == {"hard_words", "easy_words"}
