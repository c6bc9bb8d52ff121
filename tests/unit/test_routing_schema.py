"""Router mode's schema with upstream's fields: providers (reasoning families, pricing,
reliability, every backend_refs field), and the refusals: what vllm-sr does not act on is a
problem at its YAML path saying "not supported by vllm-sr" and what is supported instead."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from vllm_sr.config.files import parse_document, to_plain
from vllm_sr.config.problems import format_path
from vllm_sr.config.routing import Decision, Routing
from vllm_sr.config.routing_base import NOT_SUPPORTED
from vllm_sr.config.routing_plugins import SUPPORTED_PLUGIN_TYPES
from vllm_sr.config.routing_providers import BackendRef, Providers
from vllm_sr.config.routing_rules import check_routing, routing_local_problems, routing_problems
from vllm_sr.config.routing_selection import RUN_SELECTORS, parse_settings
from vllm_sr.config.routing_signals import KeywordSignal, Signals
from vllm_sr.config.routing_support import (
    DEFAULT_LOOPER_ENDPOINT,
    LOOPER_TYPES,
    RUN_LOOPERS,
    effective_algorithm,
    looper_problems,
    looper_would_run,
)
from vllm_sr.config.routing_tree import RuleLeaf

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
        "lb_policy": "least_request",  # all acted on by router/backends.py ...
        "retry_count": 2,
        "retry_on": "connect-failure,retriable-status-codes",  # ... but this condition
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
        f"{m0}.reliability.retry_on": "supported: 5xx, gateway-error, reset, connect-failure",
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


# -- upstream's own fragments: each loads, or is refused by name ----------------------------

FRAGMENTS = Path(__file__).resolve().parents[1] / "fixtures" / "upstream" / "fragments"
SUPPORTED_SIGNAL_DIRS = {
    "authz",
    "complexity",
    "context",
    "conversation",
    "domain",
    "fact-check",
    "jailbreak",
    "kb",
    "keyword",
    "language",
    "metadata",
    "pii",
    "preference",
    "reask",
    "structure",
    "user-feedback",
}
# fragment folder -> the routing.signals list it fills (refused families)
REFUSED_SIGNAL_DIRS = {
    "event": "events",
    "modality": "modality",
}


def fragment(rel: str) -> dict[str, Any]:
    doc = to_plain(parse_document((FRAGMENTS / rel).read_text(), rel))
    assert isinstance(doc, dict)
    return doc


def fragments(kind: str) -> list[str]:
    return sorted(str(p.relative_to(FRAGMENTS)) for p in (FRAGMENTS / kind).rglob("*.yaml"))


def local(routing: Any) -> dict[str, str]:
    return {format_path(p.path): p.message for p in routing_local_problems(routing)}


def test_every_upstream_signal_fragment_is_here() -> None:
    dirs = {p.parent.name for p in (FRAGMENTS / "signal").rglob("*.yaml")}
    assert dirs == SUPPORTED_SIGNAL_DIRS | set(REFUSED_SIGNAL_DIRS) | {"embedding", "classifier"}


@pytest.mark.parametrize("rel", fragments("signal"))
def test_signal_fragments_load_or_are_refused_by_family(rel: str) -> None:
    family_dir = Path(rel).parts[1]
    routing = fragment(rel)["routing"]
    found = local(routing)
    if family_dir in SUPPORTED_SIGNAL_DIRS or rel == "signal/embedding/support.yaml":
        assert found == {}
        Routing.model_validate(routing)  # the typed model takes it unchanged
    elif family_dir == "classifier":  # type llm: refused by name where deployments are known
        assert found == {}
        Routing.model_validate(routing)
        problems = check_routing(None, routing, {"primary"}, "primary")
        assert [format_path(p.path) for p in problems] == ["routing.signals.classifiers[0].type"]
        assert "a classifier of type 'llm'" in problems[0].message
        assert NOT_SUPPORTED in problems[0].message
    elif family_dir == "embedding":  # image-routing: query_modality image
        assert set(found) == {
            f"routing.signals.embeddings[{i}].query_modality"
            for i in range(len(routing["signals"]["embeddings"]))
        }
        assert all(NOT_SUPPORTED in m and "supported: text" in m for m in found.values())
    else:
        family = REFUSED_SIGNAL_DIRS[family_dir]
        assert list(found) == [f"routing.signals.{family}"]
        message = found[f"routing.signals.{family}"]
        assert f"the signal family {family!r} is {NOT_SUPPORTED}" in message
        assert "supported: keywords, embeddings, domains, context" in message
        # the family's fields are typed all the same: a typo is an unknown key, not a refusal
        sig = dict(routing["signals"][family][0], nmae="x")
        with pytest.raises(ValidationError, match="extra"):
            Signals.model_validate({family: [sig]})


def test_decision_fragments_load_or_refuse_their_leaf_types() -> None:
    refused = {}
    for rel in fragments("decision"):
        routing = fragment(rel)["routing"]
        found = local(routing)
        assert all(NOT_SUPPORTED in m for m in found.values()), rel
        refused[rel] = sorted(found)
    assert refused == {
        "decision/and/urgent-business.yaml": [],
        "decision/composite/priority-safe-escalation.yaml": [],
        "decision/not/exclude-jailbreak.yaml": [],
        "decision/or/business-or-law.yaml": [],
        "decision/single/domain-business.yaml": [],
        "decision/single/domain-computer-science.yaml": [],
    }
    # a leaf type vllm-sr does not evaluate is refused by name
    refused_leaf = {"decisions": [{"name": "d", "rules": {"type": "modality", "name": "AR"}}]}
    assert "the rule leaf type 'modality'" in local(refused_leaf)["routing.decisions[0].rules.type"]
    ok = fragment("decision/single/domain-business.yaml")["routing"]["decisions"][0]
    assert Decision.model_validate(ok).model_refs[0].use_reasoning is False


def with_algorithm(algorithm: dict[str, Any], refs: int = 2) -> dict[str, Any]:
    return {
        "name": "d",
        "rules": {"operator": "AND", "conditions": [{"type": "keyword", "name": "k"}]},
        "modelRefs": [{"model": f"m{i}"} for i in range(refs)],
        "algorithm": algorithm,
    }


@pytest.mark.parametrize("rel", fragments("algorithm"))
def test_algorithm_fragments(rel: str) -> None:
    doc = fragment(rel)
    if "routing" in doc:  # selection/prompt.yaml is a whole decision
        decision = doc["routing"]["decisions"][0]
        algo = decision["algorithm"]
    else:
        algo = doc["algorithm"]
        decision = with_algorithm(algo)
    kind = algo["type"]
    found = local({"decisions": [decision]})
    if kind == "static":
        assert found == {}
        assert effective_algorithm(Decision.model_validate(decision)) == ("static", "selected")
    elif kind in RUN_SELECTORS:  # run by vllm-sr (vllm_sr/router/selection)
        assert found == {}
        assert effective_algorithm(Decision.model_validate(decision)) == (kind, "selected")
        settings = parse_settings(kind, algo[kind])
        assert settings.model_dump(exclude_unset=True) == algo[kind]
    elif kind in LOOPER_TYPES:
        assert found == {}  # accepted; whether it runs depends on the looper endpoint
        parsed = Decision.model_validate(decision)
        no_endpoint = {"integrations": {"looper": {"endpoint": ""}}}
        algorithm, status = effective_algorithm(parsed, no_endpoint)
        assert algorithm == kind
        assert status in ("execution_required", "planned_final")
        assert looper_would_run(decision, "http://looper:8899/v1")
        refused = looper_problems({"decisions": [decision]}, "http://looper:8899/v1")
        if kind in RUN_LOOPERS:  # vllm-sr runs it itself (vllm_sr/router/looper)
            # eval reports it as upstream does, endpoint or not (its final model: planned)
            assert effective_algorithm(parsed, None) == (algorithm, status)
            assert refused == []
        else:
            with pytest.raises(ValueError, match=NOT_SUPPORTED):
                effective_algorithm(parsed, None)  # upstream's default endpoint: it would run
            assert [format_path(p.path) for p in refused] == ["routing.decisions[0].algorithm.type"]
            assert NOT_SUPPORTED in refused[0].message
            assert "'http://looper:8899/v1'" in refused[0].message
        assert not looper_would_run(decision, "")
        assert looper_problems({"decisions": [decision]}, "") == []
    else:
        assert list(found) == ["routing.decisions[0].algorithm.type"]
        message = found["routing.decisions[0].algorithm.type"]
        # knn, kmeans, svm, mlp: refused by name, with why (upstream's trained artifacts)
        assert message.startswith(f"the algorithm {kind!r} (upstream runs it on a trained")
        assert f"ml.{kind}.pretrained_path" in message
        assert f"{NOT_SUPPORTED}; supported: static, latency_aware" in message


def test_looper_statuses_and_when_upstream_runs_them_as_static() -> None:
    no_endpoint = {"integrations": {"looper": {"endpoint": ""}}}
    fusion = Decision.model_validate(
        with_algorithm({"type": "fusion", "fusion": {"model": "m0"}}, refs=1)
    )
    assert effective_algorithm(fusion, no_endpoint) == ("fusion", "planned_final")
    remom = with_algorithm({"type": "remom", "remom": {"breadth_schedule": [2]}}, refs=1)
    assert effective_algorithm(remom, no_endpoint) == ("remom", "execution_required")
    # run as loopers, the same (upstream's eval does not look at the endpoint)
    assert effective_algorithm(fusion, None) == ("fusion", "planned_final")
    assert effective_algorithm(remom, None) == ("remom", "execution_required")
    # confidence and ratings need more than one modelRef to run: with one, static even with
    # an endpoint (as upstream), and not refused
    one = with_algorithm({"type": "confidence"}, refs=1)
    assert not looper_would_run(one, DEFAULT_LOOPER_ENDPOINT)
    assert effective_algorithm(one, None) == ("confidence", "execution_required")
    assert looper_would_run(with_algorithm({"type": "remom"}, refs=1), DEFAULT_LOOPER_ENDPOINT)
    analysis = with_algorithm({"type": "fusion", "fusion": {"analysis_models": ["a"]}}, refs=0)
    assert looper_would_run(analysis, DEFAULT_LOOPER_ENDPOINT)
    assert effective_algorithm({"name": "d"}, None) == ("static", "selected")


def test_algorithm_shapes_upstream_rejects() -> None:
    found = local(
        {
            "decisions": [
                with_algorithm({"type": "Static"}),
                with_algorithm({"type": "elo"}),
                with_algorithm({"type": "static", "remom": {"breadth_schedule": [2]}}),
                with_algorithm({"type": "remom", "fusion": {"model": "m0"}}),
            ]
        }
    )
    assert (
        "'Static' is not an algorithm (lowercase)" in found["routing.decisions[0].algorithm.type"]
    )
    assert "'elo' was removed upstream" in found["routing.decisions[1].algorithm.type"]
    assert "accepted: no block" in found["routing.decisions[2].algorithm.remom"]
    assert "accepted: only a remom block" in found["routing.decisions[3].algorithm.fusion"]
    assert not any(NOT_SUPPORTED in m for m in found.values())


@pytest.mark.parametrize("rel", fragments("plugin"))
def test_plugin_fragments_load_or_are_refused_by_type(rel: str) -> None:
    doc = fragment(rel)
    plugins = doc["plugins"] if "plugins" in doc else [doc["plugin"]]
    decision = {"name": "d", "plugins": plugins}
    Decision.model_validate(decision)  # the shape is accepted
    found = local({"decisions": [decision]})
    supported = ", ".join(SUPPORTED_PLUGIN_TYPES)
    expected = {
        f"routing.decisions[0].plugins[{j}].type": (
            f"the plugin {plugin['type']!r} is {NOT_SUPPORTED}; supported: {supported}"
        )
        for j, plugin in enumerate(plugins)
        if plugin["type"] not in SUPPORTED_PLUGIN_TYPES
    }
    for j, plugin in enumerate(plugins):  # tool_selection's add mode needs a tools database
        if plugin["type"] == "tool_selection" and plugin["configuration"].get("mode") == "add":
            expected[f"routing.decisions[0].plugins[{j}].configuration.mode"] = (
                f"tool_selection mode 'add' (tools from a tools database) is {NOT_SUPPORTED}; "
                "supported: mode: filter (the request's own tools, ranked by relevance to the "
                "query)"
            )
        if plugin["type"] == "memory" and plugin["configuration"].get("enabled") is True:
            expected[f"routing.decisions[0].plugins[{j}].configuration.enabled"] = (
                "the memory plugin enabled: true (agentic memory: recall from and writes to a "
                f"memory store, which vllm-sr does not have) is {NOT_SUPPORTED}; supported: "
                "enabled: false"
            )
    assert found == expected


def test_plugin_configurations_are_checked_and_aliases_count_once() -> None:
    found = local(
        {
            "decisions": [
                {
                    "name": "d",
                    "plugins": [
                        {"type": "semantic-cache", "configuration": {"enabled": True}},
                        {"type": "response_cache", "configuration": {"mode": "fuzzy"}},
                        {"type": "fast_response", "configuration": {}},
                        {"type": "system_prompt"},
                    ],
                }
            ]
        }
    )
    assert "one plugin per type" in found["routing.decisions[0].plugins[1].type"]
    assert "'fuzzy'" in found["routing.decisions[0].plugins[1].configuration.mode"]
    assert "fast_response" in found["routing.decisions[0].plugins[2].configuration.message"]
    assert "no configuration" in found["routing.decisions[0].plugins[3].configuration"]


# -- decisions: upstream's fields ------------------------------------------------------------


def test_decision_fields_rules_tier_and_metadata() -> None:
    dec = Decision.model_validate(
        {
            "name": "d",
            "tier": 2,
            "rules": {},
            "annotations": {"owner": "team-a"},
            "emits": [{"kind": "retention", "retention": {"keep_current_model": True}}],
            "output_contract": "answer with one word",
            "candidateIterations": [{"variable": "m", "source": "modelRefs"}],
        }
    )
    assert dec.rules is None and dec.model_refs == [] and dec.tier == 2
    leaf = Decision.model_validate(
        {"name": "d", "rules": {"type": "Keyword", "name": "k", "predicate": {"gte": 1}}}
    )
    assert isinstance(leaf.rules, RuleLeaf)
    assert leaf.rules.type == "keyword" and leaf.rules.predicate is not None
    assert leaf.rules.predicate.gte == 1
    with pytest.raises(ValidationError, match="at least one of gt, gte, lt, lte"):
        RuleLeaf.model_validate({"type": "context", "name": "c", "predicate": {}})
    with pytest.raises(ValidationError, match="both gt and gte"):
        RuleLeaf.model_validate({"type": "context", "name": "c", "predicate": {"gt": 1, "gte": 2}})
    with pytest.raises(ValidationError):
        RuleLeaf.model_validate({"type": "keyword", "name": "k", "on_error": "explode"})
    with pytest.raises(ValidationError, match="extra"):
        Decision.model_validate({"name": "d", "learning": {}})
    with pytest.raises(ValidationError, match="at most 32"):
        Decision.model_validate({"name": "d", "annotations": {str(i): i for i in range(33)}})
    with pytest.raises(ValidationError, match="at most 4096"):
        Decision.model_validate({"name": "d", "annotations": {"note": "x" * 5000}})


def test_decision_refusals_and_leaf_rules() -> None:
    routing = {
        "decisions": [
            {
                "name": "d",
                "rules": {
                    "operator": "OR",
                    "conditions": [
                        {"type": "keyword", "name": "k", "label": "x"},
                        {"type": "event", "name": "p", "on_error": "match"},
                    ],
                },
                "adaptations": {"mode": "observe", "adaptation": {"mode": "apply"}},
                "emits": [
                    {"kind": "retention", "retention": {"drop": True}},
                    {"kind": "retention", "retention": {"ttl_turns": 3}},
                ],
                "annotations": {"a": 1},
            }
        ]
    }
    found = local(routing)
    d0 = "routing.decisions[0]"
    assert "label only on classifier leaves" in found[f"{d0}.rules.conditions[0].label"]
    assert "on_error only on classifier leaves" in found[f"{d0}.rules.conditions[1].on_error"]
    assert "the rule leaf type 'event' is not supported" in found[f"{d0}.rules.conditions[1].type"]
    assert "'apply' under adaptations.mode 'observe'" in found[f"{d0}.adaptations.adaptation.mode"]
    assert f"{d0}.adaptations" not in found  # Router Learning's controls are acted on
    assert not any(p.startswith(f"{d0}.emits[0]") for p in found)  # acted on
    assert "one retention per decision" in found[f"{d0}.emits[1].kind"]
    assert not any(p.startswith(f"{d0}.annotations") for p in found)
    with pytest.raises(ValidationError, match=NOT_SUPPORTED):
        Routing.model_validate(routing)


def test_keyword_upstream_defaults_and_fuzzy() -> None:
    sig = KeywordSignal.model_validate(
        {
            "name": "k",
            "keywords": ["a"],
            "bm25_threshold": 0,
            "ngram_threshold": 0,
            "ngram_arity": 0,
        }
    )
    assert sig.method is None  # upstream's literal keywords
    assert (sig.bm25_threshold, sig.ngram_threshold, sig.ngram_arity) == (0.1, 0.4, 3)
    assert (sig.fuzzy_match, sig.fuzzy_threshold) == (False, 2)
    fuzzy = KeywordSignal.model_validate(
        {"name": "k", "keywords": ["a"], "fuzzy_match": True, "fuzzy_threshold": 1}
    )
    assert fuzzy.fuzzy_match and fuzzy.fuzzy_threshold == 1
    with pytest.raises(ValidationError):
        KeywordSignal.model_validate({"name": "k", "keywords": ["a"], "fuzzy_threshold": -1})
    with pytest.raises(ValidationError):
        KeywordSignal.model_validate({"name": "k", "keywords": ["a"], "ngram_arity": 1})
    # only method regex compiles keywords as patterns; literals may hold any character
    found = local({"signals": {"keywords": [{"name": "k", "keywords": ["c++("]}]}})
    assert found == {}
    found = local({"signals": {"keywords": [{"name": "k", "method": "regex", "keywords": ["("]}]}})
    assert "is not a regular expression" in found["routing.signals.keywords[0].keywords[0]"]


def test_cross_references_of_the_new_families_cards_and_loras() -> None:
    doc = providers_doc()
    doc["routing"] = {
        "modelCards": [
            {"name": "qwen3-8b", "loras": [{"name": "qwen3-8b-sql"}], "tags": ["fast"]},
            {"name": "qwen3-32b", "param_size": "32B", "quality_score": 0.9},
        ],
        "signals": {
            "context": [{"name": "long", "min_tokens": "8K", "max_tokens": "1M"}],
            "role_bindings": [
                {"name": "admins", "role": "admin", "subjects": [{"kind": "Group", "name": "ops"}]}
            ],
        },
        "decisions": [
            {
                "name": "d",
                "rules": {
                    "operator": "AND",
                    "conditions": [
                        {"type": "context", "name": "long"},
                        {"type": "authz", "name": "admin"},
                        {"type": "authz", "name": "admins"},
                        {"type": "metadata", "name": "tier"},
                    ],
                },
                "modelRefs": [
                    {"model": "qwen3-8b", "lora_name": "qwen3-8b-sql", "reasoning_effort": "high"},
                    {"model": "qwen3-32b", "lora_name": "nope"},
                ],
            }
        ],
    }
    found = problems_of(doc)
    rules = "routing.decisions[0].rules.conditions"
    assert set(found) == {
        f"{rules}[2].name",
        f"{rules}[3].name",
        "routing.decisions[0].modelRefs[1].lora_name",
    }
    assert (
        "role 'admins' is not declared under routing.signals.role_bindings"
        in (found[f"{rules}[2].name"])
    )
    assert "accepted: one of admin" in found[f"{rules}[2].name"]
    assert "(no metadata signals)" in found[f"{rules}[3].name"]
    assert (
        "not a LoRA of model card 'qwen3-32b'"
        in found["routing.decisions[0].modelRefs[1].lora_name"]
    )
    routing = Routing.model_validate(doc["routing"] | {"decisions": []})
    assert routing.lora_base("qwen3-8b-sql") == "qwen3-8b"
    doc["routing"]["modelCards"].pop()
    assert "is not a routing.modelCards name" in problems_of(doc)["providers.models[1].name"]
