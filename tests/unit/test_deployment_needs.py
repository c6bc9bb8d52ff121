"""Router mode with no model (issue 39, item 5): a config whose routing needs no deployment runs
no worker (no embedded d3-edge when ``global.model_catalog`` is omitted) and accepts
``deployments: {}``; with ``{}``, each signal or plugin that does need a deployment is named.
What "needs a deployment" means is checked against the router's own question plan, family by
family, so the config's reading cannot drift from what the router asks."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from vllm_sr.config.deployment_needs import deployment_needs
from vllm_sr.config.files import parse_config
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_kbs import knowledge_bases
from vllm_sr.config.signal_registry import BY_NAME, FRONTEND_SIGNAL_LISTS
from vllm_sr.errors import ConfigError
from vllm_sr.placement import planner
from vllm_sr.router import deterministic
from vllm_sr.router.families import STEP_BUILDERS
from vllm_sr.router.questions import QuestionPlan, declared_keys

# One valid entry of every family vllm-sr evaluates.
MODEL_FREE: dict[str, dict[str, Any]] = {
    "keywords": {"name": "code", "keywords": ["code"]},
    "context": {"name": "long", "min_tokens": "8K", "max_tokens": "1M"},
    "structure": {
        "name": "asks",
        "feature": {"type": "exists", "source": {"type": "regex", "pattern": "[?]"}},
    },
    "conversation": {"name": "turns", "feature": {"type": "count", "source": {"type": "message"}}},
    "language": {"name": "en"},
    "metadata": {"name": "gold", "key": "tier", "predicate": {"in": ["gold"]}},
    "role_bindings": {"name": "b", "role": "ops", "subjects": [{"kind": "user", "name": "ann"}]},
    "pii": {"name": "card", "threshold": 0.5},  # presidio's pattern recognizers
    "input_modality": {"name": "pictures", "modality": "image"},  # v0.4
}
NEEDS_MODEL: dict[str, dict[str, Any]] = {
    "embeddings": {"name": "billing", "threshold": 0.6, "candidates": ["refund my order"]},
    "domains": {"name": "math", "description": "Mathematics questions"},
    "fact_check": {"name": "needs_fact_check"},
    "user_feedbacks": {"name": "wrong_answer"},
    "reasks": {"name": "again", "threshold": 0.9},
    "preferences": {"name": "terse", "examples": ["keep it short"], "threshold": 0.5},
    "complexity": {
        "name": "hard",
        "threshold": 0.1,
        "hard": {"candidates": ["prove this theorem"]},
        "easy": {"candidates": ["say hi"]},
    },
    "jailbreak": {"name": "inject", "threshold": 0.5},
    "kb": {"name": "private", "kb": "privacy_kb", "target": {"kind": "label", "value": "pii"}},
    "classifiers": {"name": "risk", "type": "local", "labels": ["violence"]},
    "safety": {"name": "unsafe", "threshold": 0.5},
}


KEYWORD_RULE = {"operator": "AND", "conditions": [{"type": "keyword", "name": "code"}]}


def config(signals: dict[str, list[dict[str, Any]]], catalog: Any = None, **top: Any) -> str:
    doc: dict[str, Any] = {
        "providers": {
            "defaults": {"default_model": "general"},
            "models": [{"name": "general", "backend_refs": [{"endpoint": "127.0.0.1:8000"}]}],
        },
        "routing": {
            "signals": copy.deepcopy(signals),
            "decisions": [
                {
                    "name": "coding",
                    "rules": {
                        "operator": "AND",
                        "conditions": [{"type": "keyword", "name": "code"}],
                    },
                    "modelRefs": [{"model": "general"}],
                }
            ],
        },
        **top,
    }
    doc["routing"]["signals"].setdefault("keywords", [MODEL_FREE["keywords"]])
    if catalog is not None:
        doc["global"] = {"model_catalog": catalog}
    return yaml.safe_dump(doc, sort_keys=False)


EVERY_MODEL_FREE = {family: [entry] for family, entry in MODEL_FREE.items()}


def problems(text: str) -> dict[str, str]:
    """The load's problems, ``config.yaml:LINE: PATH: MESSAGE``, as PATH -> MESSAGE."""
    with pytest.raises(ConfigError) as info:
        parse_config(text, "config.yaml")
    out = {}
    for line in info.value.problems:
        _, _, path, message = line.split(": ", 1)[0].split(":") + line.split(": ", 2)[1:]
        out[path] = message
    return out


