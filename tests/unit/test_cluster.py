"""The cluster rules shared by worker replicas and LLM backends (vllm_sr.cluster): the
consecutive-failure streak, the ejection's cool-down, caps and the order of its rules, the
active health probe's schedule, least-loaded picking and the weighted round robin, and the
backoff's retry time, all on a fake clock."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest

from vllm_sr.backoff import Backoff
from vllm_sr.clock import FakeClock
from vllm_sr.cluster.ejection import (
    RULE_MAX_PERCENT,
    RULE_NO_OTHER_ANSWERED,
    RULE_ONE_WORKER,
    EjectionRules,
    Streak,
    decide,
)
from vllm_sr.cluster.health import HealthProbe
from vllm_sr.cluster.picking import least_loaded, weighted_pick


def rules(**kw: object) -> EjectionRules:
    base: dict[str, object] = {"threshold": 2, "base": 10, "cap": 70, "max_percent": 50}
    base.update(kw)
    return EjectionRules(**base)  # type: ignore[arg-type]


# -- streak + threshold ------------------------------------------------------------------------
def test_a_streak_keeps_when_it_began_and_a_success_ends_it() -> None:
    s = Streak()
    assert s.fail(5.0) == 1 and s.fail(7.0) == 2 and s.began_at == 5.0
    r = rules(threshold=3)
    assert not r.reached(s)
    s.fail(9.0)
    assert r.reached(s)
    s.reset()
    assert (s.count, s.began_at) == (0, None) and not r.reached(s)
    s.fail(10.0)
    assert s.began_at == 10.0


def test_threshold_zero_never_ejects() -> None:
    s = Streak()
    for _ in range(100):
        s.fail()
    assert not rules(threshold=0).enabled and not rules(threshold=0).reached(s)


# -- cool-down growth and caps -----------------------------------------------------------------
def test_cool_down_doubles_or_grows_linearly_up_to_the_cap() -> None:
    assert [rules(growth="double").cool_down(n) for n in range(1, 6)] == [10, 20, 40, 70, 70]
    assert [rules(growth="linear").cool_down(n) for n in range(1, 9)] == [
        10,
        20,
        30,
        40,
        50,
        60,
        70,
        70,
    ]
    assert rules(growth="double").cool_down(10**6) == 70  # no huge integer on the way
    assert isinstance(rules().cool_down(3), int)  # the caller's unit and type come back


def test_the_share_rounds_down_and_at_least_one_lets_one_out() -> None:
    plain, one = rules(max_percent=30), rules(max_percent=30, at_least_one=True)
    assert [plain.max_out(n) for n in (1, 2, 3, 4, 10)] == [0, 0, 0, 1, 3]
    assert [one.max_out(n) for n in (1, 2, 3, 4, 10)] == [1, 1, 1, 1, 3]


# -- decide: the rules in order ----------------------------------------------------------------
def test_decide_checks_one_member_then_answers_then_the_share() -> None:
    r = rules(max_percent=100, at_least_one=True)
    assert decide(r, members=1, out=0, nth=1, another_answered=False).rule == RULE_ONE_WORKER
    assert decide(r, members=3, out=2, nth=1, another_answered=False).rule == RULE_NO_OTHER_ANSWERED
    ok = decide(r, members=3, out=1, nth=2)
    assert ok.eject and ok.rule is None and ok.duration == 20


def test_decide_never_takes_out_the_last_member() -> None:
    every = rules(max_percent=100)
    assert decide(every, members=3, out=1, nth=1).eject
    held = decide(every, members=3, out=2, nth=1)
    assert not held.eject and held.rule == RULE_MAX_PERCENT
    none = rules(max_percent=0)
    assert decide(none, members=4, out=0, nth=1).rule == RULE_MAX_PERCENT
    # at_least_one still keeps one member in
    assert not decide(rules(max_percent=0, at_least_one=True), members=2, out=1, nth=1).eject
    assert decide(rules(max_percent=0, at_least_one=True), members=2, out=0, nth=1).eject


# -- health probe ------------------------------------------------------------------------------
def test_a_periodic_probe_is_due_at_once_and_then_every_period() -> None:
    clock = FakeClock()
    p = HealthProbe(clock, backoff_s=0.5, backoff_max_s=2.0, every_s=5.0)
    assert p.state == "unknown" and p.usable and p.due()
    p.record_success()
    clock.advance(4.9)
    assert not p.due()
    clock.advance(0.1)
    assert p.due()


def test_failed_probes_back_off_doubling_to_the_cap_and_a_success_resets() -> None:
    clock = FakeClock()
    p = HealthProbe(clock, backoff_s=0.5, backoff_max_s=2.0, every_s=5.0)
    waits = []
    for _ in range(4):
        p.record_failure("refused")
        assert p.next_check_at is not None
        waits.append(p.next_check_at - clock.monotonic())
        clock.advance(waits[-1])
    assert waits == [0.5, 1.0, 2.0, 2.0]
    assert not p.usable and p.failures == 4 and p.last_error == "refused"
    p.record_success()
    p.record_failure("again")
    assert p.next_check_at == clock.monotonic() + 0.5


def test_a_passive_probe_is_due_only_after_a_failure_and_once_taken() -> None:
    clock = FakeClock()
    p = HealthProbe(clock, backoff_s=0.1, backoff_max_s=3.2)
    assert p.next_check_at is None and not p.due()
    p.record_failure("503")
    assert not p.due()
    clock.advance(0.1)
    assert p.due()
    p.taken()
    assert not p.due() and p.next_check_at is None and not p.usable
    p.record_success()
    assert p.usable and p.next_check_at is None


# -- picking -----------------------------------------------------------------------------------
def test_least_loaded_breaks_ties_with_the_second_key_then_order() -> None:
    items = [("a", 3, 1), ("b", 1, 9), ("c", 1, 2), ("d", 1, 2)]
    assert least_loaded(items, lambda i: (i[1], i[2])) == ("c", 1, 2)
    assert least_loaded([], lambda i: (0, 0)) is None


@dataclass
class Member:
    name: str
    weight: int
    inflight: int = 0
    rr_current: int = 0


def test_weighted_pick_follows_weights_and_prefers_the_least_busy() -> None:
    group = [Member("a", 1), Member("b", 3)]
    assert Counter(weighted_pick(group).name for _ in range(40)) == {"a": 10, "b": 30}
    busy = [Member("a", 1), Member("b", 3, inflight=6)]  # 6/3 per weight vs 0/1
    assert weighted_pick(busy).name == "a"
    assert weighted_pick(busy, least_request=False).name == "b"


# -- the backoff's retry time ------------------------------------------------------------------
def test_backoff_fail_sets_the_retry_time_and_reset_clears_it() -> None:
    clock = FakeClock()
    b = Backoff(1.0, 4.0, clock=clock)
    assert b.due()
    assert b.fail() == clock.monotonic() + 1.0 and not b.due()
    clock.advance(1.0)
    assert b.due() and b.fail() == clock.monotonic() + 2.0
    b.reset()
    assert b.due() and b.retry_at is None and b.fail() == clock.monotonic() + 1.0


@pytest.mark.parametrize("growth", ["double", "linear"])
def test_cool_down_of_the_first_ejection_is_the_base(growth: str) -> None:
    assert rules(growth=growth).cool_down(1) == 10
