"""``global.router.learning`` and decision ``adaptations``: upstream's validator rules
(validator_learning.go) as config problems naming the field, the value and what is accepted;
the redis state store needs its address."""

from __future__ import annotations

import textwrap

import pytest

from tests.unit.test_upstream_configs import PROVIDERS, ROUTING
from vllm_sr.config.files import parse_config
from vllm_sr.errors import ConfigError


def _problems(text: str) -> list[str]:
    try:
        parse_config(textwrap.dedent(text))
    except ConfigError as exc:
        return list(exc.problems)
    return []


def _with_learning(block: str) -> str:
    return (
        PROVIDERS
        + ROUTING
        + "global:\n  router:\n    learning:\n"
        + textwrap.indent(textwrap.dedent(block), "      ")
    )


def test_the_full_block_loads_and_is_typed() -> None:
    text = _with_learning(
        """\
        enabled: true
        adaptation: {enabled: true, candidate_set: decision, strategy: routing_sampling}
        protection:
          enabled: true
          scope: session
          identity: {headers: {session: x-s, conversation: x-c}}
          tuning: {idle_timeout_seconds: 60, min_turns_before_switch: 2,
                   switch_margin: 0.1, stability_weight: 1.5}
        state_store: {backend: local, ttl_seconds: 600, timeout_ms: 50}
        """
    )
    cfg = parse_config(text)
    learning = cfg.global_.router.learning
    assert learning.enabled and learning.protection is not None
    assert learning.protection.scope == "session"
    assert learning.protection.tuning is not None
    assert learning.protection.tuning.switch_margin == 0.1


@pytest.mark.parametrize(
    ("block", "path", "words"),
    [
        (
            "enabled: true\nadaptation: {candidate_set: everything}",
            "global.router.learning.adaptation.candidate_set",
            "'everything' is not accepted; accepted: 'decision', 'tier', 'global'",
        ),
        (
            "adaptation: {strategy: thompson}",
            "global.router.learning.adaptation.strategy",
            "'thompson' is not accepted; accepted: 'routing_sampling'",
        ),
        (
            "protection: {scope: user}",
            "global.router.learning.protection.scope",
            "'user' is not accepted; accepted: 'conversation', 'session'",
        ),
        (
            "protection: {identity: {headers: {session: '  '}}}",
            "global.router.learning.protection.identity.headers.session",
            "an empty header name",
        ),
        (
            "state_store: {backend: memory}",
            "global.router.learning.state_store.backend",
            "'memory' is not accepted; accepted: 'local', 'redis'",
        ),
        (
            "protection: {tuning: {switch_margin: -0.1}}",
            "global.router.learning.protection.tuning.switch_margin",
            "is not accepted; accepted: a number >= 0.0",
        ),
        (
            "protection: {tuning: {min_turns_before_switch: -1}}",
            "global.router.learning.protection.tuning.min_turns_before_switch",
            "is not accepted; accepted: an integer >= 0",
        ),
    ],
)
def test_bad_values_name_field_value_and_what_is_accepted(
    block: str, path: str, words: str
) -> None:
    problems = _problems(_with_learning(block))
    hits = [p for p in problems if f": {path}: " in p]
    assert len(hits) == 1, problems
    assert words in hits[0]


def test_the_redis_state_store_needs_an_address() -> None:
    assert (
        _problems(
            _with_learning("enabled: true\nstate_store: {backend: redis, redis: {address: r:6379}}")
        )
        == []
    )
    (hit,) = _problems(_with_learning("enabled: true\nstate_store: {backend: redis}"))
    assert ": global.router.learning.state_store.redis.address: None for the redis backend; " in hit
    assert "accepted: host:port" in hit


DECISION = (
    PROVIDERS
    + """\
routing:
  decisions:
    - name: d
      modelRefs: [{model: small}]
      adaptations:
"""
)


@pytest.mark.parametrize(
    ("block", "path", "words"),
    [
        ("mode: sometimes", "adaptations.mode", "'sometimes' is not accepted"),
        (
            "mode: bypass\nadaptation: {mode: observe}",
            "adaptations.adaptation.mode",
            "'observe' under adaptations.mode 'bypass'",
        ),
        (
            "mode: observe\nprotection: {mode: apply}",
            "adaptations.protection.mode",
            "'apply' under adaptations.mode 'observe'",
        ),
        (
            "adaptation: {candidate_set: all}",
            "adaptations.adaptation.candidate_set",
            "'all' is not accepted; accepted: 'decision', 'tier', 'global'",
        ),
        (
            "protection: {stability_weight: -2}",
            "adaptations.protection.stability_weight",
            "is not accepted; accepted: a number >= 0.0",
        ),
    ],
)
def test_decision_adaptations_follow_upstreams_rules(block: str, path: str, words: str) -> None:
    problems = _problems(DECISION + textwrap.indent(block, "        ") + "\n")
    hits = [p for p in problems if f"routing.decisions[0].{path}: " in p]
    assert len(hits) == 1, problems
    assert words in hits[0]


def test_decision_adaptations_upstream_accepts_load() -> None:
    for block in (
        "mode: bypass",
        "mode: observe\nadaptation: {mode: observe}\nprotection: {mode: bypass}",
        "adaptation: {mode: apply, candidate_set: tier}\n"
        "protection: {stability_weight: 1.2, switch_margin: 0.04}",
    ):
        assert _problems(DECISION + textwrap.indent(block, "        ") + "\n") == [], block


@pytest.mark.parametrize("recipe", ["agent", "balance"])
def test_upstreams_recipes_with_learning_load_whole(recipe: str) -> None:
    from pathlib import Path

    path = (
        Path(__file__).resolve().parents[1] / "fixtures/upstream/recipes" / recipe / "config.yaml"
    )
    cfg = parse_config(path.read_text(encoding="utf-8"), str(path))
    learning = cfg.global_.router.learning
    assert learning.enabled and learning.protection is not None
    assert learning.protection.scope == "conversation"


def test_candidate_set_has_one_owner() -> None:
    """Values, default, field type and reading come from config.learning_rules; every reader
    (the adaptation's tables, the settings' default) covers exactly those values."""
    from vllm_sr.config.learning_rules import (
        CANDIDATE_SETS,
        DEFAULT_CANDIDATE_SET,
        candidate_set_of,
    )
    from vllm_sr.config.routing import LearningAdaptation as DecisionAdaptation
    from vllm_sr.config.upstream_learning import LearningAdaptation as GlobalAdaptation
    from vllm_sr.router.learning.adaptation import COST_MULTIPLIER, SAMPLING_MARGIN
    from vllm_sr.router.learning.settings import LearningSettings

    assert set(COST_MULTIPLIER) == set(SAMPLING_MARGIN) == set(CANDIDATE_SETS)
    assert LearningSettings().candidate_set == DEFAULT_CANDIDATE_SET in CANDIDATE_SETS
    assert candidate_set_of(" tier ") == "tier"
    assert candidate_set_of("  ") is None and candidate_set_of(None) is None
    decision = DecisionAdaptation.model_fields["candidate_set"]
    glob = GlobalAdaptation.model_fields["candidate_set"]
    # the same type and bounds (before: max_length 64 on one, 32 on the other)
    assert (decision.annotation, decision.metadata) == (glob.annotation, glob.metadata)
    assert "max_length=32" in repr(decision.annotation)
