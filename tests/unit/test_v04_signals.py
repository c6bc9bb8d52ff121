"""v0.4's signal fields, each acted on, accepted as metadata or refused by name: complexity's
boundary pairs (``hard_above``/``easy_below``, ``hard_below``/``easy_above``, upstream's
``EffectiveBoundaries``) and per-rule ``prototype_scoring``; the embedding fields vllm-sr
refuses. Fragments are upstream's own where the released mom-v1 has them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_rules import routing_local_problems
from vllm_sr.config.signal_embedded import ComplexitySignal

MOM_V1 = Path(__file__).resolve().parents[1] / "fixtures/upstream/v0.4/mom-v1/config.yaml"


def mom_v1_signals(family: str) -> list[dict[str, Any]]:
    doc = yaml.safe_load(MOM_V1.read_text(encoding="utf-8"))
    return list(doc["recipes"][0]["routing"]["signals"][family])


def test_mom_v1s_complexity_rule_loads_with_its_boundary_pair() -> None:
    (raw,) = mom_v1_signals("complexity")
    assert (raw["hard_above"], raw["easy_below"]) == (0.025, -0.08)
    rule = ComplexitySignal.model_validate(raw)
    assert rule.boundaries() == (0.025, -0.08, True)
    assert rule.prototype_scoring is not None and rule.prototype_scoring.enabled is False
    # asymmetric: 0.03 is hard, -0.05 medium (the symmetric threshold would say easy at 0.03)
    assert [rule.level(m) for m in (0.03, 0.025, -0.05, -0.08, -0.09)] == [
        "hard",
        "medium",
        "medium",
        "medium",
        "easy",
    ]


def test_the_lower_is_harder_pair_and_the_symmetric_threshold() -> None:
    lower = ComplexitySignal(name="c", hard_below=-0.2, easy_above=0.1)
    assert [lower.level(m) for m in (-0.3, 0.0, 0.2)] == ["hard", "medium", "easy"]
    symmetric = ComplexitySignal(name="c", threshold=0.1)
    assert [symmetric.level(m) for m in (0.11, 0.1, -0.11)] == ["hard", "medium", "easy"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"hard_above": 0.1}, "half a boundary pair; accepted: both hard_above and easy_below"),
        ({"hard_above": 0.1, "easy_below": 0.2}, "overlapping bands: easy_below"),
        ({"hard_below": 0.3, "easy_above": 0.2}, "overlapping bands: hard_below"),
        ({"hard_above": 0.1, "easy_above": 0.2}, "one direction"),
        ({"threshold": 0.1, "hard_above": 0.2, "easy_below": 0.0}, "threshold 0.1 with"),
        ({"hard_above": float("inf"), "easy_below": 0.0}, "hard_above: inf is not finite"),
    ],
)
def test_boundary_pairs_upstream_refuses(fields: dict[str, float], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ComplexitySignal.model_validate({"name": "c", **fields})


def test_mom_v1s_embedding_rules_load_and_the_unsupported_fields_are_refused_by_name() -> None:
    embeddings = mom_v1_signals("embeddings")
    assert all(e["prototype_scoring"]["enabled"] is False for e in embeddings)
    Routing.model_validate({"signals": {"embeddings": embeddings}})  # loads unchanged
    base = {"name": "e", "threshold": 0.5, "candidates": ["x"]}
    cases = {
        "negative_candidates": ["counter-example"],
        "image_candidates": ["photo of a passport"],
        "negative_image_candidates": ["photo of a cat"],
        "prototype_scoring": {"top_m": 2},
    }
    for key, value in cases.items():
        problems = routing_local_problems({"signals": {"embeddings": [{**base, key: value}]}})
        paths = [p.path for p in problems]
        where = (*(("prototype_scoring", "enabled") if key == "prototype_scoring" else (key,)),)
        assert paths == [("routing", "signals", "embeddings", 0, *where)], key
        assert "not supported by vllm-sr" in problems[0].message
    with pytest.raises(ValidationError, match="not supported by vllm-sr"):
        Routing.model_validate(
            {"signals": {"embeddings": [{**base, "negative_candidates": ["no"]}]}}
        )
