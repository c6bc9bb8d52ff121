"""Outlier ejection on a fake clock: one scenario per sentence of the page's "Eject a replica
that keeps timing out" section (issue 5), over 1, 2, 3, 4 and 10 replicas where it matters."""

from __future__ import annotations

import heapq
from collections import Counter
from typing import Any

import pytest

from tests.unit.test_pool import exchange, make_pool
from vllm_sr import events as ev
from vllm_sr.clock import FakeClock
from vllm_sr.errors import Conflict, Overloaded, Unavailable
from vllm_sr.pool import Lease, ReplicaPool
from vllm_sr.pool.outlier import (
    RULE_MAX_PERCENT,
    RULE_NO_OTHER_ANSWERED,
    RULE_ONE_WORKER,
    WHY_COOLDOWN,
    WHY_MANUAL,
    WHY_NO_OTHER,
    WHY_SUCCESS,
    rules,
)

TIMEOUT_S = 2.0


def wait_out_backoff(pool: ReplicaPool, clock: FakeClock, rid: str) -> None:
    r = pool.replica(rid)
    if r.backoff_until is not None and r.backoff_until > clock.monotonic():
        clock.advance(r.backoff_until - clock.monotonic() + 1e-6)


def time_out(pool: ReplicaPool, clock: FakeClock, rid: str, times: int = 1) -> None:
    """``times`` exchanges pinned to ``rid`` that each run out of their deadline."""
    for _ in range(times):
        wait_out_backoff(pool, clock, rid)
        lease = pool.acquire(100, rid)
        clock.advance(TIMEOUT_S)
        pool.release(lease, "timeout")


def answer(pool: ReplicaPool, clock: FakeClock, rid: str) -> None:
    wait_out_backoff(pool, clock, rid)
    exchange(pool, clock, "success", rid)


def hang(pool: ReplicaPool, clock: FakeClock, rid: str, helper: str, times: int = 3) -> None:
    """``rid`` times out ``times`` exchanges in a row while ``helper`` answers during the
    first (the usual shape of one hung replica among healthy ones)."""
    wait_out_backoff(pool, clock, rid)
    lease = pool.acquire(100, rid)
    clock.advance(TIMEOUT_S / 2)
    answer(pool, clock, helper)
    clock.advance(TIMEOUT_S / 2)
    pool.release(lease, "timeout")
    time_out(pool, clock, rid, times - 1)


# ----------------------------------------------------------------- counting
@pytest.mark.parametrize("n", [2, 3, 4, 10])
def test_ejected_at_consecutive_timeouts(n: int) -> None:
    pool, clock, rec = make_pool(n)
    time_out(pool, clock, "primary-0")
    answer(pool, clock, "primary-1")
    time_out(pool, clock, "primary-0")
    assert not pool.replica("primary-0").ejected
    time_out(pool, clock, "primary-0")
    assert pool.replica("primary-0").ejected
    [event] = rec.of(ev.REPLICA_EJECTED)
    assert event == {
        "deployment": "primary",
        "replica": "primary-0",
        "device": "rocm:0",
        "pid": 100,
        "timeouts": 3,
        "duration_ms": 30_000,
        "reason": "consecutive_timeouts",
    }
    # Ejected replicas get no traffic; the others take it.
    assert "primary-0" not in {pool.acquire(0).replica_id for _ in range(3 * n)}


@pytest.mark.parametrize("threshold", [1, 2, 5])
def test_threshold_is_the_configured_count(threshold: int) -> None:
    pool, clock, _ = make_pool(3, consecutive_timeouts=threshold)
    hang(pool, clock, "primary-0", "primary-1", threshold)
    r = pool.replica("primary-0")
    assert r.ejected and r.consecutive_timeouts == threshold


def test_one_short_of_the_threshold_stays() -> None:
    pool, clock, _ = make_pool(3, consecutive_timeouts=5)
    hang(pool, clock, "primary-0", "primary-1", 4)
    assert not pool.replica("primary-0").ejected
    time_out(pool, clock, "primary-0")
    assert pool.replica("primary-0").ejected


