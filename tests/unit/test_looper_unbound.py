"""Looper decisions with no modelRefs, as v0.4's built-in bundle writes them
(tests/fixtures/upstream/v0.4/mom-v1/config.yaml, the ``accuracy`` recipe's ``agent`` and
``review``): their blocks load, vllm-sr runs them over the provider models the chat admits, in
the providers' order (vllm_sr/router/looper/dispatch.py), and its refusals by name apply to
them as to a looper that runs."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_sr.config.looper_fanout_settings import FusionSettings, WorkflowsSettings
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_base import NOT_SUPPORTED
from vllm_sr.config.routing_looper import least_workers, runs_unbound
from vllm_sr.config.routing_providers import Providers
from vllm_sr.config.schema import GlobalSection, semantic_problems
from vllm_sr.router.looper.dispatch import LooperDecisions
from vllm_sr.router.route import RouteResult

MOM_V1 = Path(__file__).parents[1] / "fixtures/upstream/v0.4/mom-v1/config.yaml"
ENDPOINT = "http://localhost:8899/v1/chat/completions"
MODELS = ("c", "a", "b")  # the providers' order


def bundle_decisions() -> dict[str, dict[str, Any]]:
    """The accuracy recipe's looper decisions, their rules replaced by one keyword."""
    doc = yaml.safe_load(MOM_V1.read_text())
    (accuracy,) = [r for r in doc["recipes"] if r["name"] == "accuracy"]
    out = {}
    for d in accuracy["routing"]["decisions"]:
        if d["name"] in ("agent", "review"):
            assert "modelRefs" not in d  # as released: bound by upstream's CLI
            out[d["name"]] = {
                "name": d["name"],
                "priority": d["priority"],
                "rules": {"operator": "AND", "conditions": [{"type": "keyword", "name": "k"}]},
                "algorithm": d["algorithm"],
            }
    return out


def raw_config(decisions: list[dict[str, Any]], endpoint: str | None = None) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "providers": {
            "defaults": {"model": "a"},
            "models": [
                {"name": m, "backend_refs": [{"endpoint": f"127.0.0.1:{9000 + i}"}]}
                for i, m in enumerate(MODELS)
            ],
        },
        "routing": {
            "signals": {"keywords": [{"name": "k", "operator": "OR", "keywords": ["x"]}]},
            "decisions": decisions,
        },
    }
    if endpoint is not None:
        raw["global"] = {"integrations": {"looper": {"endpoint": endpoint}}}
    return raw


def loopers(raw: dict[str, Any]) -> LooperDecisions:
    global_ = GlobalSection.model_validate(raw["global"]) if "global" in raw else None
    return LooperDecisions(
        Routing.model_validate(raw["routing"]),
        global_,
        Providers.model_validate(raw["providers"]),
    )


def routed(decision: str) -> RouteResult:
    return RouteResult("a", decision)


def test_the_bundles_looper_decisions_load_and_run_unbound() -> None:
    decisions = bundle_decisions()
    raw = raw_config(list(decisions.values()))
    assert semantic_problems(raw) == []  # agent's workflows has no planner.model
    got = loopers(raw)
    assert isinstance(got.looping["agent"], WorkflowsSettings)
    assert got.looping["agent"].planner_model == ""
    assert isinstance(got.looping["review"], FusionSettings)
    assert got.unbound == {"agent": 2, "review": 2}  # their minimum_candidates
    # the looper endpoint set to "" switches loopers off: both are served as static
    off = loopers(raw_config(list(decisions.values()), endpoint=""))
    assert off.looping == {} and off.unbound == {}


def test_workers_are_the_admitted_provider_models_in_the_providers_order() -> None:
    got = loopers(raw_config(list(bundle_decisions().values())))
    assert got.workers(routed("agent"), lambda m: True) == ["c", "a", "b"]
    assert got.workers(routed("agent"), lambda m: m != "a") == ["c", "b"]
    # fewer admitted than minimum_candidates (2): no looper, the routed model answers
    assert got.workers(routed("agent"), lambda m: m == "b") is None


def test_fusion_with_its_own_analysis_models_is_not_unbound() -> None:
    review = copy.deepcopy(bundle_decisions()["review"])
    review["algorithm"]["fusion"]["analysis_models"] = ["a", "b"]
    got = loopers(raw_config([review]))
    assert "review" in got.looping and got.unbound == {}
    assert got.workers(routed("review"), lambda m: False) == []  # its panel: analysis_models


def test_a_bound_decision_keeps_its_modelrefs() -> None:
    bound = copy.deepcopy(bundle_decisions()["agent"])
    bound["modelRefs"] = [{"model": "b"}, {"model": "a"}, {"model": "b", "lora_name": "x"}]
    got = loopers(raw_config([bound]))
    assert got.unbound == {} and "agent" in got.looping
    refs = Routing.model_validate(raw_config([bound])["routing"]).decisions[0].model_refs
    result = RouteResult("b", "agent", decision_refs=tuple(refs))
    # the modelRefs, once each, in order; their health is the calls' own fallback
    assert got.workers(result, lambda m: False) == ["b", "a"]


@pytest.mark.parametrize(
    ("kind", "block", "least"),
    [
        ("workflows", {"mode": "dynamic"}, 1),
        ("remom", {"breadth_schedule": [2]}, 1),
        ("ratings", {}, 2),
        ("confidence", {}, 2),
    ],
)
def test_least_workers_by_kind_and_minimum_candidates(
    kind: str, block: dict[str, Any], least: int
) -> None:
    decision = {
        "name": "d",
        "rules": {"operator": "AND", "conditions": [{"type": "keyword", "name": "k"}]},
        "algorithm": {"type": kind, kind: block},
    }
    parsed = Routing.model_validate(raw_config([decision])["routing"]).decisions[0]
    assert runs_unbound(parsed, ENDPOINT) and not runs_unbound(parsed, "")
    assert least_workers(parsed) == least
    decision["algorithm"]["minimum_candidates"] = 3  # type: ignore[index]
    parsed = Routing.model_validate(raw_config([decision])["routing"]).decisions[0]
    assert least_workers(parsed) == 3


def test_refusals_by_name_apply_to_an_unbound_looper_that_runs() -> None:
    review = copy.deepcopy(bundle_decisions()["review"])
    review["algorithm"]["fusion"]["grounding"] = {"enabled": True}
    (refused,) = [p for p in semantic_problems(raw_config([review])) if NOT_SUPPORTED in str(p)]
    assert refused.path[-4:] == ("algorithm", "fusion", "grounding", "enabled")
    assert refused.path[:3] == ("routing", "decisions", 0)
    # not run (looper endpoint ""): served as static, only upstream's own checks apply
    assert semantic_problems(raw_config([review], endpoint="")) == []
    # bound with fusion's own analysis_models it already ran: refused once, not twice
    review["algorithm"]["fusion"]["analysis_models"] = ["a", "b"]
    got = [p for p in semantic_problems(raw_config([review])) if NOT_SUPPORTED in str(p)]
    assert len(got) == 1
