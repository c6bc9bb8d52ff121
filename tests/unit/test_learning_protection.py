"""Router Learning's protection (pure, on a fake clock): a conversation stays on its model
until ``min_turns_before_switch``, then moves only when the new model beats it by
``switch_margin`` (``stability_weight`` scaling the switch costs); an idle conversation starts
over; session scope keeps the session's model; observe computes without acting; the memory is
bounded and expires."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from vllm_sr.clock import FakeClock
from vllm_sr.router.learning.memory import ConversationMemory
from vllm_sr.router.learning.protection import Conversation, SwitchInput, switch
from vllm_sr.router.learning.settings import (
    LearningSettings,
    Tuning,
    for_decision,
)


def run(
    *,
    current: str = "a",
    turns: int = 2,
    scores: dict[str, float] | None = None,
    tuning: Tuning | None = None,
    idle_s: float | None = 10.0,
    mode: str = "apply",
    scope: str = "conversation",
    tool_loop: bool = False,
    evidence: dict[str, tuple[int, int, int]] | None = None,
) -> tuple[str, str, str, str]:
    """-> (model, action, reason, phase) for a turn whose proposal is b."""
    scores = scores if scores is not None else {"b": 1.0, "a": 0.0}
    ev = evidence or {}

    @dataclass
    class Ev:
        good_fit: int = 0
        underpowered: int = 0
        failed: int = 0

    result = switch(
        SwitchInput(
            mode=mode,
            scope=scope,
            tuning=tuning or Tuning(),
            conversation=Conversation(
                model=current, turns=turns, idle_s=idle_s, active_tool_loop=tool_loop
            ),
            candidates=list(scores),
            scores=scores,
            base_model="b",
            proposal="b",
            evidence=lambda m: Ev(*ev.get(m, (0, 0, 0))),
        )
    )
    p = result.policy
    return result.model, p.action, p.reason, p.phase


def test_a_new_conversation_takes_the_proposal_as_its_baseline() -> None:
    assert run(current="", turns=0, idle_s=None) == (
        "b",
        "establish_baseline",
        "new_conversation",
        "user_turn",
    )
    assert run(current="", turns=0, idle_s=None, scope="session")[2] == "new_session"


def test_min_turns_holds_the_current_model_then_lets_a_clear_winner_through() -> None:
    tuning = Tuning(min_turns_before_switch=3)
    assert run(turns=2, tuning=tuning)[:3] == ("a", "hold_current", "hard_lock=min_turns")
    assert run(turns=3, tuning=tuning)[:3] == ("b", "allow_switch", "switch_allowed")


@pytest.mark.parametrize(("margin", "model"), [(0.30, "b"), (0.40, "a")])
def test_a_switch_needs_the_margin(margin: float, model: str) -> None:
    # a: 0.5 + stay 0.10 + prefix; b: 1.0 - handoff 0.05 - prefix - margin (prefix ~0.009):
    # the switch pays off for margins below ~0.33
    got = run(scores={"b": 1.0, "a": 0.5}, tuning=Tuning(switch_margin=margin))
    assert got[0] == model
    if model == "a":
        assert got[1:3] == ("hold_current", "switch_margin_not_met")


def test_stability_weight_makes_switching_dearer() -> None:
    scores = {"b": 1.0, "a": 0.5}
    assert run(scores=scores, tuning=Tuning(switch_margin=0.3))[0] == "b"
    assert run(scores=scores, tuning=Tuning(switch_margin=0.3, stability_weight=3.0))[0] == "a"


def test_a_near_tie_stays_where_it_is() -> None:
    assert run(scores={"b": 1.0, "a": 0.999})[0] == "a"


def test_an_idle_conversation_starts_over() -> None:
    tuning = Tuning(min_turns_before_switch=5, idle_timeout_s=300)
    assert run(turns=1, tuning=tuning, idle_s=299.0)[0] == "a"
    assert run(turns=1, tuning=tuning, idle_s=300.0)[:3] == (
        "b",
        "establish_baseline",
        "idle_reset",
    )
    # 0: no idle timeout
    assert run(turns=1, tuning=Tuning(min_turns_before_switch=5, idle_timeout_s=0), idle_s=1e6)[
        0
    ] == ("a")


def test_session_scope_keeps_the_session_model_until_idle() -> None:
    assert run(turns=50, scope="session")[:3] == ("a", "hold_current", "session_scope_protect")
    assert run(turns=50, scope="session", idle_s=301.0)[0] == "b"


def test_a_tool_loop_locks_the_model() -> None:
    assert run(turns=50, tool_loop=True) == (
        "a",
        "hold_current",
        "tool_or_protocol_state",
        "tool_loop",
    )


def test_observe_computes_but_leaves_the_proposal() -> None:
    assert run(turns=0, mode="observe")[:3] == ("b", "observe", "observe_only")


def test_a_failing_current_model_is_rescued() -> None:
    tuning = Tuning(min_turns_before_switch=9)
    assert run(turns=1, tuning=tuning)[0] == "a"
    got = run(turns=1, tuning=tuning, evidence={"a": (0, 0, 2)})
    assert got[:3] == ("b", "rescue_switch", "rescue_evidence")
    # observe mode never rescues
    assert run(turns=1, tuning=tuning, evidence={"a": (0, 0, 2)}, mode="observe")[1] == "observe"


def test_decision_adaptations_follow_upstreams_effective_modes() -> None:
    s = LearningSettings(enabled=True, adaptation=True, protection=True)
    from vllm_sr.config.routing import Adaptations

    def modes(raw: dict[str, object]) -> tuple[str, str, str]:
        d = for_decision(s, Adaptations.model_validate(raw))
        return d.adaptation_mode, d.protection_mode, d.candidate_set

    assert modes({}) == ("apply", "apply", "decision")
    assert modes({"mode": "bypass"}) == ("bypass", "bypass", "decision")
    assert modes({"mode": "observe", "adaptation": {"mode": "bypass"}}) == (
        "bypass",
        "observe",
        "decision",
    )
    assert modes({"adaptation": {"mode": "observe", "candidate_set": "tier"}}) == (
        "observe",
        "apply",
        "tier",
    )
    d = for_decision(s, Adaptations.model_validate({"protection": {"switch_margin": 0.3}}))
    assert d.tuning.switch_margin == 0.3 and d.tuning.stability_weight == 1.0


def test_memory_counts_turns_and_switches_and_expires_on_the_clock() -> None:
    clock = FakeClock()
    mem = ConversationMemory(clock, ttl_s=100.0)
    mem.record_decision("s/c", "a", 0, "d")
    mem.record_decision("s/c", "a", 1, "d")
    clock.advance(5)
    mem.record_decision("s/c", "b", 1, "d")
    snap = mem.snapshot("s/c")
    assert snap is not None
    assert (snap.model, snap.turns, snap.switches, snap.idle_s) == ("b", 3, 1, 0.0)
    mem.record_answer("s/c", "a")  # a backend fallback answered on a
    clock.advance(50)
    snap = mem.snapshot("s/c")
    assert snap is not None and snap.model == "a" and snap.idle_s == 50.0
    mem.record_answer("unknown", "a")
    assert mem.snapshot("unknown") is None
    clock.advance(101)
    assert mem.snapshot("s/c") is None and len(mem) == 0


def test_memory_is_bounded_least_recently_seen_first() -> None:
    mem = ConversationMemory(FakeClock(), max_entries=3)
    for key in ("a", "b", "c"):
        mem.record_decision(key, "m", 0, "d")
    mem.record_decision("a", "m", 1, "d")  # a is fresh again
    mem.record_decision("d", "m", 0, "d")
    assert len(mem) == 3
    assert mem.snapshot("b") is None
    assert all(mem.snapshot(k) is not None for k in ("a", "c", "d"))


def test_memory_export_and_hydrate_carry_idle_time_across_clocks() -> None:
    """Another process's clock: the same wall time, another monotonic origin."""
    here = FakeClock(start=1000.0, wall_offset=1_700_000_000.0)
    there = FakeClock(start=9000.0, wall_offset=1_700_000_000.0 - 8000.0)
    mine, theirs = ConversationMemory(here), ConversationMemory(there)
    mine.record_decision("k", "a", 2, "d")
    here.advance(30)
    there.advance(30)
    doc = mine.export("k")
    assert doc is not None
    theirs.hydrate("k", doc)
    snap = theirs.snapshot("k")
    assert snap is not None
    assert (snap.model, snap.turns, snap.switches, snap.idle_s) == ("a", 3, 0, 30.0)
    theirs.hydrate("bad", {"model": 3, "turns": "x"})
    assert theirs.snapshot("bad") is None


def test_conversation_facts_from_the_messages() -> None:
    from vllm_sr.router.learning.facts import conversation_facts

    chat = [
        {"role": "system", "content": "s" * 40},
        {"role": "user", "content": "u" * 400},
        {"role": "assistant", "content": "a" * 400},
        {"role": "user", "content": [{"type": "text", "text": "q" * 80}]},
    ]
    facts = conversation_facts(chat)
    assert (facts.turn_index, facts.active_tool_loop) == (1, False)
    assert (facts.history_tokens, facts.context_tokens) == (210, 230)
    called = [*chat, {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]
    assert conversation_facts(called).active_tool_loop  # a call not answered yet
    answered = [*called, {"role": "tool", "content": "42", "tool_call_id": "1"}]
    assert conversation_facts(answered).active_tool_loop  # the last message is a tool result
    done = [*answered, {"role": "assistant", "content": "it is 42"}]
    assert not conversation_facts(done).active_tool_loop
    assert conversation_facts("junk") == conversation_facts([])