@pytest.mark.parametrize("other", ["cancelled", "refused", "failure"])
def test_cancellations_refusals_failures_neither_count_nor_reset(other: str) -> None:
    pool, clock, _ = make_pool(3)
    time_out(pool, clock, "primary-0")
    answer(pool, clock, "primary-1")
    for _ in range(4):
        wait_out_backoff(pool, clock, "primary-0")
        exchange(pool, clock, other, "primary-0")
    assert pool.replica("primary-0").consecutive_timeouts == 1
    time_out(pool, clock, "primary-0")
    wait_out_backoff(pool, clock, "primary-0")
    exchange(pool, clock, other, "primary-0")
    assert not pool.replica("primary-0").ejected
    time_out(pool, clock, "primary-0")
    assert pool.replica("primary-0").ejected
    assert pool.replica("primary-0").consecutive_timeouts == 3


def test_a_successful_answer_starts_the_count_again() -> None:
    pool, clock, _ = make_pool(3)
    hang(pool, clock, "primary-0", "primary-1", times=2)
    answer(pool, clock, "primary-0")
    assert pool.replica("primary-0").consecutive_timeouts == 0
    hang(pool, clock, "primary-0", "primary-1", times=2)
    assert not pool.replica("primary-0").ejected
    time_out(pool, clock, "primary-0")
    assert pool.replica("primary-0").ejected


# ----------------------------------------------------------------- backoff while off or held back
def test_zero_turns_ejection_off_but_backoff_and_probes_stay() -> None:
    pool, clock, rec = make_pool(3, consecutive_timeouts=0)
    hang(pool, clock, "primary-0", "primary-1", times=10)
    r = pool.replica("primary-0")
    assert not r.ejected and r.consecutive_timeouts == 10
    assert rec.of(ev.REPLICA_EJECTED) == [] and rec.of(ev.REPLICA_EJECTION_WITHHELD) == []
    assert r.in_backoff(clock.monotonic()) and r.backoff_s == pytest.approx(3.2)
    assert "primary-0" in pool.outliers.take_probe_requests()
    assert "primary-0" not in {pool.acquire(0).replica_id for _ in range(6)}


def test_held_back_replica_still_backs_off_and_is_probed() -> None:
    pool, clock, _ = make_pool(1)
    time_out(pool, clock, "primary-0", 5)
    assert pool.outliers.take_probe_requests() == ["primary-0"]
    with pytest.raises(Unavailable):
        pool.acquire(0)
    wait_out_backoff(pool, clock, "primary-0")
    assert pool.acquire(0).replica_id == "primary-0"


# ----------------------------------------------------------------- cool-down
def test_ejection_probes_health_at_once() -> None:
    pool, clock, _ = make_pool(3)
    hang(pool, clock, "primary-0", "primary-1")
    assert "primary-0" in pool.outliers.take_probe_requests()
    pool.outliers.eject("primary-1", 5000)
    assert pool.outliers.take_probe_requests() == ["primary-1"]


def test_cooldown_ends_readmits_once_and_next_timeout_doubles_up_to_the_cap() -> None:
    pool, clock, rec = make_pool(3, base_ejection_ms=1000, max_ejection_ms=5000)
    hang(pool, clock, "primary-0", "primary-1")
    durations = []
    for _ in range(5):
        r = pool.replica("primary-0")
        assert r.ejected
        durations.append(rec.of(ev.REPLICA_EJECTED)[-1]["duration_ms"])
        clock.advance(durations[-1] / 1000 - 0.01)
        pool.outliers.tick()
        assert r.ejected
        clock.advance(0.011)
        for _ in range(3):  # several ticks, one transition
            pool.outliers.tick()
        assert not r.ejected
        answer(pool, clock, "primary-1")
        time_out(pool, clock, "primary-0")  # its next timeout ejects it again
    assert durations == [1000, 2000, 4000, 5000, 5000]
    readmits = rec.of(ev.REPLICA_READMITTED)
    assert [e["why"] for e in readmits] == [WHY_COOLDOWN] * 5
    assert pool.replica("primary-0").ejections == 6
    assert pool.metrics()["replicas"]["primary-0"]["readmissions"] == 5


def test_cooldown_end_is_applied_by_acquire_without_a_tick() -> None:
    pool, clock, rec = make_pool(2, base_ejection_ms=1000)
    hang(pool, clock, "primary-0", "primary-1")
    clock.advance(1.0)
    picks = {pool.acquire(0).replica_id for _ in range(4)}
    assert "primary-0" in picks
    assert [e["why"] for e in rec.of(ev.REPLICA_READMITTED)] == [WHY_COOLDOWN]


