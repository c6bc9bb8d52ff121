"""Reasoning mode (vllm_sr/router/reasoning.py): every row of upstream's table (ROUTER-REFERENCE
§6, from req_filter_reason.go and req_filter_provider_dialect.go), the effort lookup, and the
caller's body left as it was."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from vllm_sr.config.routing import ModelRef
from vllm_sr.config.routing_providers import BackendRef, ProviderDefaults, ProviderModel
from vllm_sr.router.reasoning import (
    apply_reasoning,
    dialect_of,
    effort_for,
    primary_ref,
    reasoning_enabled,
)

FAMILIES = {
    "qwen3": {"type": "chat_template_kwargs", "parameter": "enable_thinking"},
    "deepseek": {"type": "chat_template_kwargs", "parameter": "thinking"},
    "gpt-oss": {"type": "reasoning_effort", "parameter": "reasoning_effort"},
    "o-series": {"type": "top_level_reasoning_effort", "parameter": "reasoning_effort"},
}
LOCAL = BackendRef(endpoint="127.0.0.1:8000")
OPENAI = BackendRef(provider="openai", base_url="https://api.openai.com/v1")
OPENROUTER = BackendRef(provider="openai", base_url="https://openrouter.ai/api/v1")
DEEPSEEK = BackendRef(provider="openai", base_url="https://api.deepseek.com")
OTHER_OPENAI = BackendRef(provider="openai", base_url="https://llm.example.com/v1")
BODY: dict[str, Any] = {
    "model": "vllm-sr/auto",
    "messages": [{"role": "user", "content": "think hard"}],
    "temperature": 0.2,
}


def defaults(effort: str | None = None) -> ProviderDefaults:
    return ProviderDefaults.model_validate(
        {"default_model": "m", "default_reasoning_effort": effort, "reasoning_families": FAMILIES}
    )


def model(family: str | None, **extra: Any) -> ProviderModel:
    return ProviderModel.model_validate(
        {"name": "m", "reasoning_family": family, "backend_refs": [{"endpoint": "h:1"}], **extra}
    )


def ref(on: bool | None, effort: str | None = None, name: str = "m", **extra: Any) -> ModelRef:
    """A decision's modelRef; ``on`` None leaves use_reasoning unset."""
    fields = {"model": name, "use_reasoning": on, "reasoning_effort": effort, **extra}
    return ModelRef.model_validate({k: v for k, v in fields.items() if v is not None})


def shaped(
    family: str | None,
    on: bool | None,
    backend: BackendRef = LOCAL,
    body: dict[str, Any] | None = None,
    effort: str | None = None,
    default_effort: str | None = None,
) -> dict[str, Any]:
    return apply_reasoning(
        BODY if body is None else body,
        ref(on, effort),
        model(family),
        defaults(default_effort),
        backend,
    )


def extra(out: dict[str, Any], body: dict[str, Any] = BODY) -> dict[str, Any]:
    """What the shaped body has beyond (or instead of) the caller's fields."""
    return {k: v for k, v in out.items() if body.get(k, object()) != v}


# -- no family ----------------------------------------------------------------------------------


@pytest.mark.parametrize("on", [True, False])
def test_no_family_adds_nothing_and_the_clients_effort_stays_removed(on: bool) -> None:
    body = {**BODY, "reasoning_effort": "high", "chat_template_kwargs": {"x": 1}}
    out = shaped(None, on, body=body)
    assert out == {k: v for k, v in body.items() if k != "reasoning_effort"}


def test_an_undeclared_family_counts_as_none() -> None:
    m = ProviderModel.model_construct(
        name="m", reasoning_family="nope", provider_model_id=None, external_model_ids=None
    )
    assert apply_reasoning(BODY, ref(True), m, defaults(), LOCAL) == BODY


# -- chat_template_kwargs -----------------------------------------------------------------------


