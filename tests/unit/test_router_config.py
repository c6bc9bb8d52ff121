"""Router mode's config: the models (defaults, bounds, unknown keys) and check_routing's
problems, each at its YAML path (and so its line)."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
from pydantic import ValidationError

from vllm_sr.config.files import line_of, parse_document, to_plain
from vllm_sr.config.problems import format_path
from vllm_sr.config.routing import AutoModelNames, Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.config.routing_rules import check_routing, routing_problems
from vllm_sr.config.routing_signals import KeywordSignal

CONFIG = textwrap.dedent(
    """\
    providers:
      defaults: {default_model: general}
      models:
        - name: general
          provider_model_id: qwen3-8b
          backend_refs:
            - {endpoint: 127.0.0.1:8000}
        - name: coder
          backend_refs:
            - {base_url: https://llm.example.com/v1, api_key_env: CODER_KEY}
    routing:
      strategy: priority
      signals:
        keywords: [{name: code, operator: OR, method: regex, keywords: [code, function, debug]}]
        embeddings:
          - {name: billing, threshold: 0.6, aggregation_method: max, candidates: [refund my order]}
        domains: [{name: math, description: Mathematics questions, examples: [solve this integral]}]
      decisions:
        - name: coding
          priority: 100
          rules: {operator: AND, conditions: [{type: keyword, name: code}]}
          modelRefs: [{model: coder}]
        - name: money
          rules:
            operator: OR
            conditions:
              - {type: embedding, name: billing}
              - operator: NOT
                conditions: [{type: domain, name: math}]
          modelRefs: [{model: general}]
    global:
      router: {enabled: true, auto_model_names: [vllm-sr/auto, auto]}
      model_catalog:
        deployments:
          primary: {}
    """
)


def raw() -> Any:
    return to_plain(parse_document(CONFIG))


def problems_of(doc: Any) -> dict[str, str]:
    return {format_path(p.path): p.message for p in routing_problems(doc)}


def test_the_issue_example_validates_with_defaults() -> None:
    doc = raw()
    providers = Providers.model_validate(doc["providers"])
    routing = Routing.model_validate(doc["routing"])
    assert providers.models[0].backend_model == "qwen3-8b"
    assert providers.models[1].backend_model == "coder"
    assert providers.models[0].backend_refs[0].api_base() == "http://127.0.0.1:8000/v1"
    assert providers.models[1].backend_refs[0].api_base() == "https://llm.example.com/v1"
    assert routing.decisions[0].model_refs[0].model == "coder"
    assert routing.decisions[1].priority == 0
    assert routing.signals.keywords[0].case_sensitive is False
    assert routing_problems(doc) == []
    dumped = routing.model_dump(by_alias=True, exclude_none=True)
    assert "modelRefs" in dumped["decisions"][0]
    assert AutoModelNames().auto_model_names == ["vllm-sr/auto", "auto"]


def test_unknown_keys_and_bad_choices_are_refused() -> None:
    with pytest.raises(ValidationError, match="extra"):
        KeywordSignal.model_validate({"name": "k", "keywords": ["a"], "fuzzy": True})
    with pytest.raises(ValidationError, match="'regex', 'bm25' or 'ngram'"):
        KeywordSignal.model_validate({"name": "k", "keywords": ["a"], "method": "soundex"})
    with pytest.raises(ValidationError):
        KeywordSignal.model_validate({"name": "k", "keywords": ["a"], "ngram_threshold": 1.5})
    with pytest.raises(ValidationError):
        Routing.model_validate({"strategy": "random"})


def test_a_model_validator_raises_the_section_rules() -> None:
    doc = raw()
    doc["routing"]["decisions"][1]["rules"]["conditions"][1]["conditions"].append(
        {"type": "keyword", "name": "code"}
    )
    with pytest.raises(ValidationError, match="NOT has 2 conditions"):
        Routing.model_validate(doc["routing"])


def test_unknown_signal_and_model_in_a_decision() -> None:
    doc = raw()
    doc["routing"]["decisions"][1]["rules"]["conditions"][0]["name"] = "biling"
    doc["routing"]["decisions"][0]["modelRefs"][0]["model"] = "koder"
    found = problems_of(doc)
    assert "biling" in found["routing.decisions[1].rules.conditions[0].name"]
    assert "accepted: one of billing" in found["routing.decisions[1].rules.conditions[0].name"]
    assert "accepted: one of general, coder" in found["routing.decisions[0].modelRefs[0].model"]


def test_signal_on_a_missing_deployment() -> None:
    doc = raw()
    doc["routing"]["signals"]["embeddings"][0]["deployment"] = "nowhere"
    found = problems_of(doc)
    assert found["routing.signals.embeddings[0].deployment"] == (
        "'nowhere' names no deployment; accepted: one of primary"
    )


def test_duplicate_names() -> None:
    doc = raw()
    doc["routing"]["signals"]["keywords"].append(dict(doc["routing"]["signals"]["keywords"][0]))
    doc["routing"]["decisions"].append(dict(doc["routing"]["decisions"][0]))
    doc["providers"]["models"].append(dict(doc["providers"]["models"][0]))
    found = problems_of(doc)
    assert "also used by keywords[0]" in found["routing.signals.keywords[1].name"]
    assert "also used by decisions[0]" in found["routing.decisions[2].name"]
    assert "also used by models[0]" in found["providers.models[2].name"]


def test_default_model_backend_refs_regex_and_auto_names() -> None:
    doc = raw()
    doc["providers"]["defaults"]["default_model"] = "nope"
    doc["providers"]["models"][0]["backend_refs"][0]["base_url"] = "http://x/v1"
    doc["providers"]["models"][1]["backend_refs"][0] = {"endpoint": "no port"}
    doc["routing"]["signals"]["keywords"][0]["keywords"].append("debug(")
    doc["global"]["router"]["auto_model_names"].append("coder")
    found = problems_of(doc)
    assert "names no model" in found["providers.defaults.default_model"]
    # upstream takes endpoint or base_url; both at once is refused by name
    both = found["providers.models[0].backend_refs[0]"]
    assert "both endpoint and base_url is not supported by vllm-sr" in both
    assert "is not HOST[:PORT]" in found["providers.models[1].backend_refs[0].endpoint"]
    assert "is not a regular expression" in found["routing.signals.keywords[0].keywords[3]"]
    assert "also a providers model name" in found["global.router.auto_model_names[2]"]


def test_routing_without_providers() -> None:
    doc = raw()
    del doc["providers"]
    assert "routing without providers" in problems_of(doc)["routing"]


def test_check_routing_takes_models_too() -> None:
    doc = raw()
    providers = Providers.model_validate(doc["providers"])
    routing = Routing.model_validate(doc["routing"])
    assert check_routing(providers, routing, {"primary"}, "primary") == []
    found = check_routing(providers, routing, {"other"}, "primary")
    assert {format_path(p.path) for p in found} == {
        "routing.signals.embeddings[0]",
        "routing.signals.domains[0]",
    }


def test_problem_paths_point_at_lines_of_the_file() -> None:
    doc = parse_document(CONFIG)
    plain = to_plain(doc)
    plain["routing"]["decisions"][1]["rules"]["conditions"][1]["conditions"][0]["name"] = "maths"
    (problem,) = routing_problems(plain)
    lines = CONFIG.splitlines()
    want = next(i for i, line in enumerate(lines, 1) if "[{type: domain, name: math}]" in line)
    assert line_of(doc, problem.path) == want