def test_default_max_is_ten_times_base() -> None:
    pool, clock, rec = make_pool(2, base_ejection_ms=1000)
    hang(pool, clock, "primary-0", "primary-1")
    for _ in range(6):
        clock.advance(rec.of(ev.REPLICA_EJECTED)[-1]["duration_ms"] / 1000)
        answer(pool, clock, "primary-1")
        time_out(pool, clock, "primary-0")
    assert [e["duration_ms"] for e in rec.of(ev.REPLICA_EJECTED)] == [
        1000,
        2000,
        4000,
        8000,
        10000,
        10000,
        10000,
    ]


def test_success_readmits_at_once_and_starts_over() -> None:
    pool, clock, rec = make_pool(3, base_ejection_ms=1000)
    # One exchange is still in flight on primary-0 when it gets ejected.
    time_out(pool, clock, "primary-0")
    answer(pool, clock, "primary-1")
    time_out(pool, clock, "primary-0")
    wait_out_backoff(pool, clock, "primary-0")
    late = pool.acquire(100, "primary-0")
    time_out(pool, clock, "primary-0")
    assert pool.replica("primary-0").ejected
    # First ejection at base, second (after cool-down) at twice the base.
    clock.advance(1.0)
    pool.outliers.tick()
    answer(pool, clock, "primary-1")
    time_out(pool, clock, "primary-0")
    assert rec.of(ev.REPLICA_EJECTED)[-1]["duration_ms"] == 2000
    pool.release(late, "success")
    r = pool.replica("primary-0")
    assert not r.ejected and r.consecutive_timeouts == 0 and r.backoff_s == 0.0
    assert rec.of(ev.REPLICA_READMITTED)[-1]["why"] == WHY_SUCCESS
    assert pool.acquire(0, "primary-0").replica_id == "primary-0"
    # Starts over: three timeouts again, and the base cool-down again.
    hang(pool, clock, "primary-0", "primary-1", times=2)
    assert not r.ejected
    time_out(pool, clock, "primary-0")
    assert r.ejected and rec.of(ev.REPLICA_EJECTED)[-1]["duration_ms"] == 1000


# ----------------------------------------------------------------- the rules that keep replicas
def test_one_worker_is_never_ejected_and_withheld_is_said_once() -> None:
    pool, clock, rec = make_pool(1)
    time_out(pool, clock, "primary-0", 20)
    r = pool.replica("primary-0")
    assert not r.ejected and r.consecutive_timeouts == 20
    withheld = rec.of(ev.REPLICA_EJECTION_WITHHELD)
    assert withheld == [
        {"deployment": "primary", "replica": "primary-0", "rule": RULE_ONE_WORKER, "timeouts": 3}
    ]
    assert pool.metrics()["withheld"][RULE_ONE_WORKER] == 1


@pytest.mark.parametrize("n", [2, 3, 4, 10])
def test_a_model_slow_on_every_replica_keeps_them_all(n: int) -> None:
    pool, clock, rec = make_pool(n)
    for _ in range(5):
        for i in range(n):
            time_out(pool, clock, f"primary-{i}")
    assert not any(r.ejected for r in pool.replicas())
    withheld = rec.of(ev.REPLICA_EJECTION_WITHHELD)
    assert sorted(e["replica"] for e in withheld) == sorted(f"primary-{i}" for i in range(n))
    assert {e["rule"] for e in withheld} == {RULE_NO_OTHER_ANSWERED}
    assert pool.inventory()["state"] == "ready"


def test_an_answer_from_before_the_timeouts_began_does_not_count() -> None:
    pool, clock, rec = make_pool(2)
    answer(pool, clock, "primary-1")
    time_out(pool, clock, "primary-0", 3)
    assert not pool.replica("primary-0").ejected
    assert rec.of(ev.REPLICA_EJECTION_WITHHELD)[0]["rule"] == RULE_NO_OTHER_ANSWERED
    # Once the other one answers, the next timeout ejects.
    answer(pool, clock, "primary-1")
    time_out(pool, clock, "primary-0")
    assert pool.replica("primary-0").ejected