def test_chat_template_kwargs_on_and_off_set_the_parameter_keeping_other_kwargs() -> None:
    body = {**BODY, "chat_template_kwargs": {"add_generation_prompt": True}}
    on = shaped("qwen3", True, body=body)
    off = shaped("qwen3", False, body=body)
    assert on["chat_template_kwargs"] == {"add_generation_prompt": True, "enable_thinking": True}
    assert off["chat_template_kwargs"] == {"add_generation_prompt": True, "enable_thinking": False}
    assert "reasoning_effort" not in on and "reasoning_effort" not in off


def test_chat_template_kwargs_ignores_the_dialect_and_a_non_object_kwargs_is_replaced() -> None:
    out = shaped("qwen3", True, backend=OPENAI, body={**BODY, "chat_template_kwargs": "junk"})
    assert extra(out) == {"chat_template_kwargs": {"enable_thinking": True}}


def test_use_reasoning_unset_is_off() -> None:
    assert reasoning_enabled(ref(None)) is False and reasoning_enabled(None) is False
    assert shaped("qwen3", None)["chat_template_kwargs"] == {"enable_thinking": False}


# -- reasoning_effort ---------------------------------------------------------------------------


def test_reasoning_effort_on_a_local_backend_goes_into_chat_template_kwargs() -> None:
    out = shaped("gpt-oss", True, effort="high", body={**BODY, "reasoning_effort": "low"})
    assert extra(out) == {"chat_template_kwargs": {"reasoning_effort": "high"}}
    assert "reasoning_effort" not in out


@pytest.mark.parametrize("sent, expected", [("high", "high"), (None, "low")])
def test_reasoning_effort_off_locally_passes_the_clients_effort_or_low(
    sent: str | None, expected: str
) -> None:
    body = BODY if sent is None else {**BODY, "reasoning_effort": sent}
    out = shaped("gpt-oss", False, effort="minimal", body=body)
    assert out["chat_template_kwargs"] == {"reasoning_effort": expected}
    assert "reasoning_effort" not in out


@pytest.mark.parametrize("backend", [OPENAI, OPENROUTER])
def test_reasoning_effort_on_at_openai_or_openrouter_is_a_top_level_field(
    backend: BackendRef,
) -> None:
    out = shaped("gpt-oss", True, backend=backend, effort="high")
    assert extra(out) == {"reasoning_effort": "high"}


@pytest.mark.parametrize("backend", [OPENAI, OPENROUTER])
def test_reasoning_effort_off_at_openai_restores_only_a_sent_effort(backend: BackendRef) -> None:
    assert shaped("gpt-oss", False, backend=backend) == BODY
    sent = {**BODY, "reasoning_effort": "minimal"}
    assert shaped("gpt-oss", False, backend=backend, body=sent) == sent


def test_an_openai_provider_elsewhere_is_vllm_style() -> None:
    out = shaped("gpt-oss", True, backend=OTHER_OPENAI, effort="high")
    assert extra(out) == {"chat_template_kwargs": {"reasoning_effort": "high"}}
    # A known host without provider: openai is not a provider profile of type openai either.
    plain = BackendRef(base_url="https://api.openai.com/v1")
    assert dialect_of(plain).kind == "vllm" and dialect_of(OTHER_OPENAI).kind == "generic"


# -- top_level_reasoning_effort -----------------------------------------------------------------


def test_top_level_on_sets_the_field_and_removes_it_from_kwargs() -> None:
    body = {**BODY, "chat_template_kwargs": {"reasoning_effort": "low", "keep": 1}}
    out = shaped("o-series", True, body=body, effort="high")
    assert out["reasoning_effort"] == "high" and out["chat_template_kwargs"] == {"keep": 1}
    alone = shaped("o-series", True, body={**BODY, "chat_template_kwargs": {"reasoning_effort": 1}})
    assert "chat_template_kwargs" not in alone  # emptied by the removal: dropped


def test_top_level_off_restores_only_a_sent_effort() -> None:
    assert shaped("o-series", False) == BODY
    sent = {**BODY, "reasoning_effort": "minimal"}
    assert shaped("o-series", False, body=sent) == sent


def test_top_level_leaves_other_kwargs_untouched_when_the_parameter_is_absent() -> None:
    body = {**BODY, "chat_template_kwargs": {"keep": 1}}
    assert shaped("o-series", True, body=body)["chat_template_kwargs"] == {"keep": 1}


