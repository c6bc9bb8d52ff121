"""v0.4's signal fields, each acted on, accepted as metadata or refused by name: complexity's
boundary pairs (``hard_above``/``easy_below``, ``hard_below``/``easy_above``, upstream's
``EffectiveBoundaries``) and per-rule ``prototype_scoring``; the embedding fields vllm-sr
refuses. Fragments are upstream's own where the released mom-v1 has them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_rules import check_routing, routing_local_problems
from vllm_sr.config.signal_embedded import ComplexitySignal
from vllm_sr.router.deterministic import DeterministicSignals
from vllm_sr.router.request_view import RequestView
from vllm_sr.router.signals_embedded import EmbeddedFamilies

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


# -- input_modality (no model) and the new conversation sources ------------------------------

INPUT_MODALITY = [  # upstream's tutorial fragment (input-modality.md), plus text
    {"name": "image_input", "description": "Request contains an image.", "modality": "image"},
    {"name": "audio_input", "description": "Request contains audio.", "modality": "audio"},
    {"name": "text_input", "modality": "text"},
]
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
AUDIO = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}


def _signals(view: RequestView, routing: Routing) -> dict[str, bool]:
    report = DeterministicSignals(routing.signals).report(view)
    return {name: res.matched for (kind, name), res in report.results.items()}


@pytest.mark.parametrize(
    ("content", "system", "want"),
    [
        ("describe this", None, {"text_input"}),
        ([{"type": "text", "text": "what is it?"}, IMAGE], None, {"text_input", "image_input"}),
        ([IMAGE], None, {"image_input"}),
        ([AUDIO, {"type": "text", "text": ""}], None, {"audio_input"}),
        # a system prompt or assistant history never counts
        ("", [IMAGE], set()),
    ],
)
def test_input_modality_reads_the_user_messages_content_parts(
    content: Any, system: Any, want: set[str]
) -> None:
    rt = Routing.model_validate({"signals": {"input_modality": INPUT_MODALITY}})
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": content})
    view = RequestView.from_chat({"messages": messages}, {})
    got = _signals(view, rt)
    assert {n for n, hit in got.items() if hit} == want
    assert set(got) == {"image_input", "audio_input", "text_input"}


def test_the_preview_reads_video_and_audio_url_parts_too() -> None:
    rt = Routing.model_validate(
        {"signals": {"input_modality": [*INPUT_MODALITY, {"name": "v", "modality": "video"}]}}
    )
    payload = {
        "messages": [
            {"role": "user", "content": [{"type": "video_url", "video_url": {"url": "x"}}]},
            {"role": "user", "content": [{"type": "audio_url", "audio_url": {"url": "y"}}]},
        ]
    }
    got = _signals(RequestView.from_eval(payload), rt)
    assert {n for n, hit in got.items() if hit} == {"v", "audio_input"}
    # a chat's video part is not one upstream's chat decoder accepts
    chat = RequestView.from_chat({"messages": payload["messages"]}, {})
    assert {n for n, hit in _signals(chat, rt).items() if hit} == set()
    assert _signals(RequestView.from_eval({"text": "hi"}), rt)["text_input"]


def test_input_modality_names_are_checked_like_other_families() -> None:
    with pytest.raises(ValidationError, match="modality"):
        Routing.model_validate({"signals": {"input_modality": [{"name": "x", "modality": "3d"}]}})
    with pytest.raises(ValidationError, match="surrounding spaces"):
        Routing.model_validate(
            {"signals": {"input_modality": [{"name": " x", "modality": "text"}]}}
        )
    problems = routing_local_problems(
        {"signals": {"input_modality": INPUT_MODALITY},
         "decisions": [{"name": "d", "rules": {"type": "input_modality", "name": "video_input"}}]}
    )  # fmt: skip
    assert problems == []  # the name check runs with providers (check_routing)

    problems = check_routing(
        {"defaults": {"default_model": "m"}, "models": [{"name": "m"}]},
        {"signals": {"input_modality": INPUT_MODALITY},
         "decisions": [{"name": "d", "rules": {"type": "input_modality", "name": "video_input"}}]},
        set(),
        "",
    )  # fmt: skip
    leaf = [p for p in problems if p.path[0] == "routing"]
    assert [p.path for p in leaf] == [("routing", "decisions", 0, "rules", "name")]
    assert "routing.signals.input_modality" in leaf[0].message


def test_mom_v1s_new_conversation_sources() -> None:
    conversation = [
        *mom_v1_signals("conversation"),
        *[
            c
            for c in yaml.safe_load(MOM_V1.read_text(encoding="utf-8"))["recipes"][3]["routing"][
                "signals"
            ]["conversation"]
            if c["feature"]["source"]["type"] == "flow_tool_state"
        ],
        {
            "name": "tool_disabled",
            "feature": {"type": "exists", "source": {"type": "tool_choice_none"}},
        },
    ]
    rt = Routing.model_validate({"signals": {"conversation": conversation}})
    tools = [{"type": "function", "function": {"name": "lookup_status"}}]
    user = [{"role": "user", "content": "Return the current service state."}]
    named = {"type": "function", "function": {"name": "lookup_status"}}
    cases = [(named, {"tool_required"}), ("required", {"tool_required"}),
             ("none", {"tool_disabled"}), ("auto", set()), (None, set())]  # fmt: skip
    for choice, want in cases:
        body: dict[str, Any] = {"messages": user, "tools": tools}
        if choice is not None:
            body["tool_choice"] = choice
        for view in (RequestView.from_chat(body, {}), RequestView.from_eval(body)):
            got = _signals(view, rt)
            hits = {n for n in ("tool_required", "tool_disabled", "flow") if got[n]}
            assert hits == want, (choice, view)


def test_a_complexity_rules_own_prototype_scoring_replaces_the_modules() -> None:
    rules = [
        {"name": "own", "hard_above": 0.1, "easy_below": -0.1,
         "hard": {"candidates": ["h"]}, "easy": {"candidates": ["e"]},
         "prototype_scoring": {"enabled": False, "best_weight": 0.5, "top_m": 3}},
        {"name": "module", "threshold": 0.1,
         "hard": {"candidates": ["h"]}, "easy": {"candidates": ["e"]}},
    ]  # fmt: skip
    rt = Routing.model_validate({"signals": {"complexity": rules}})
    module = SimpleNamespace(
        complexity=SimpleNamespace(prototype_scoring=SimpleNamespace(top_m=5)), classifier=None
    )
    referenced = {("complexity", "own:hard"), ("complexity", "module:hard")}
    families = EmbeddedFamilies(rt.signals, referenced, modules=module)
    own = families.banks.specs["complexity:own:hard"][1]
    shared = families.banks.specs["complexity:module:easy"][1]
    assert own is not None and (own.enabled, own.best_weight, own.top_m) == (False, 0.5, 3)
    assert shared is not None and (shared.enabled, shared.top_m) == (True, 5)
