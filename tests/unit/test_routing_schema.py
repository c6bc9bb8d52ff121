"""Router mode's schema with upstream's fields: providers (reasoning families, pricing,
reliability, every backend_refs field), and the refusals: what vllm-sr does not act on is a
problem at its YAML path saying "not supported by vllm-sr" and what is supported instead."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
from pydantic import ValidationError

from vllm_sr.config.files import parse_document, to_plain
from vllm_sr.config.problems import format_path
from vllm_sr.config.routing import BackendRef, Providers, routing_problems
from vllm_sr.config.routing_base import NOT_SUPPORTED

# upstream config/config.yaml's providers, minus what vllm-sr refuses (see the refusal test)
PROVIDERS = textwrap.dedent(
    """\
    providers:
      defaults:
        default_model: qwen3-8b
        default_reasoning_effort: medium
        reasoning_families:
          qwen3: {type: chat_template_kwargs, parameter: enable_thinking}
          gpt: {type: reasoning_effort, parameter: reasoning.effort}
          mistral: {type: top_level_reasoning_effort, parameter: reasoning_effort}
      models:
        - name: qwen3-8b
          reasoning_family: qwen3
          provider_model_id: qwen3-8b-instruct
          api_format: openai
          reliability: {lb_policy: round_robin, retry_count: 0}
          pricing:
            currency: USD
            prompt_per_1m: 0.18
            cached_input_per_1m: 0.04
            cache_write_per_1m: 0.225
            completion_per_1m: 0.42
          external_model_ids: {openai: qwen3-8b, analytics: qwen3-routing}
          backend_refs:
            - name: local-primary
              endpoint: 127.0.0.1:8000
              protocol: http
              weight: 80
              type: chat
              api_key_env: VLLM_SR_PRIMARY_API_KEY
            - name: remote-secondary
              base_url: https://api.example.com/v1
              provider: openai
              auth_header: Authorization
              auth_prefix: Bearer
              chat_path: /chat/completions
              api_key: static-demo-key
              weight: 20
        - name: qwen3-32b
          reasoning_family: gpt
          provider_model_id: qwen3-32b-instruct
          pricing: {currency: USD, prompt_per_1m: 1.2, completion_per_1m: 3.4}
          backend_refs:
            - {endpoint: "https://llm.internal/ignored/path", weight: 0}
            - {endpoint: "llm2.internal", protocol: https}
            - {endpoint: "llm3.internal"}
    """
)


def providers_doc() -> dict[str, Any]:
    doc = to_plain(parse_document(PROVIDERS))
    assert isinstance(doc, dict)
    return doc


def problems_of(doc: Any) -> dict[str, str]:
    return {format_path(p.path): p.message for p in routing_problems(doc)}


def test_upstream_provider_fields_load() -> None:
    doc = providers_doc()
    assert routing_problems(doc) == []
    prov = Providers.model_validate(doc["providers"])
    assert prov.defaults.default_reasoning_effort == "medium"
    assert prov.reasoning_family_of("qwen3-8b") == prov.defaults.reasoning_families["qwen3"]
    assert prov.reasoning_family_of("qwen3-8b").parameter == "enable_thinking"  # type: ignore[union-attr]
    assert prov.reasoning_family_of("nope") is None
    big = prov.model("qwen3-32b")
    assert big is not None and big.pricing is not None and big.pricing.configured
    small = prov.model("qwen3-8b")
    assert small is not None and small.pricing is not None
    assert small.pricing.cache_write_per_1m == 0.225


def test_backend_addresses_types_weights_and_names() -> None:
    prov = Providers.model_validate(providers_doc()["providers"])
    small, big = prov.models
    local, remote = small.backend_refs
    assert local.api_base() == "http://127.0.0.1:8000/v1"
    assert remote.api_base() == "https://api.example.com/v1"
    # upstream: a scheme in endpoint sets the protocol, a path is dropped, port 443 / 80
    assert [r.api_base() for r in big.backend_refs] == [
        "https://llm.internal:443/v1",
        "https://llm2.internal:443/v1",
        "http://llm3.internal:80/v1",
    ]
    assert [r.effective_weight for r in (local, remote, *big.backend_refs)] == [80, 20, 1, 1, 1]
    assert (local.endpoint_type, remote.endpoint_type, big.backend_refs[0].endpoint_type) == (
        "chat",
        "openai",
        "vllm",
    )
    assert local.endpoint_name("qwen3-8b", 0) == "qwen3-8b_local-primary"
    assert big.backend_refs[0].endpoint_name("qwen3-32b", 0) == "qwen3-32b_primary"
    assert big.backend_refs[2].endpoint_name("qwen3-32b", 2) == "qwen3-32b_backend-3"


def test_model_id_per_backend_follows_external_model_ids() -> None:
    prov = Providers.model_validate(providers_doc()["providers"])
    small, big = prov.models
    local, remote = small.backend_refs
    # external_model_ids replaces provider_model_id; a type without an entry gets the name
    assert small.model_id_for(remote) == "qwen3-8b"
    assert small.model_id_for(local) == "qwen3-8b"
    small.external_model_ids = {"chat": "served-name"}
    assert small.model_id_for(local) == "served-name"
    assert big.model_id_for(big.backend_refs[1]) == "qwen3-32b-instruct"


def test_reasoning_family_rules() -> None:
    doc = providers_doc()
    doc["providers"]["models"][1]["reasoning_family"] = "deepseek"
    doc["providers"]["defaults"]["reasoning_families"]["mistral"]["parameter"] = "effort"
    found = problems_of(doc)
    assert (
        "'deepseek' is not a providers.defaults.reasoning_families key"
        in (found["providers.models[1].reasoning_family"])
    )
    assert (
        "accepted: reasoning_effort"
        in (found["providers.defaults.reasoning_families.mistral.parameter"])
    )
    doc["providers"]["defaults"]["reasoning_families"]["gpt"]["type"] = "thinking"
    with pytest.raises(ValidationError, match="chat_template_kwargs"):
        Providers.model_validate(doc["providers"])


def test_what_vllm_sr_does_not_act_on_is_refused_by_name() -> None:
    doc = providers_doc()
    small = doc["providers"]["models"][0]
    small["api_format"] = "anthropic"
    small["reliability"] = {
        "lb_policy": "least_request",
        "retry_count": 2,
        "retry_on": "connect-failure",
        "health_check_interval": "10s",
    }
    remote = small["backend_refs"][1]
    remote.update(
        provider="azure-openai",
        chat_path="/v1/messages",
        api_version="2025-03-01",
        extra_headers={"X-Tenant": "t"},
    )
    doc["providers"]["models"][1]["backend_refs"] = []
    found = problems_of(doc)
    m0 = "providers.models[0]"
    refused = {
        f"{m0}.api_format": "supported: openai",
        f"{m0}.reliability.lb_policy": "supported: round_robin",
        f"{m0}.reliability.retry_count": "supported: 0",
        f"{m0}.reliability.retry_on": "supported: vllm-sr's own backend health",
        f"{m0}.reliability.health_check_interval": "supported: vllm-sr's own backend health",
        f"{m0}.backend_refs[1].provider": "supported: openai",
        f"{m0}.backend_refs[1].chat_path": "supported: /chat/completions",
        f"{m0}.backend_refs[1].api_version": "supported: no api_version",
        f"{m0}.backend_refs[1].extra_headers": "supported: the credential headers",
        "providers.models[1].backend_refs": "supported: at least one backend ref",
    }
    for path, supported in refused.items():
        assert NOT_SUPPORTED in found[path], path
        assert supported in found[path], path
    assert set(found) == set(refused)
    # the model raises the same problems when built directly
    with pytest.raises(ValidationError, match=NOT_SUPPORTED):
        Providers.model_validate(doc["providers"])


def test_backend_ref_field_errors() -> None:
    with pytest.raises(ValidationError, match="'http' or 'https'"):
        BackendRef.model_validate({"endpoint": "h:1", "protocol": "grpc"})
    with pytest.raises(ValidationError):
        BackendRef.model_validate({"endpoint": "h:1", "weight": -1})
    with pytest.raises(ValidationError):
        BackendRef.model_validate({"endpoint": "h:1", "auth_header": "bad header"})
    with pytest.raises(ValidationError, match="extra"):
        BackendRef.model_validate({"endpoint": "h:1", "address": "x"})
    doc = providers_doc()
    doc["providers"]["models"][1]["backend_refs"][0] = {"name": "x"}
    doc["providers"]["models"][1]["backend_refs"][1]["name"] = "x"
    found = problems_of(doc)
    assert "needs endpoint or base_url" in found["providers.models[1].backend_refs[0]"]
    assert "also used by backend_refs[0]" in found["providers.models[1].backend_refs[1].name"]
