"""v0.4's decision, plugin and global fields on the routing surface, each acted on or refused by
name: ``algorithm.minimum_candidates`` (checked as upstream's validator), ``action`` and
``modelRefs[].reasoning_mode`` (refused), the fallback policy in its three places (refused
unless ``enabled: false``), ``request_params.default_max_tokens`` (acted on; ``auto``
refused), ``router_replay.capture_personal_data``, and the hallucination family,
``jailbreak[].direction`` and ``classifiers[].disable_rationale``; ``emits`` retention (acted
on, upstream's contract checked) and a disabled ``memory`` plugin (an enabled one refused). The
released mom-v1 bundle's decisions are upstream's own fragments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from vllm_sr.config.plugin_request import RequestParamsPlugin
from vllm_sr.config.problems import Problem
from vllm_sr.config.routing import Decision
from vllm_sr.config.routing_plugins import decision_plugins, plugin_problems
from vllm_sr.config.routing_rules import routing_local_problems
from vllm_sr.config.upstream_refusals import global_refusals
from vllm_sr.router.plugins.shapers import apply_request_params
from vllm_sr.router.retention import directive, drops

MOM_V1 = Path(__file__).resolve().parents[1] / "fixtures/upstream/v0.4/mom-v1/config.yaml"
REF = {"model": "m"}


def paths(problems: list[Problem]) -> list[tuple[object, ...]]:
    return [p.path for p in problems]


def decision(**fields: Any) -> dict[str, Any]:
    return {"name": "d", "modelRefs": [REF], **fields}


def test_mom_v1s_decisions_load_with_minimum_candidates_and_on_unknown() -> None:
    doc = yaml.safe_load(MOM_V1.read_text(encoding="utf-8"))
    decisions = [d for r in doc["recipes"] for d in r["routing"]["decisions"]]
    assert {d["algorithm"].get("minimum_candidates") for d in decisions if "algorithm" in d} >= {
        1,
        2,
    }
    for dec in decisions:
        # only the v0.4 fields of this surface: their problems, if any, would be here
        own = {k: dec[k] for k in ("name", "modelRefs", "rules") if k in dec}
        least = dec.get("algorithm", {}).get("minimum_candidates")
        algo = {"type": "static", "minimum_candidates": least}
        problems = routing_local_problems({"decisions": [{**own, "algorithm": algo}]})
        mine = [p for p in problems if "minimum_candidates" in p.path or "on_unknown" in p.path]
        assert mine == [], dec["name"]


def test_minimum_candidates_counts_distinct_model_refs_as_upstream() -> None:
    refs = [{"model": "a"}, {"model": "a"}, {"model": "a", "lora_name": "x"}]
    ok = decision(modelRefs=refs, algorithm={"type": "static", "minimum_candidates": 2})
    assert routing_local_problems({"decisions": [ok]}) == []
    bad = decision(modelRefs=refs, algorithm={"type": "static", "minimum_candidates": 3})
    (problem,) = routing_local_problems({"decisions": [bad]})
    assert problem.path == ("routing", "decisions", 0, "algorithm", "minimum_candidates")
    assert "has 2 distinct modelRefs" in problem.message


def test_action_and_reasoning_mode_are_refused_by_name() -> None:
    acted = decision(
        rules={"type": "jailbreak", "name": "guard"},
        action={"type": "route", "destination": "guarded"},
        modelRefs=[{"model": "m", "reasoning_mode": "adaptive"}],
    )
    problems = routing_local_problems(
        {"signals": {"jailbreak": [{"name": "guard", "threshold": 0.5}]}, "decisions": [acted]}
    )
    assert paths(problems) == [
        ("routing", "decisions", 0, "action"),
        ("routing", "decisions", 0, "modelRefs", 0, "reasoning_mode"),
    ]
    assert all("not supported by vllm-sr" in p.message for p in problems)


@pytest.mark.parametrize("policy", [{"enabled": True, "max_attempts": 2}, {"max_attempts": 2}])
def test_a_fallback_policy_is_refused_in_each_of_its_places(policy: dict[str, Any]) -> None:
    assert paths(routing_local_problems({"fallback": policy})) == [("routing", "fallback")]
    raw = {"global": {"router": {"fallback": policy}}}
    assert paths(global_refusals(raw)) == [("global", "router", "fallback")]
    off = {**policy, "enabled": False, "circuit_breaker": {"consecutive_failures": 3}}
    assert routing_local_problems({"fallback": off}) == []
    assert global_refusals({"global": {"router": {"fallback": off}}}) == []


def test_default_max_tokens_fills_in_a_missing_output_limit() -> None:
    plugin = RequestParamsPlugin(default_max_tokens=8192, max_tokens_limit=4096)
    assert apply_request_params({"messages": []}, plugin)["max_tokens"] == 4096  # then capped
    plain = RequestParamsPlugin(default_max_tokens=8192)
    assert apply_request_params({}, plain) == {"max_tokens": 8192}
    assert apply_request_params({"max_tokens": 10}, plain) == {"max_tokens": 10}
    assert apply_request_params({"max_completion_tokens": 10}, plain) == {
        "max_completion_tokens": 10
    }
    (auto,) = plugin_problems(("p",), "request_params", {"default_max_tokens": "auto"})
    assert auto.path == ("p", "configuration", "default_max_tokens")
    assert "not supported by vllm-sr" in auto.message
    assert plugin_problems(("p",), "request_params", {"default_max_tokens": 0})


def test_capture_personal_data_false_is_refused() -> None:
    def replay(value: bool) -> list[Problem]:
        return global_refusals(
            {"global": {"services": {"router_replay": {"capture_personal_data": value}}}}
        )

    assert replay(True) == []
    assert paths(replay(False)) == [
        ("global", "services", "router_replay", "capture_personal_data")
    ]


def test_hallucination_direction_and_disable_rationale() -> None:
    problems = routing_local_problems(
        {
            "signals": {
                "hallucination": [{"name": "grounded", "use_nli": True}],
                "jailbreak": [
                    {"name": "in", "threshold": 0.5, "direction": "request"},
                    {"name": "out", "threshold": 0.5, "direction": "response"},
                ],
            }
        }
    )
    assert paths(problems) == [
        ("routing", "signals", "hallucination"),
        ("routing", "signals", "jailbreak", 1, "direction"),
    ]
    # disable_rationale is read (an llm classifier's: that type is refused when loaded)
    classifiers = [{"name": "c", "type": "llm", "labels": ["a"], "disable_rationale": True}]
    assert routing_local_problems({"signals": {"classifiers": classifiers}}) == []


def test_what_needs_a_generative_decision_model_is_refused_with_the_reason() -> None:
    routing = {
        "signals": {"decision": [{"name": "route_pick", "type": "choice"}]},
        "decisions": [
            decision(
                rules={"type": "decision", "name": "route_pick"},
                algorithm={"type": "decision", "decision": {"instructions": "pick one"}},
                plugins=[{"type": "prompt_cache", "configuration": {"enabled": True}}],
            )
        ],
    }
    problems = {p.path: p.message for p in routing_local_problems(routing)}
    assert set(problems) == {
        ("routing", "signals", "decision"),
        ("routing", "decisions", 0, "rules", "type"),
        ("routing", "decisions", 0, "algorithm", "type"),
        ("routing", "decisions", 0, "plugins", 0, "type"),
    }
    generative = [m for path, m in problems.items() if path[-1] == "type" and "plugins" not in path]
    assert all("generative decision model" in m and "encoders" in m for m in generative)
    assert "generative decision model" in problems[("routing", "signals", "decision")]
    assert (
        "Anthropic prompt-cache markers"
        in problems[("routing", "decisions", 0, "plugins", 0, "type")]
    )
    assert all("not supported by vllm-sr" in m for m in problems.values())


# -- mom-v1's vault: emits retention and the memory plugin -------------------------------------


def test_mom_v1s_vault_decisions_load_with_their_retention_and_memory() -> None:
    doc = yaml.safe_load(MOM_V1.read_text(encoding="utf-8"))
    (vault,) = [r for r in doc["recipes"] if r["name"] == "vault"]
    decisions = vault["routing"]["decisions"]
    assert {d["name"] for d in decisions if "emits" in d} == {d["name"] for d in decisions}
    for dec in decisions:
        own = {k: dec[k] for k in ("name", "modelRefs", "plugins", "emits") if k in dec}
        assert routing_local_problems({"decisions": [own]}) == [], dec["name"]
        typed = Decision.model_validate(own)
        assert drops(directive(typed.emits)), dec["name"]
        assert "memory" in decision_plugins(typed.plugins).names


def emits_problems(*emits: dict[str, Any]) -> dict[tuple[object, ...], str]:
    found = routing_local_problems({"decisions": [decision(emits=list(emits))]})
    return {p.path[3:]: p.message for p in found}


def test_retention_drop_and_ttl_turns_are_accepted_alone_and_refused_together() -> None:
    assert emits_problems({"kind": "retention", "retention": {"drop": True}}) == {}
    assert emits_problems({"kind": "retention", "retention": {"ttl_turns": 3}}) == {}
    both = emits_problems({"kind": "retention", "retention": {"drop": True, "ttl_turns": 2}})
    assert list(both) == [("emits", 0, "retention")]
    message = both[("emits", 0, "retention")]
    assert "drop: true with ttl_turns 2" in message and "accepted: one of them" in message
    # drop: false with a ttl is not a conflict (upstream checks drop == true)
    ok = {"kind": "retention", "retention": {"drop": False, "ttl_turns": 2}}
    assert emits_problems(ok) == {}


def test_one_retention_per_decision_with_its_payload() -> None:
    twice = emits_problems(
        {"kind": "retention", "retention": {"drop": True}},
        {"kind": "retention", "retention": {"prefer_prefix_retention": True}},
    )
    assert list(twice) == [("emits", 1, "kind")]
    assert "emits[0] is one" in twice[("emits", 1, "kind")]
    assert "accepted: one retention per decision" in twice[("emits", 1, "kind")]
    bare = emits_problems({"kind": "retention"})
    assert list(bare) == [("emits", 0, "retention")]
    assert "accepted: retention: {drop, ttl_turns" in bare[("emits", 0, "retention")]
    with pytest.raises(ValidationError):
        Decision.model_validate(decision(emits=[{"kind": "log", "retention": {}}]))
    with pytest.raises(ValidationError):
        Decision.model_validate(decision(emits=[{"kind": "retention", "retention": {"ttl": 1}}]))
    with pytest.raises(ValidationError):
        Decision.model_validate(
            decision(emits=[{"kind": "retention", "retention": {"ttl_turns": -1}}])
        )


def memory(**conf: Any) -> list[Problem]:
    return routing_local_problems(
        {"decisions": [decision(plugins=[{"type": "memory", "configuration": conf}])]}
    )


def test_a_disabled_memory_plugin_is_accepted_and_an_enabled_one_refused_by_name() -> None:
    full = {
        "enabled": False,
        "retrieval_limit": 5,
        "similarity_threshold": 0.7,
        "auto_store": True,
        "hybrid_search": True,
        "hybrid_mode": "rrf",
        "reflection": {"enabled": True, "max_inject_tokens": 200, "block_patterns": ["x"]},
    }
    assert memory(**full) == []
    assert memory() == []  # enabled defaults to false, as upstream's bool
    (on,) = memory(enabled=True)
    assert on.path[-2:] == ("configuration", "enabled")
    assert "the memory plugin enabled: true" in on.message
    assert "not supported by vllm-sr; supported: enabled: false" in on.message
    assert "memory store" in on.message
    (extra,) = memory(enabled=False, recall_everything=True)
    assert extra.path[-1] == "recall_everything" and "'memory'" in extra.message
    (threshold,) = memory(similarity_threshold=1.5)
    assert threshold.path[-1] == "similarity_threshold" and "1.5" in threshold.message