def test_an_answer_from_a_replica_that_has_since_gone_does_not_count() -> None:
    pool, clock, rec = make_pool(3, max_ejection_percent=100)
    hang(pool, clock, "primary-0", "primary-1", times=1)
    pool.mark_exited("primary-1", "signal 9")  # the one that answered is gone
    time_out(pool, clock, "primary-0", 2)
    assert not pool.replica("primary-0").ejected
    assert rec.of(ev.REPLICA_EJECTION_WITHHELD)[-1]["rule"] == RULE_NO_OTHER_ANSWERED


@pytest.mark.parametrize(
    ("n", "percent", "allowed"),
    [
        (2, 50, 1),
        (3, 50, 1),  # 1.5 rounds down
        (4, 50, 2),
        (10, 50, 5),
        (4, 10, 1),  # 0.4 rounds down to 0, but one may always be out
        (10, 0, 1),  # even at 0 %
        (10, 33, 3),
        (4, 100, 3),  # the last one is kept by the "another answered" rule
    ],
)
def test_max_ejection_percent_rounds_down_but_one_may_always_be_out(
    n: int, percent: int, allowed: int
) -> None:
    pool, clock, rec = make_pool(n, max_ejection_percent=percent, base_ejection_ms=3_600_000)
    healthy = f"primary-{n - 1}"
    for i in range(n - 1):
        hang(pool, clock, f"primary-{i}", healthy)
    ejected = [r.id for r in pool.replicas() if r.ejected]
    assert ejected == [f"primary-{i}" for i in range(allowed)]
    assert pool.inventory()["ejected_replicas"] == allowed
    rules = {e["replica"]: e["rule"] for e in rec.of(ev.REPLICA_EJECTION_WITHHELD)}
    assert rules == {f"primary-{i}": RULE_MAX_PERCENT for i in range(allowed, n - 1)}


def test_a_slot_freed_by_readmission_lets_the_next_timeout_eject() -> None:
    pool, clock, _ = make_pool(4, max_ejection_percent=25, base_ejection_ms=10_000)
    hang(pool, clock, "primary-0", "primary-3")
    hang(pool, clock, "primary-1", "primary-3")
    assert not pool.replica("primary-1").ejected
    clock.advance(10.0)
    pool.outliers.tick()
    answer(pool, clock, "primary-3")
    time_out(pool, clock, "primary-1")
    assert pool.replica("primary-1").ejected


def test_withheld_is_said_once_per_rule_change() -> None:
    pool, clock, rec = make_pool(3)
    time_out(pool, clock, "primary-0", 3)  # nobody else answered
    time_out(pool, clock, "primary-0", 3)
    answer(pool, clock, "primary-2")
    hang(pool, clock, "primary-1", "primary-2")  # takes the one slot (3 x 50 % -> 1)
    time_out(pool, clock, "primary-0", 3)
    rules = [e["rule"] for e in rec.of(ev.REPLICA_EJECTION_WITHHELD) if e["replica"] == "primary-0"]
    assert rules == [RULE_NO_OTHER_ANSWERED, RULE_MAX_PERCENT]


@pytest.mark.parametrize("n", [2, 3, 4, 10])
def test_ejected_serve_again_when_no_other_replica_can(n: int) -> None:
    pool, clock, rec = make_pool(n, max_ejection_percent=100, base_ejection_ms=3_600_000)
    last = f"primary-{n - 1}"
    for i in range(n - 1):
        hang(pool, clock, f"primary-{i}", last)
    assert pool.inventory()["ejected_replicas"] == n - 1
    assert rec.of(ev.REPLICA_READMITTED) == []
    pool.mark_exited(last, "signal 9")
    readmitted = rec.of(ev.REPLICA_READMITTED)
    assert sorted(e["replica"] for e in readmitted) == [f"primary-{i}" for i in range(n - 1)]
    assert {e["why"] for e in readmitted} == {WHY_NO_OTHER}
    wait_out_backoff(pool, clock, "primary-0")
    assert pool.acquire(0).replica_id != last
    assert pool.inventory()["state"] != "unavailable"


def test_ejected_serve_again_when_the_other_fails_its_probe() -> None:
    pool, clock, rec = make_pool(2)
    hang(pool, clock, "primary-0", "primary-1")
    pool.outliers.probe_result("primary-1", False, "503")
    assert rec.of(ev.REPLICA_READMITTED)[0]["why"] == WHY_NO_OTHER
    wait_out_backoff(pool, clock, "primary-0")
    assert pool.acquire(0).replica_id == "primary-0"
    # Still hanging: held back, since nobody else can answer.
    time_out(pool, clock, "primary-0")
    assert not pool.replica("primary-0").ejected
    assert rec.of(ev.REPLICA_EJECTION_WITHHELD)[-1]["rule"] == RULE_NO_OTHER_ANSWERED


