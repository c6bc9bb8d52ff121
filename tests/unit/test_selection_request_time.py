"""The router_dc, automix, hybrid and prompt selectors on upstream's own fragments
(tests/fixtures/upstream/fragments/algorithm/selection/), their settings' merge with
``global.router.model_selection`` as upstream's request path does it, their bad input, and
the refusal of the trained selectors."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy
import pytest
import yaml

from vllm_sr.config.problems import format_path
from vllm_sr.config.routing import ModelRef, Routing
from vllm_sr.config.routing_rules import routing_local_problems, routing_problems
from vllm_sr.config.routing_selection import (
    AutoMixSettings,
    HybridSettings,
    RouterDCSettings,
    parse_settings,
)
from vllm_sr.config.selection_prompt import PromptSettings, prompt_problems
from vllm_sr.config.upstream_learning import AutoMix, Hybrid, ModelSelection
from vllm_sr.config.upstream_learning import RouterDC as GlobalRouterDC
from vllm_sr.router.selection import prompt
from vllm_sr.router.selection.automix import AutoMixConfig, automix, cost_weight
from vllm_sr.router.selection.decide import DecisionSelection, SelectionServices
from vllm_sr.router.selection.hybrid import HybridConfig, hybrid, selection_cost_weight
from vllm_sr.router.selection.router_dc import RouterDCConfig, description_text, router_dc

FRAGMENTS = Path(__file__).parents[1] / "fixtures/upstream/fragments/algorithm/selection"


def fragment(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((FRAGMENTS / name).read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def block(name: str, kind: str) -> Any:
    return parse_settings(kind, fragment(name)["algorithm"][kind])


@dataclass
class Facts:
    qualities: dict[str, float] = field(default_factory=dict)
    prices: dict[str, float] = field(default_factory=dict)

    def tpot(self, model: str, percentile: int) -> float | None:
        return None

    def ttft(self, model: str, percentile: int) -> float | None:
        return None

    def inflight(self, model: str) -> int:
        return 0

    def prompt_price(self, model: str) -> float | None:
        return self.prices.get(model)

    def quality(self, model: str) -> float | None:
        return self.qualities.get(model)


A, B, C = ModelRef(model="a"), ModelRef(model="b"), ModelRef(model="c")


# -- automix -----------------------------------------------------------------------------------


def test_automix_fragment_gives_only_the_cost_weight_and_quality_wins_by_default() -> None:
    settings = block("automix.yaml", "automix")
    assert isinstance(settings, AutoMixSettings)
    assert settings.verification_threshold == 0.78 and settings.cost_aware_routing is True
    # upstream reads only cost_quality_tradeoff of the decision's block (absent here: 0.5)
    assert cost_weight(settings) == 0.5
    assert cost_weight(AutoMixSettings(cost_quality_tradeoff=0.3)) == 0.3
    # no global automix: upstream's zero config, quality only; a missing or out-of-range
    # quality_score counts as 0.8
    config = AutoMixConfig.of(None)
    assert not config.cost_aware_routing
    facts = Facts(qualities={"a": 0.7, "b": 0.85, "c": 3.0}, prices={"b": 10.0})
    picked = automix([A, B, C], config, 0.5, facts)
    assert (picked.ref.model, picked.method) == ("b", "automix")
    assert picked.scores == {"a": 0.7, "b": 0.85, "c": 0.8}
    # ties: the cheaper first (a and c unpriced, before b), then modelRef order
    tie = automix([B, C, A], config, 0.5, Facts(prices={"b": 1.0}))
    assert tie.ref.model == "c"


def test_automix_cost_aware_trades_quality_for_price() -> None:
    facts = Facts(qualities={"a": 0.9, "b": 0.8}, prices={"a": 10.0, "b": 1.0})
    config = AutoMixConfig.of(
        AutoMix(cost_aware_routing=True, cost_quality_tradeoff=0.5, verification_threshold=0.8)
    )
    picked = automix([A, B], config, 0.5, facts)
    # values: a = 0.9 - 10/10 x 0.5 = 0.4, b = 0.8 - 1/10 x 0.5 = 0.75
    assert picked.scores == pytest.approx({"a": 0.4, "b": 0.75})
    assert picked.ref.model == "b"
    assert "cost-aware" in picked.reason
    # without cost awareness the better model wins whatever its price
    assert automix([A, B], AutoMixConfig.of(AutoMix()), 0.5, facts).ref.model == "a"


# -- router_dc ---------------------------------------------------------------------------------


def test_router_dc_config_merges_the_first_block_over_the_global_settings() -> None:
    settings = block("router-dc.yaml", "router_dc")
    assert isinstance(settings, RouterDCSettings)
    config = RouterDCConfig.of(None, settings)
    # temperature from the block; min_similarity is the global one (0.3 by default), and
    # use_capabilities is the block's as written (absent: false), as upstream builds it
    assert config == RouterDCConfig(
        temperature=0.2, min_similarity=0.3, require_descriptions=False, use_capabilities=False
    )
    glob = GlobalRouterDC(temperature=0.5, min_similarity=0.9, use_capabilities=True)
    assert RouterDCConfig.of(glob, None) == RouterDCConfig(0.5, 0.9, False, True)
    assert RouterDCConfig.of(glob, RouterDCSettings()).temperature == 0.5


def test_router_dc_description_texts() -> None:
    routing = Routing.model_validate(
        {
            "modelCards": [
                {"name": "m", "description": "Math expert", "capabilities": ["math", "proofs"]},
                {"name": "c", "capabilities": ["code"]},
                {"name": "e"},
            ]
        }
    )
    m, c, e = routing.model_cards
    assert description_text("m", m, True) == "Math expert. Capabilities: math, proofs"
    assert description_text("m", m, False) == "Math expert"
    assert description_text("c", c, True) == "Capabilities: code"
    assert description_text("c", c, False) == "Model: c. Capabilities: code"
    assert description_text("e", e, True) == ""


def test_router_dc_scores_by_contrastive_similarity() -> None:
    config = RouterDCConfig(temperature=0.2, min_similarity=0.3)
    x = numpy.array([1.0, 0.0, 0.0], dtype=numpy.float32)
    y = numpy.array([0.0, 1.0, 0.0], dtype=numpy.float32)
    query = numpy.array([0.2, 1.0, 0.0], dtype=numpy.float32)
    picked = router_dc([A, B, C], config, query, {"a": x, "b": y})
    assert (picked.ref.model, picked.method) == ("b", "router_dc")
    assert picked.scores["b"] > picked.scores["a"] > picked.scores["c"]
    assert sum(picked.scores.values()) == pytest.approx(1.0)  # softmax
    # no query vector, or nobody reaching min_similarity: the first modelRef, scores 1/n
    none = router_dc([A, B], config, None, {"a": x, "b": y})
    assert none.ref.model == "a" and none.scores == {"a": 0.5, "b": 0.5}
    assert "default candidate selection" in none.reason
    strict = RouterDCConfig(temperature=0.2, min_similarity=0.999)  # b: 0.9926
    assert router_dc([A, B], strict, query, {"a": x, "b": y}).ref.model == "a"
    # a model without a vector cannot win even when listed first
    assert router_dc([C, A], config, x, {"a": x}).ref.model == "a"


# -- hybrid ------------------------------------------------------------------------------------


def test_hybrid_fragment_over_upstream_defaults() -> None:
    settings = block("hybrid.yaml", "hybrid")
    assert isinstance(settings, HybridSettings)
    config = HybridConfig.of(None, settings)
    assert config == HybridConfig(0.4, 0.4, 0.2, 0.1, 0.1, True)
    assert selection_cost_weight(settings) == 0.1
    assert selection_cost_weight(None) == 0.5
    glob = Hybrid(experience_weight=0.9, normalize_scores=False, quality_gap_threshold=0.5)
    merged = HybridConfig.of(glob, HybridSettings(router_dc_weight=0.7))
    assert (merged.experience_weight, merged.router_dc_weight) == (0.9, 0.7)
    assert (merged.normalize_scores, merged.quality_gap_threshold) == (False, 0.5)
    assert HybridConfig.of(glob, HybridSettings(normalize_scores=True)).normalize_scores


def test_hybrid_combines_normalised_components_then_the_cost_bonus() -> None:
    facts = Facts(prices={"a": 10.0, "b": 1.0})
    components = {
        "experience": {"a": 0.5, "b": 0.5},
        "router_dc": {"a": 0.5, "b": 0.5},
        "automix": {"a": 0.9, "b": 0.8},
    }
    config = HybridConfig(0.4, 0.4, 0.2, 0.1, 0.1, True)
    # normalised: experience and router_dc all 0.5, automix a=1 b=0
    # a = 0.4 x 0.5 + 0.4 x 0.5 + 0.2 x 1 = 0.6; b = 0.4; b's cost bonus x (1 + 0.1 x 0.1)
    picked = hybrid([A, B], config, 0.1, components, facts)
    assert picked.scores == pytest.approx({"a": 0.6, "b": 0.4 * 1.01})
    assert (picked.ref.model, picked.method) == ("a", "hybrid")
    # a heavy cost weight doubles the cheaper model's score: b wins
    heavy = HybridConfig(0.4, 0.4, 0.2, 1.0, 0.1, True)
    assert hybrid([A, B], heavy, 1.0, components, facts).ref.model == "b"
    # no component: every candidate alike, the first wins
    alike = hybrid([A, B], HybridConfig(0, 0, 0, 0, 0, True), 0.5, {}, facts)
    assert alike.ref.model == "a" and alike.scores == {"a": 0.5, "b": 0.5}


async def test_hybrid_and_router_dc_without_embeddings_take_the_first_and_eval_waits() -> None:
    routing = Routing.model_validate(
        {
            "modelCards": [{"name": "a", "quality_score": 0.2}, {"name": "b", "quality_score": 1}],
            "decisions": [
                {
                    "name": "h",
                    "modelRefs": [{"model": "a"}, {"model": "b"}],
                    **fragment("hybrid.yaml"),
                },
                {
                    "name": "dc",
                    "modelRefs": [{"model": "a"}, {"model": "b"}],
                    **fragment("router-dc.yaml"),
                },
                {
                    "name": "mix",
                    "modelRefs": [{"model": "a"}, {"model": "b"}],
                    **fragment("automix.yaml"),
                },
            ],
        }
    )
    facts = Facts(qualities={"a": 0.2, "b": 1.0})
    selection = DecisionSelection(routing, facts, SelectionServices(ModelSelection()))
    h, dc, mix = routing.decisions
    # hybrid: automix's quality decides (router_dc has no vectors here: its 1/n scores)
    choice = await selection.choose(h, "dflt", lambda m: True)
    assert (choice.model, choice.method) == ("b", "hybrid")
    choice = await selection.choose(dc, "dflt", lambda m: True)
    assert (choice.model, choice.method) == ("a", "router_dc")
    choice = await selection.choose(mix, "dflt", lambda m: True)
    assert (choice.model, choice.method) == ("b", "automix")
    assert (await selection.choose(mix, "dflt", lambda m: m != "b")).model == "a"
    for decision in (h, dc, mix):
        preview = selection.preview(decision)
        assert (preview.ref, preview.status) == (None, "execution_required")


# -- prompt ------------------------------------------------------------------------------------


def prompt_fragment() -> dict[str, Any]:
    return fragment("prompt.yaml")["routing"]["decisions"][0]


def test_prompt_helper_request_as_upstream_builds_it() -> None:
    decision = prompt_fragment()
    settings = parse_settings("prompt", decision["algorithm"]["prompt"])
    assert isinstance(settings, PromptSettings)
    assert (settings.model, settings.timeout_s) == ("qwen3-8b", 5.0)
    refs = [ModelRef.model_validate(r) for r in decision["modelRefs"]]
    system = prompt.system_prompt(settings.instructions, refs, {"qwen3-32b": "The big one."})
    assert system.startswith("Choose qwen3-8b for ordinary requests")
    assert "\n\nChoose exactly one candidate from this list:\n- qwen3-8b\n" in system
    assert "- qwen3-32b: The big one.\n" in system
    assert system.endswith(
        'Return only JSON: {"selected_model":"<exact candidate name>",'
        '"rationale":"<short reason>"}.'
    )
    body = prompt.helper_body(settings, system, "prove it")
    assert body["messages"] == [
        {"role": "system", "content": system},
        {"role": "user", "content": "prove it"},
    ]
    assert (body["temperature"], body["max_completion_tokens"]) == (0, 512)
    assert body["response_format"] == {"type": "json_object"}
    assert body["chat_template_kwargs"] == {"enable_thinking": False}  # a qwen helper
    other = PromptSettings(model="llama", instructions="x")
    assert "chat_template_kwargs" not in prompt.helper_body(other, system, "q")
    assert PromptSettings(model="m", instructions="x", timeout_seconds=0).timeout_s == 5.0


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ("not json", "selector_invalid_output"),
        ('{"selected_model": "a"}', "selector_invalid_output"),
        ('{"selected_model": "a", "rationale": "r", "extra": 1}', "selector_invalid_output"),
        ('{"selected_model": " ", "rationale": "r"}', "selector_invalid_output"),
        ('{"selected_model": 3, "rationale": "r"}', "selector_invalid_output"),
        ('{"selected_model": "z", "rationale": "r"}', "selector_undeclared_candidate"),
    ],
)
def test_prompt_refuses_what_upstream_refuses(reply: str, reason: str) -> None:
    with pytest.raises(prompt.PromptFailed) as err:
        model, rationale = prompt.parse_choice(reply)
        prompt.pick([A, B], model, rationale)
    assert err.value.reason == reason


def test_prompt_pick_and_answer_content() -> None:
    model, rationale = prompt.parse_choice(' {"selected_model": " b ", "rationale": "hard"} ')
    picked = prompt.pick([A, B], model, rationale)
    assert (picked.ref.model, picked.reason, picked.scores) == (
        "b",
        "prompt: hard",
        {"a": 0.0, "b": 1.0},
    )
    raw = json.dumps(
        {
            "choices": [{"message": {"content": "{}"}}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
        }
    ).encode()
    content, usage = prompt.answer_content(raw)
    assert content == "{}" and usage["total_tokens"] == 10
    with pytest.raises(prompt.PromptFailed, match="no content"):
        prompt.answer_content(b'{"choices": []}')


async def test_prompt_without_backends_falls_back_to_the_first() -> None:
    routing = Routing.model_validate({"decisions": [prompt_fragment()]})
    selection = DecisionSelection(routing, Facts())
    choice = await selection.choose(routing.decisions[0], "dflt", lambda m: True)
    assert (choice.model, choice.method) == ("qwen3-8b", "prompt")
    preview = selection.preview(routing.decisions[0])
    assert (preview.status, preview.method) == ("execution_required", "prompt")


# -- bad input ---------------------------------------------------------------------------------

BASE = "routing.decisions[0]"


def local_problems(algorithm: dict[str, Any]) -> dict[str, str]:
    decision = {"name": "d", "modelRefs": [{"model": "a"}, {"model": "b"}], "algorithm": algorithm}
    return {
        format_path(p.path): p.message for p in routing_local_problems({"decisions": [decision]})
    }


@pytest.mark.parametrize(
    ("algorithm", "path", "words"),
    [
        (
            {"type": "router_dc", "router_dc": {"temperature": -1}},
            "router_dc.temperature",
            ["-1", "a finite number >= 0"],
        ),
        (
            {"type": "router_dc", "router_dc": {"use_capabilities": "yes"}},
            "router_dc.use_capabilities",
            ["'yes'", "true or false"],
        ),
        (
            {"type": "router_dc", "router_dc": {"min_similarity": 1.5}},
            "router_dc.min_similarity",
            ["1.5", "from 0 to 1"],
        ),
        (
            {"type": "automix", "automix": {"max_escalations": 1.5}},
            "automix.max_escalations",
            ["1.5", "an integer >= 0"],
        ),
        (
            {"type": "automix", "automix": {"cost_quality_tradeoff": 2}},
            "automix.cost_quality_tradeoff",
            ["2", "from 0 to 1"],
        ),
        (
            {"type": "hybrid", "hybrid": {"cost_weight": "high"}},
            "hybrid.cost_weight",
            ["'high'", "a finite number >= 0"],
        ),
        (
            {"type": "hybrid", "hybrid": {"use_mlp": True}},
            "hybrid.use_mlp",
            ["unknown key 'use_mlp'", "experience_weight, router_dc_weight"],
        ),
        ({"type": "prompt"}, "prompt", ["without an algorithm.prompt block"]),
        (
            {"type": "prompt", "prompt": {"model": "a", "instructions": " "}},
            "prompt.instructions",
            ["' '", "a non-empty string"],
        ),
        (
            {
                "type": "prompt",
                "prompt": {"model": "a", "instructions": "x", "timeout_seconds": -1},
            },
            "prompt.timeout_seconds",
            ["-1", "an integer from 0 to 3600"],
        ),
        (
            {"type": "prompt", "on_error": "skip", "prompt": {"model": "a", "instructions": "x"}},
            "on_error",
            ["'skip'", "accepted: fallback"],
        ),
    ],
)
def test_bad_blocks_name_field_value_and_what_is_accepted(
    algorithm: dict[str, Any], path: str, words: list[str]
) -> None:
    found = local_problems(algorithm)
    key = f"{BASE}.algorithm.{path}"
    assert list(found) == [key], found
    for word in words:
        assert word in found[key]


def test_good_blocks_and_blockless_selectors_pass() -> None:
    for name in ("router-dc.yaml", "automix.yaml", "hybrid.yaml"):
        assert local_problems(fragment(name)["algorithm"]) == {}
    for kind in ("router_dc", "automix", "hybrid"):
        assert local_problems({"type": kind}) == {}  # settings from the global ones
    assert routing_local_problems({"decisions": [prompt_fragment()]}) == []


def prompt_providers() -> dict[str, Any]:
    return {
        "defaults": {"default_model": "qwen3-8b"},
        "models": [
            {"name": n, "backend_refs": [{"endpoint": "127.0.0.1:9"}]}
            for n in ("qwen3-8b", "qwen3-32b")
        ],
    }


def prompt_config(decision: dict[str, Any], endpoint: str | None = "http://l/v1") -> Any:
    raw: dict[str, Any] = {
        "providers": prompt_providers(),
        "routing": {"decisions": [decision]},
    }
    if endpoint is not None:
        raw["global"] = {"integrations": {"looper": {"endpoint": endpoint}}}
    return {format_path(p.path): p.message for p in routing_problems(raw)}


def test_prompt_decisions_against_the_rest_of_the_config() -> None:
    good = prompt_fragment()
    assert prompt_config(good) == {}
    found = prompt_config(good, endpoint="")
    assert "global.integrations.looper.endpoint" in found[f"{BASE}.algorithm.type"]
    one = {**good, "modelRefs": good["modelRefs"][:1]}
    assert "at least two" in prompt_config(one)[f"{BASE}.modelRefs"]
    twice = {**good, "modelRefs": [{"model": "qwen3-8b"}, {"model": "qwen3-8b"}]}
    assert "repeats an earlier modelRef" in prompt_config(twice)[f"{BASE}.modelRefs[1]"]
    same_lora = {
        **good,
        "modelRefs": [{"model": "qwen3-8b"}, {"model": "qwen3-32b", "lora_name": "qwen3-8b"}],
    }
    assert "identity 'qwen3-8b'" in prompt_config(same_lora)[f"{BASE}.modelRefs[1]"]
    unknown = {
        **good,
        "algorithm": {**good["algorithm"], "prompt": {"model": "judge", "instructions": "x"}},
    }
    message = prompt_config(unknown)[f"{BASE}.algorithm.prompt.model"]
    assert "'judge'" in message and "a providers.models name" in message
    image = {**good, "algorithm": {**good["algorithm"]}}
    image_cards = {"modelCards": [{"name": "qwen3-8b", "modality": "diffusion"}]}
    raw_routing = {"decisions": [image], **image_cards}
    found = {
        format_path(p.path): p.message
        for p in prompt_problems(raw_routing, prompt_providers(), "http://l/v1")
    }
    message = found[f"{BASE}.algorithm.prompt.model"]
    assert "modality 'diffusion'" in message and "a chat-capable text model" in message


@pytest.mark.parametrize("kind", ["knn", "kmeans", "svm", "mlp"])
def test_trained_selectors_are_refused_by_name_with_why(kind: str) -> None:
    (message,) = local_problems(fragment(f"{kind}.yaml")["algorithm"]).values()
    assert f"the algorithm {kind!r}" in message
    assert f"global.router.model_selection.ml.{kind}.pretrained_path" in message
    assert "four fixed models" in message and "not supported by vllm-sr" in message
