"""v0.4's catalog-side routing fields: candidate_requirements (the filter's rules), data_policy,
model_bindings, the top-level evaluation records and the new modelCard fields, on upstream's
own fragments (mom-v1 v0.4's recipes)."""

from __future__ import annotations

from pathlib import Path

import yaml

from vllm_sr.config.routing import ModelCard, Routing
from vllm_sr.config.routing_catalog import CandidateRequirements
from vllm_sr.config.routing_plugins import decision_plugins, replay_allowed
from vllm_sr.config.schema import RootConfig
from vllm_sr.router.request_view import RequestView
from vllm_sr.router.selection.candidates import CandidateFilter, admits, needs_of

MOM_V04 = Path(__file__).resolve().parents[1] / "fixtures/upstream/v0.4/mom-v1/config.yaml"
BOTH = CandidateRequirements(capabilities="declared", context="known_limits")


def view(body: dict[str, object]) -> RequestView:
    return RequestView.from_chat(body, {})


def user(content: object) -> dict[str, object]:
    return {"role": "user", "content": content}


def test_mom_v1_v04_recipe_fields_are_read() -> None:
    raw = yaml.safe_load(MOM_V04.read_text(encoding="utf-8"))
    vault = next(r for r in raw["recipes"] if r["name"] == "vault")["routing"]
    keys = ("candidate_requirements", "data_policy", "model_bindings")
    rt = Routing.model_validate({k: vault[k] for k in keys})
    assert rt.candidate_requirements == BOTH
    assert rt.data_policy is not None and rt.data_policy.replay is True and replay_allowed(rt)
    binding = rt.model_bindings["classifier.content-risk"]
    assert binding.deployment == "hazard" and binding.operating_point is not None
    assert not replay_allowed(Routing.model_validate({"data_policy": {"replay": False}}))


def test_data_policy_replay_false_turns_a_decisions_replay_off() -> None:
    plugins = [{"type": "router_replay", "configuration": {"enabled": True}}]
    assert decision_plugins(plugins).router_replay.enabled is True  # type: ignore[union-attr]
    off = decision_plugins(plugins, replay_allowed=False).router_replay
    assert off is not None and off.enabled is False
    # a decision without the plugin is off too (the global default does not apply)
    assert decision_plugins([], replay_allowed=False).router_replay.enabled is False  # type: ignore[union-attr]


def test_known_limits_drop_a_card_whose_window_or_output_is_too_small() -> None:
    small = ModelCard(name="s", context_window_size=100, max_output_tokens=50)
    unknown = ModelCard(name="u")
    long = view({"messages": [user("word " * 200)]})
    assert needs_of(long).tokens > 100
    assert not admits(small, BOTH, needs_of(long)) and admits(unknown, BOTH, needs_of(long))
    short = view({"messages": [user("hi")], "max_tokens": 80})
    assert not admits(small, BOTH, needs_of(short))  # asks more output than it writes
    assert admits(small, BOTH, needs_of(view({"messages": [user("hi")], "max_tokens": 20})))
    assert admits(small, CandidateRequirements(), needs_of(long))  # no requirement: no filter


def test_declared_capabilities_must_cover_tools_images_and_audio() -> None:
    coder = ModelCard(name="c", capabilities=["coding", "tool_use"])
    seer = ModelCard.model_validate({"name": "v", "modalities": {"input": ["text", "image"]}})
    silent = ModelCard(name="x")
    tools = needs_of(view({"messages": [user("x")], "tools": [{"type": "function"}]}))
    image = needs_of(view({"messages": [user([{"type": "image_url", "image_url": {"url": "u"}}])]}))
    audio = needs_of(view({"messages": [user([{"type": "input_audio", "input_audio": {}}])]}))
    assert tools.tools and image.vision and audio.audio
    assert admits(coder, BOTH, tools) and not admits(seer, BOTH, tools)
    assert admits(seer, BOTH, image) and not admits(coder, BOTH, image)
    assert not admits(coder, BOTH, audio) and not admits(seer, BOTH, audio)
    assert all(admits(silent, BOTH, n) for n in (tools, image, audio))  # nothing declared


def test_the_filter_narrows_health_and_leaves_unknown_models_alone() -> None:
    rt = Routing.model_validate(
        {"candidate_requirements": {"context": "known_limits"},
         "modelCards": [{"name": "s", "context_window_size": 10}]}
    )  # fmt: skip
    f = CandidateFilter.of(rt)
    usable = f.admit(f.needs(view({"messages": [user("word " * 50)]})), lambda m: True)
    assert not usable("s") and usable("other")
    down = f.admit(f.needs(view({"messages": [user("hi")]})), lambda m: m != "s")
    assert not down("s")
    none = CandidateFilter.of(Routing())
    assert none.needs(view({})) is None and none.admit(None, bool) is bool


def test_operator_rating_records_give_cards_their_quality() -> None:
    raw = {
        "version": "v0.3",
        "providers": {"defaults": {"model": "a"}, "models": [
            {"name": n, "backend_refs": [{"endpoint": "127.0.0.1:9"}]} for n in ("a", "b")]},
        "routing": {"modelCards": [
            {"name": "a", "display_name": "A", "publisher": "p", "family": "f", "revision": "r",
             "released_at": "2026-01-01", "knowledge_cutoff": "2025-06", "lifecycle": "stable",
             "presentation": {"monogram": "A"}, "distribution": {"type": "open_weights"},
             "max_output_tokens": 4096, "modalities": {"input": ["text"], "output": ["text"]}},
            {"name": "b", "quality_score": 0.4}]},
        "evaluation": {"records": [
            {"model": "a", "benchmark": "vllm-sr/operator-rating@1.0.0", "metrics": {"score": 0.9}},
            {"model": "b", "benchmark": "vllm-sr/operator-rating@1.0.0", "metrics": {"score": 0.1}},
            {"model": "a", "benchmark": "mmlu", "metrics": {"accuracy": 0.7}}]},
    }  # fmt: skip
    cfg = RootConfig.model_validate(raw)
    assert cfg.routing is not None
    cards = {c.name: c for c in cfg.routing.model_cards}
    assert cards["a"].quality == 0.9  # from the record
    assert cards["b"].quality == 0.4  # the card's own quality_score wins