def test_one_other_replica_left_keeps_the_ejection() -> None:
    pool, clock, rec = make_pool(3)
    hang(pool, clock, "primary-0", "primary-2")
    pool.mark_draining("primary-1")
    assert pool.replica("primary-0").ejected and rec.of(ev.REPLICA_READMITTED) == []


# ----------------------------------------------------------------- inventory, metrics, manual
def test_inventory_reports_the_ejection() -> None:
    pool, clock, _ = make_pool(2, base_ejection_ms=30_000)
    hang(pool, clock, "primary-0", "primary-1")
    inv = pool.inventory()
    rep = inv["replicas"][0]
    assert (rep["state"], rep["ready"], rep["ejections"], rep["consecutive_timeouts"]) == (
        "ejected",
        True,
        1,
        3,
    )
    assert rep["ejected_until"] == pytest.approx(clock.time() + 30.0)
    assert (inv["ejected_replicas"], inv["ready_replicas"], inv["state"]) == (1, 2, "degraded")
    clock.advance(30.0)
    rep = pool.inventory()["replicas"][0]
    assert (rep["state"], rep["ejected_until"]) == ("ready", None)


def test_metrics_count_ejections_readmissions_and_withheld() -> None:
    pool, clock, _ = make_pool(2, base_ejection_ms=1000)
    time_out(pool, clock, "primary-1", 3)
    hang(pool, clock, "primary-0", "primary-1")
    clock.advance(1.0)
    pool.outliers.tick()
    m = pool.metrics()
    assert m["replicas"]["primary-0"]["ejections"] == 1
    assert m["replicas"]["primary-0"]["readmissions"] == 1
    assert m["replicas"]["primary-0"]["requests"]["timeout"] == 3
    assert m["withheld"] == {RULE_ONE_WORKER: 0, RULE_NO_OTHER_ANSWERED: 1, RULE_MAX_PERCENT: 0}


def test_manual_eject_and_readmit() -> None:
    pool, _, rec = make_pool(2)
    pool.outliers.eject("primary-0", 5000)
    assert rec.of(ev.REPLICA_EJECTED)[-1]["reason"] == "manual"
    assert rec.of(ev.REPLICA_EJECTED)[-1]["duration_ms"] == 5000
    with pytest.raises(Conflict, match="no other replica"):
        pool.outliers.eject("primary-1", 5000)
    assert pool.outliers.readmit("primary-0") is True
    assert rec.of(ev.REPLICA_READMITTED)[-1]["why"] == WHY_MANUAL
    assert pool.outliers.readmit("primary-0") is False
    pool.outliers.eject("primary-1")
    assert rec.of(ev.REPLICA_EJECTED)[-1]["duration_ms"] == 30_000
    with pytest.raises(ValueError, match="duration_ms"):
        pool.outliers.eject("primary-0", 0)


def test_policy_arithmetic() -> None:
    policy = rules(base_ejection_ms=30_000, max_ejection_ms=300_000)
    assert [policy.cool_down(k + 1) for k in range(6)] == [
        30_000,
        60_000,
        120_000,
        240_000,
        300_000,
        300_000,
    ]
    assert policy.cool_down(10_000) == 300_000
    assert [policy.max_out(n) for n in (1, 2, 3, 4, 10)] == [1, 1, 1, 2, 5]
    assert not rules(consecutive_timeouts=0).enabled