def test_a_routing_that_needs_no_model_runs_no_worker() -> None:
    conf = parse_config(config(EVERY_MODEL_FREE), "config.yaml")
    assert conf.deployments == {} and not conf.uses_embedded_default
    assert list(planner.plan(conf).replicas) == []


def test_an_empty_deployments_mapping_is_accepted_when_nothing_needs_one() -> None:
    conf = parse_config(config(EVERY_MODEL_FREE, {"deployments": {}}), "config.yaml")
    assert conf.deployments == {} and list(planner.plan(conf).replicas) == []


@pytest.mark.parametrize("family", sorted(NEEDS_MODEL))
def test_with_no_deployment_the_error_names_the_signal_that_needs_one(family: str) -> None:
    entry = NEEDS_MODEL[family]
    said = problems(config({**EVERY_MODEL_FREE, family: [entry]}, {"deployments": {}}))
    assert list(said) == [f"routing.signals.{family}[0]"]
    (message,) = said.values()
    assert message.startswith(f"signal {entry['name']!r} ({family}) needs a deployment")


def test_omitted_deployments_still_run_the_embedded_default_when_a_signal_needs_one() -> None:
    conf = parse_config(config({"embeddings": [NEEDS_MODEL["embeddings"]]}), "config.yaml")
    assert conf.uses_embedded_default and list(conf.deployments) == ["primary"]


def test_a_recipe_signal_a_headed_pii_and_a_semantic_cache_are_named_too() -> None:
    recipe = {
        "name": "fast",
        "routing": {
            "signals": {"embeddings": [NEEDS_MODEL["embeddings"]]},
            "decisions": [{"name": "any", "rules": {"operator": "AND", "conditions": []},
                           "modelRefs": [{"model": "general"}]}],
        },
    }  # fmt: skip
    signals = {"pii": [{**MODEL_FREE["pii"], "deployment": "ner"}]}
    text = config(signals, {"deployments": {}}, recipes=[recipe])
    doc = yaml.safe_load(text)
    doc["routing"]["decisions"][0]["plugins"] = [
        {"type": "semantic-cache", "configuration": {"enabled": True}}
    ]
    paths = problems(yaml.safe_dump(doc))
    assert "recipes[0].routing.signals.embeddings[0]" in paths
    assert "response_cache plugin" in paths["routing.decisions[0].plugins[0]"]
    # the headed pii names a deployment that does not exist: said once, by that rule
    assert paths["routing.signals.pii[0].deployment"].startswith("'ner' names no deployment")
    assert "routing.signals.pii[0]" not in paths


def test_engine_mode_with_no_deployment_is_refused_saying_why() -> None:
    text = "global:\n  router: {enabled: false}\n  model_catalog: {deployments: {}}\n"
    said = problems(text)
    assert list(said) == ["global.model_catalog.deployments"]
    (message,) = said.values()
    assert "without Router mode" in message and "accepted: at least one deployment" in message


def test_the_frontend_families_are_the_routers_step_and_loop_ones() -> None:
    # The config reads "no model" off the registry; the router evaluates the CPU step's
    # families and deterministic.FAMILIES (authz among them) in the frontend. pii is a step
    # family whose entries may name a deployment instead.
    lists = {BY_NAME[kind].config_key for kind in (*STEP_BUILDERS, *deterministic.FAMILIES)}
    assert lists - {"pii"} == FRONTEND_SIGNAL_LISTS


@pytest.mark.parametrize("family", sorted({*MODEL_FREE, *NEEDS_MODEL}))
def test_needs_agree_with_the_deployments_the_router_asks(family: str) -> None:
    entry = {**MODEL_FREE, **NEEDS_MODEL}[family]
    raw = yaml.safe_load(config({family: [entry]}))
    routing = Routing.model_validate(raw["routing"])
    kbs = list(knowledge_bases(None))  # upstream's defaults, as the router loads them
    asked = QuestionPlan(routing, "primary", wanted=declared_keys(routing), kbs=kbs).deployments
    assert bool(deployment_needs(raw)) is bool(asked), (family, sorted(asked))
