"""The rest of v0.4's catalog surface: providers.models[].{reasoning, catalog}, deployments'
precision / external_model / provider, and the global and listener fields that are refused by
name (or accepted as metadata), each at its path."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from vllm_sr.config.deployment import Deployment
from vllm_sr.config.routing import ModelRef
from vllm_sr.config.routing_providers import BackendRef, ProviderDefaults, ProviderModel
from vllm_sr.config.schema import semantic_problems
from vllm_sr.router.reasoning import apply_reasoning

BODY: dict[str, object] = {"model": "vllm-sr/auto", "messages": [{"role": "user", "content": "q"}]}
LOCAL = BackendRef(endpoint="127.0.0.1:8000")


def model(**fields: object) -> ProviderModel:
    return ProviderModel.model_validate(
        {"name": "m", "backend_refs": [{"endpoint": "h:1"}], **fields}
    )


def found(raw: object) -> dict[str, str]:
    return {".".join(map(str, p.path)): p.message for p in semantic_problems(raw)}


def providers(**fields: object) -> dict[str, object]:
    return {
        "version": "v0.3",
        "providers": {
            "defaults": {
                "model": "m",
                "reasoning_families": {"qwen3": {"type": "chat_template_kwargs",
                                                 "parameter": "enable_thinking"}},
            },
            "models": [{"name": "m", "backend_refs": [{"endpoint": "h:1"}], **fields}],
        },
    }  # fmt: skip


def test_v04_reasoning_inline_or_by_family_switches_reasoning() -> None:
    on = ModelRef(model="m", use_reasoning=True)
    defaults = ProviderDefaults.model_validate(providers()["providers"]["defaults"])  # type: ignore[index]
    inline = model(reasoning={"type": "chat_template_kwargs", "parameter": "thinking"})
    out = apply_reasoning(BODY, on, inline, defaults, LOCAL)
    assert out["chat_template_kwargs"] == {"thinking": True}
    named = model(reasoning={"family": "qwen3"})
    out = apply_reasoning(BODY, on, named, defaults, LOCAL)
    assert out["chat_template_kwargs"] == {"enable_thinking": True}
    assert found(providers(reasoning={"family": "qwen3", "levels": ["low"]})) == {}


def test_v04_reasoning_refusals_and_catalog_are_named() -> None:
    got = found(providers(reasoning={"family": "nope"}))
    assert (
        "'nope' is not a providers.defaults.reasoning_families key"
        in got["providers.models.0.reasoning.family"]
    )
    got = found(
        providers(reasoning={"type": "reasoning_effort", "parameter": "effort",
                             "activation_parameter": "think", "effort_flags": {"low": "f"}})
    )  # fmt: skip
    assert "not supported by vllm-sr" in got["providers.models.0.reasoning.activation_parameter"]
    assert "not supported by vllm-sr" in got["providers.models.0.reasoning.effort_flags"]
    got = found(providers(reasoning={"type": "reasoning_mode", "parameter": "mode"}))
    assert "not supported by vllm-sr" in got["providers.models.0.reasoning.type"]
    got = found(providers(reasoning={"family": "qwen3"}, reasoning_family="qwen3"))
    assert "both set" in got["providers.models.0.reasoning"]
    got = found(providers(catalog="qwen3-8b"))
    assert "built-in model catalog entry 'qwen3-8b'" in got["providers.models.0.catalog"]


def test_deployment_precision_external_model_and_provider() -> None:
    assert Deployment.model_validate({"precision": "fp32"}).engine_args.dtype == "float32"
    assert Deployment.model_validate({"precision": "bf16"}).engine_args.dtype == "bfloat16"
    meta = Deployment.model_validate({"compilation_cache_dir": "/c", "custom_ops_profile": "x"})
    assert meta.engine_args.dtype == "auto"
    for bad, words in (
        ({"precision": "fp16", "engine_args": {"dtype": "float32"}}, "disagree"),
        ({"external_model": "guard"}, "external_model 'guard' is refused"),
        ({"provider": "candle", "precision": "fp32"}, "provider 'candle' is refused"),
    ):
        with pytest.raises(ValidationError, match=words):
            Deployment.model_validate(bad)


@pytest.mark.parametrize(
    ("where", "block", "path"),
    [
        ("model_catalog", {"admission": {"primary": {"max_queue": 4}}},
         "global.model_catalog.admission"),
        ("model_catalog", {"modules": {"complexity": {"backend": {"model": "c"}}}},
         "global.model_catalog.modules.complexity.backend"),
        ("router", {"learning": {"protection": {"tuning": {"progress_gate": {"enabled": True}}}}},
         "global.router.learning.protection.tuning.progress_gate"),
        ("services", {"observability": {"profiling": {"enabled": True, "port": 6060}}},
         "global.services.observability.profiling.enabled"),
        ("stores", {"response_cache": {"polarity_guard": {"mode": "enforce"}}},
         "global.stores.response_cache.polarity_guard.mode"),
    ],
)  # fmt: skip
def test_v04_global_settings_that_would_act_are_refused_by_name(
    where: str, block: dict[str, object], path: str
) -> None:
    raw = {"version": "v0.3", "global": {where: block}}
    got = found(raw)
    assert path in got and "not supported by vllm-sr" in got[path]


def test_listener_api_keys_are_refused_and_metadata_is_accepted() -> None:
    raw = {"version": "v0.3", "global": {}, "listeners": [{"port": 8801, "api_keys": ["k"]}]}
    assert "not supported by vllm-sr" in found(raw)["listeners.0.api_keys"]
    quiet = {
        "version": "v0.3",
        "listeners": [{"port": 8801, "api_keys": []}],
        "global": {
            "model_catalog": {
                "bindings": {"domain_classifier": {"deployment": "primary"}},
                "embeddings": {"semantic": {"embedding_config": {"full_context": True},
                                            "endpoint": {"max_response_bytes": 10}}},
                "external": [{"name": "x", "max_request_bytes": 1, "max_response_bytes": 2,
                              "reasoning": {"family": "f", "use_reasoning": False}}],
                "modules": {"safety": {"hazard": {"max_sequence_length": 512}}},
            },
            "services": {"api": {"embeddings": {"enabled": True},
                                 "routing_preview": {"request_timeout_seconds": 30}},
                         "observability": {"profiling": {"enabled": False}}},
            "stores": {"memory": {"persistence": {"queue": 8}},
                       "response_cache": {"polarity_guard": {"mode": "off"}}},
            "router": {"model_selection": {"ml": {"model_type": "knn"}}},
        },
    }  # fmt: skip
    assert found(quiet) == {}