# ----------------------------------------------------------------- steady load (simulated)
def simulate(
    pool: ReplicaPool,
    clock: FakeClock,
    hung: set[str],
    seconds: float,
    per_tick: int = 4,
    tick: float = 0.01,
    latency: float = 0.02,
) -> dict[str, Any]:
    """Steady load on a fake clock: ``per_tick`` requests every ``tick``; replicas in ``hung``
    never answer (their exchanges time out after TIMEOUT_S), the others answer in ``latency``."""
    pending: list[tuple[float, int, Lease, str]] = []
    sent: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    first_timeout = None
    seq = 0
    end = clock.monotonic() + seconds
    while clock.monotonic() < end:
        now = clock.monotonic()
        while pending and pending[0][0] <= now:
            _, _, lease, outcome = heapq.heappop(pending)
            pool.release(lease, outcome)  # type: ignore[arg-type]
            outcomes[outcome] += 1
            if outcome == "timeout" and first_timeout is None:
                first_timeout = now
        for _ in range(per_tick):
            try:
                lease = pool.acquire(100)
            except (Overloaded, Unavailable):
                outcomes["rejected"] += 1
                continue
            sent[lease.replica_id] += 1
            slow = lease.replica_id in hung
            seq += 1
            due = now + (TIMEOUT_S if slow else latency)
            heapq.heappush(pending, (due, seq, lease, "timeout" if slow else "success"))
        pool.outliers.tick()
        clock.advance(tick)
    return {"sent": sent, "outcomes": outcomes, "first_timeout": first_timeout}


def test_steady_load_one_hung_replica_is_ejected_and_others_take_its_traffic() -> None:
    pool, clock, rec = make_pool(3, timeout_ms=int(TIMEOUT_S * 1000))
    start = clock.monotonic()
    result = simulate(pool, clock, {"primary-1"}, seconds=20.0)
    [ejected] = rec.of(ev.REPLICA_EJECTED)
    assert ejected["replica"] == "primary-1"
    eject_at = start + TIMEOUT_S  # its first exchanges run out together
    assert result["first_timeout"] == pytest.approx(eject_at, abs=0.02)
    total = sum(result["outcomes"].values())
    failed = result["outcomes"]["timeout"] + result["outcomes"]["rejected"]
    assert failed / total < 0.01
    # Once out, the hung replica got nothing more (only what was sent before the first timeout).
    assert result["sent"]["primary-1"] == result["outcomes"]["timeout"]
    assert result["sent"]["primary-0"] > 3000 and result["sent"]["primary-2"] > 3000


def test_steady_load_hang_ends_and_the_replica_is_readmitted() -> None:
    pool, clock, rec = make_pool(3, timeout_ms=2000, base_ejection_ms=5000)
    simulate(pool, clock, {"primary-1"}, seconds=4.0)
    assert pool.replica("primary-1").ejected
    result = simulate(pool, clock, set(), seconds=10.0)
    assert [e["why"] for e in rec.of(ev.REPLICA_READMITTED)] == [WHY_COOLDOWN]
    assert result["sent"]["primary-1"] > 500
    assert pool.replica("primary-1").consecutive_timeouts == 0


def test_steady_load_slow_on_every_replica_ejects_none() -> None:
    pool, clock, rec = make_pool(3, timeout_ms=2000)
    simulate(pool, clock, {"primary-0", "primary-1", "primary-2"}, seconds=10.0)
    assert rec.of(ev.REPLICA_EJECTED) == []
    assert {e["rule"] for e in rec.of(ev.REPLICA_EJECTION_WITHHELD)} == {RULE_NO_OTHER_ANSWERED}


def test_ejection_survives_a_restart_of_the_worker() -> None:
    """A new process of a replica that hung keeps serving out its cool-down (a stuck device
    hangs the new process too); ``readmit`` is the way to cut it short."""
    pool, clock, rec = make_pool(3, base_ejection_ms=10_000)
    hang(pool, clock, "primary-0", "primary-1")
    pool.mark_exited("primary-0", "signal 9")
    pool.mark_starting("primary-0", 999)
    assert pool.mark_ready("primary-0", 999, {"max_num_seqs": 64}, 1)
    assert pool.inventory()["replicas"][0]["state"] == "ejected"
    assert "primary-0" not in {pool.acquire(0).replica_id for _ in range(6)}
    assert pool.outliers.readmit("primary-0")
    assert rec.of(ev.REPLICA_READMITTED)[-1]["why"] == WHY_MANUAL


def test_restore_readmits_only_replicas_that_can_serve() -> None:
    pool, clock, rec = make_pool(3, max_ejection_percent=100, base_ejection_ms=600_000)
    hang(pool, clock, "primary-0", "primary-2")
    hang(pool, clock, "primary-1", "primary-2")
    pool.mark_exited("primary-0", "signal 9")
    pool.mark_exited("primary-2", "signal 9")
    [event] = rec.of(ev.REPLICA_READMITTED)
    assert (event["replica"], event["why"]) == ("primary-1", WHY_NO_OTHER)
    assert pool.replica("primary-0").ejected