# -- DeepSeek's official API --------------------------------------------------------------------


@pytest.mark.parametrize("family", ["qwen3", "gpt-oss", "o-series"])
def test_deepseek_switches_thinking_whatever_the_family(family: str) -> None:
    body = {**BODY, "chat_template_kwargs": {"x": 1}, "reasoning_effort": "low"}
    on = shaped(family, True, backend=DEEPSEEK, body=body, effort="high")
    off = shaped(family, False, backend=DEEPSEEK, body=body, effort="high")
    assert extra(on, BODY) == {"thinking": {"type": "enabled"}, "reasoning_effort": "high"}
    assert "chat_template_kwargs" not in on
    assert extra(off, BODY) == {"thinking": {"type": "disabled"}}
    assert "chat_template_kwargs" not in off and "reasoning_effort" not in off


def test_deepseek_without_a_family_is_untouched() -> None:
    assert shaped(None, True, backend=DEEPSEEK) == BODY


# -- the effort ---------------------------------------------------------------------------------


def test_effort_falls_back_to_the_default_then_medium() -> None:
    assert shaped("gpt-oss", True, effort="high", default_effort="low")["chat_template_kwargs"] == {
        "reasoning_effort": "high"
    }
    assert shaped("gpt-oss", True, default_effort="low")["chat_template_kwargs"] == {
        "reasoning_effort": "low"
    }
    assert shaped("gpt-oss", True)["chat_template_kwargs"] == {"reasoning_effort": "medium"}


def test_the_first_decision_ref_naming_the_model_decides_even_with_no_effort() -> None:
    m = model("gpt-oss", provider_model_id="openai/gpt-oss-20b")
    chosen = ref(True, "high")
    first = ref(False, None)
    out = apply_reasoning(BODY, chosen, m, defaults("low"), LOCAL, decision_refs=[first, chosen])
    assert out["chat_template_kwargs"] == {"reasoning_effort": "low"}
    by_id = ref(False, "minimal", name="openai/gpt-oss-20b")  # names the model by its id
    assert effort_for([by_id, chosen], "m", m, defaults()) == "minimal"
    other = ref(False, "minimal", name="elsewhere")
    assert effort_for([other, chosen], "m", m, defaults()) == "high"


def test_a_lora_ref_takes_the_default_effort_as_upstream() -> None:
    # The body goes upstream as the LoRA's name, which names no providers model: no modelRef
    # "matches" it by model, so its own effort is not used.
    lora = ref(True, "high", lora_name="math-lora")
    out = apply_reasoning(BODY, lora, model("gpt-oss"), defaults("low"), LOCAL)
    assert out["chat_template_kwargs"] == {"reasoning_effort": "low"}
    named = ref(True, "high", name="math-lora")  # a modelRef naming the LoRA itself
    assert effort_for([named], "math-lora", model("gpt-oss"), defaults("low")) == "high"


def test_no_model_ref_means_reasoning_off() -> None:
    out = apply_reasoning(BODY, None, model("qwen3"), defaults(), LOCAL)
    assert out["chat_template_kwargs"] == {"enable_thinking": False}


# -- the caller's body, and upstream's primary backend ------------------------------------------


def test_the_callers_body_is_not_changed() -> None:
    body = {**BODY, "chat_template_kwargs": {"keep": 1}, "reasoning_effort": "low"}
    before = copy.deepcopy(body)
    for fam in FAMILIES:
        for backend in (LOCAL, OPENAI, DEEPSEEK):
            for on in (True, False):
                shaped(fam, on, backend=backend, body=body)
    assert body == before


def test_primary_ref_is_the_heaviest_first_on_ties_with_zero_as_one() -> None:
    a, b, c = (BackendRef(endpoint=f"h:{i}", weight=w) for i, w in ((1, 0), (2, 1), (3, 3)))
    assert primary_ref([a, b]) is a and primary_ref([a, b, c]) is c and primary_ref([]) is None
