"""ReplicaPool admission, dispatch, failure backoff, lifecycle, limits and inventory, on a
fake clock (the page's "How requests are dispatched" and issue 4's Pool section)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_sr import events as ev
from vllm_sr.clock import FakeClock
from vllm_sr.errors import Conflict, NotFound, Overloaded, Unavailable
from vllm_sr.pool import OUTCOMES, Lease, PoolSettings, ReplicaPool, ReplicaState


class Recorder:
    """Stands in for EventBus.publish."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, name: str, **fields: Any) -> None:
        self.events.append((name, fields))

    def of(self, name: str) -> list[dict[str, Any]]:
        return [f for n, f in self.events if n == name]

    def names(self) -> list[str]:
        return [n for n, _ in self.events]


def make_pool(
    n: int, clock: FakeClock | None = None, **overrides: Any
) -> tuple[ReplicaPool, FakeClock, Recorder]:
    clock = clock or FakeClock()
    rec = Recorder()
    pool = ReplicaPool(
        "primary",
        settings=PoolSettings(**overrides),
        clock=clock,
        emit=rec,
        artifact="vllm-sr/d3-edge",
    )
    for i in range(n):
        pool.add_replica(f"primary-{i}", f"rocm:{i}")
        assert pool.mark_ready(f"primary-{i}", 100 + i, {"max_num_seqs": 64}, 1)
    return pool, clock, rec


def exchange(
    pool: ReplicaPool,
    clock: FakeClock,
    outcome: str,
    replica_id: str | None = None,
    took: float = 0.01,
    nbytes: int = 100,
) -> str:
    lease = pool.acquire(nbytes, replica_id)
    clock.advance(took)
    pool.release(lease, outcome)  # type: ignore[arg-type]
    return lease.replica_id


# ----------------------------------------------------------------- pick rule
def test_pick_prefers_fewest_outstanding_bytes() -> None:
    pool, _, _ = make_pool(3)
    a = pool.acquire(1000)
    b = pool.acquire(10)
    c = pool.acquire(500)
    assert len({a.replica_id, b.replica_id, c.replica_id}) == 3
    # Outstanding: a=1000, b=10, c=500 -> the next goes to b's replica.
    assert pool.acquire(1).replica_id == b.replica_id
    pool.release(a, "success")
    # a's replica is empty now.
    assert pool.acquire(1).replica_id == a.replica_id


def test_ties_go_to_the_least_recently_assigned() -> None:
    pool, _, _ = make_pool(3)
    order = []
    for _ in range(6):
        lease = pool.acquire(0)  # zero bytes: always a tie on bytes
        order.append(lease.replica_id)
        pool.release(lease, "success")
    assert order == ["primary-0", "primary-1", "primary-2"] * 2


def test_release_returns_bytes_and_inflight() -> None:
    pool, _, _ = make_pool(1)
    leases = [pool.acquire(100) for _ in range(6)]
    r = pool.replica("primary-0")
    assert (r.inflight, r.outstanding_bytes) == (6, 600)
    for lease, outcome in zip(leases, OUTCOMES, strict=True):
        pool.release(lease, outcome)
    assert (r.inflight, r.outstanding_bytes) == (0, 0)
    assert r.outcomes == {
        "success": 1,
        "timeout": 1,
        "failure": 1,
        "cancelled": 1,
        "refused": 1,
        "no_forward": 1,
    }


def test_second_release_of_a_lease_is_ignored() -> None:
    pool, _, _ = make_pool(1)
    first, second = pool.acquire(10), pool.acquire(20)
    pool.release(first, "success")
    pool.release(first, "success")
    r = pool.replica("primary-0")
    assert (r.inflight, r.outstanding_bytes, r.outcomes["success"]) == (1, 20, 1)
    pool.release(second, "success")
    assert (r.inflight, r.outstanding_bytes) == (0, 0)


def test_release_for_a_removed_replica_is_harmless() -> None:
    pool, _, _ = make_pool(2)
    lease = pool.acquire(10, "primary-1")
    pool.mark_draining("primary-1")
    pool.remove_replica("primary-1")
    pool.release(lease, "success")
    assert "primary-1" not in pool


def test_unknown_outcome_is_refused_with_the_accepted_ones() -> None:
    pool, _, _ = make_pool(1)
    lease = pool.acquire(1)
    with pytest.raises(ValueError, match="success, timeout, failure, cancelled, refused"):
        pool.release(lease, "boom")  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=6),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("acquire"), st.integers(min_value=0, max_value=5000)),
            st.tuples(st.just("release"), st.integers(min_value=0, max_value=1000)),
        ),
        max_size=120,
    ),
)
def test_pick_rule_property(n: int, ops: list[tuple[str, int]]) -> None:
    """Every admitted exchange goes to an admissible replica with the fewest outstanding
    bytes, and among those to the least recently assigned; accounting always balances."""
    pool, _, _ = make_pool(n, max_inflight_per_replica=4)
    held: list[Lease] = []
    last: dict[str, int] = {}
    step = 0
    for op, arg in ops:
        if op == "release":
            if held:
                pool.release(held.pop(arg % len(held)), "success")
            continue
        before = {r.id: (r.outstanding_bytes, r.inflight) for r in pool.replicas()}
        open_ = [rid for rid, (_, inflight) in before.items() if inflight < 4]
        try:
            lease = pool.acquire(arg)
        except Overloaded:
            assert not open_
            continue
        step += 1
        chosen = lease.replica_id
        assert chosen in open_
        least = min(before[rid][0] for rid in open_)
        assert before[chosen][0] == least
        tied = [rid for rid in open_ if before[rid][0] == least]
        assert last.get(chosen, 0) == min(last.get(rid, 0) for rid in tied)
        last[chosen] = step
        held.append(lease)
    for r in pool.replicas():
        mine = [lease for lease in held if lease.replica_id == r.id]
        assert r.inflight == len(mine)
        assert r.outstanding_bytes == sum(lease.nbytes for lease in mine)


# ----------------------------------------------------------------- admission
@pytest.mark.parametrize("n", [1, 2, 3])
def test_admits_32_per_replica_then_overloaded_with_no_queue(n: int) -> None:
    pool, _, _ = make_pool(n)
    leases = [pool.acquire(10) for _ in range(32 * n)]
    assert all(r.inflight == 32 for r in pool.replicas())
    for _ in range(3):
        with pytest.raises(Overloaded) as info:
            pool.acquire(10)
        assert info.value.http_status == 429 and info.value.retry_after_s > 0
    assert pool.metrics()["rejected"]["overloaded"] == 3
    pool.release(leases[0], "success")
    assert pool.acquire(10).replica_id == leases[0].replica_id


def test_unavailable_when_none_ready() -> None:
    pool, _, _ = make_pool(0)
    with pytest.raises(Unavailable):
        pool.acquire(1)
    pool.add_replica("primary-0", "cpu")
    with pytest.raises(Unavailable) as info:
        pool.acquire(1)
    assert info.value.http_status == 503
    assert info.value.details["replicas"] == {"primary-0": "starting"}
    pool.mark_ready("primary-0", 7, {}, 1)
    assert pool.acquire(1).replica_id == "primary-0"


@pytest.mark.parametrize(
    "transition",
    [
        lambda p: p.mark_exited("primary-0", "signal 9"),
        lambda p: p.mark_failed("primary-0", "golden check failed"),
        lambda p: p.mark_draining("primary-0"),
        lambda p: p.mark_stopped("primary-0"),
        lambda p: p.mark_starting("primary-0", 555),
        lambda p: p.mark_backoff_restart("primary-0", 2000.0),
        lambda p: p.outliers.probe_result("primary-0", False, "503 loading"),
        lambda p: p.mark_hung("primary-0", "hung: forward running 12.0 s > bound 10.0 s"),
    ],
)
def test_only_ready_healthy_replicas_take_requests(transition: Any) -> None:
    pool, _, _ = make_pool(2)
    transition(pool)
    assert {pool.acquire(1).replica_id for _ in range(10)} == {"primary-1"}
    assert not pool.inventory()["replicas"][0]["ready"]


def test_draining_replica_finishes_what_it_has() -> None:
    pool, _, _ = make_pool(2)
    lease = pool.acquire(10, "primary-0")
    pool.mark_draining("primary-0")
    assert pool.replica("primary-0").state is ReplicaState.DRAINING
    assert not pool.idle("primary-0")
    assert pool.acquire(1).replica_id == "primary-1"
    pool.release(lease, "success")
    assert pool.idle("primary-0")


def test_pinned_acquire_follows_admission() -> None:
    pool, _, _ = make_pool(2, max_inflight_per_replica=1)
    pool.acquire(1, "primary-1")
    with pytest.raises(Overloaded):
        pool.acquire(1, "primary-1")
    assert pool.acquire(1).replica_id == "primary-0"
    with pytest.raises(NotFound, match="primary-9"):
        pool.acquire(1, "primary-9")


def test_unhealthy_probe_then_healthy_probe() -> None:
    pool, _, _ = make_pool(1)
    pool.outliers.probe_result("primary-0", False, "connection refused")
    with pytest.raises(Unavailable):
        pool.acquire(1)
    assert pool.inventory()["replicas"][0]["last_error"] == "connection refused"
    pool.outliers.probe_result("primary-0", True)
    assert pool.acquire(1).replica_id == "primary-0"


def test_unhealthy_replica_is_probed_again_with_doubling_intervals() -> None:
    """It gets no traffic, so nothing else would ever probe it again."""
    pool, clock, _ = make_pool(2)
    intervals = []
    for _ in range(7):
        pool.outliers.probe_result("primary-0", False, "timed out")
        start = clock.monotonic()
        assert pool.outliers.take_probe_requests() == []
        wait = pool.outliers.tick()
        assert wait is not None
        clock.advance(wait)
        pool.outliers.tick()
        assert pool.outliers.take_probe_requests() == ["primary-0"]
        intervals.append(round(clock.monotonic() - start, 6))
    assert intervals == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 3.2]
    pool.outliers.probe_result("primary-0", True)
    clock.advance(10)
    pool.outliers.tick()
    assert pool.outliers.take_probe_requests() == []
    assert "primary-0" in {pool.acquire(0).replica_id for _ in range(2)}


# ----------------------------------------------------------------- failure backoff
@pytest.mark.parametrize("outcome", ["failure", "timeout"])
def test_failure_backoff_doubles_to_cap_and_success_clears_it(outcome: str) -> None:
    pool, clock, _ = make_pool(1, consecutive_timeouts=0)
    seen = []
    for _ in range(8):
        exchange(pool, clock, outcome, took=0.0)
        r = pool.replica("primary-0")
        seen.append(r.backoff_s)
        with pytest.raises(Unavailable) as info:
            pool.acquire(1)
        assert info.value.details["retry_after_s"] == pytest.approx(r.backoff_s)
        clock.advance(r.backoff_s - 0.001)
        with pytest.raises(Unavailable):
            pool.acquire(1)
        clock.advance(0.002)
    assert seen == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 3.2, 3.2])
    exchange(pool, clock, "success")
    assert pool.replica("primary-0").backoff_s == 0.0
    exchange(pool, clock, outcome, took=0.0)
    assert pool.replica("primary-0").backoff_s == pytest.approx(0.1)


def test_burst_of_failures_in_flight_together_is_one_backoff_step() -> None:
    pool, clock, _ = make_pool(1)
    leases = [pool.acquire(10) for _ in range(32)]
    clock.advance(1.0)
    for lease in leases:
        pool.release(lease, "failure")
    assert pool.replica("primary-0").backoff_s == pytest.approx(0.1)


def test_backoff_moves_traffic_to_the_other_replica_and_probes() -> None:
    pool, clock, _ = make_pool(2)
    exchange(pool, clock, "failure", "primary-0", took=0.0)
    assert pool.outliers.take_probe_requests() == ["primary-0"]
    assert pool.outliers.take_probe_requests() == []
    assert {pool.acquire(0).replica_id for _ in range(5)} == {"primary-1"}
    clock.advance(0.1)
    assert "primary-0" in {pool.acquire(0).replica_id for _ in range(5)}


@pytest.mark.parametrize("outcome", ["cancelled", "refused"])
def test_cancelled_and_refused_neither_back_off_nor_probe(outcome: str) -> None:
    pool, clock, _ = make_pool(1)
    exchange(pool, clock, outcome)
    assert pool.outliers.take_probe_requests() == []
    assert pool.acquire(1).replica_id == "primary-0"


def test_tick_reports_the_next_transition() -> None:
    pool, clock, _ = make_pool(2)
    assert pool.outliers.tick() is None
    exchange(pool, clock, "failure", "primary-0", took=0.0)
    assert pool.outliers.tick() == pytest.approx(0.1)
    clock.advance(0.1)
    assert pool.outliers.tick() is None


# ----------------------------------------------------------------- limits
def test_limits_that_differ_from_config_make_a_replica_incompatible() -> None:
    pool, _, rec = make_pool(0, configured_max_num_seqs=64, configured_max_num_batched_tokens=8192)
    pool.add_replica("primary-0", "rocm:0")
    pool.add_replica("primary-1", "rocm:1")
    assert pool.mark_ready("primary-0", 10, {"max_num_seqs": 64, "max_num_batched_tokens": 8192})
    assert not pool.mark_ready(
        "primary-1", 11, {"max_num_seqs": 64, "max_num_batched_tokens": 4096}
    )
    inv = pool.inventory()["replicas"][1]
    assert inv["state"] == "incompatible" and not inv["ready"]
    assert "max_num_batched_tokens is 4096, config sets 8192" in inv["last_error"]
    assert rec.of(ev.REPLICA_INCOMPATIBLE)[0]["replica"] == "primary-1"
    assert {pool.acquire(0).replica_id for _ in range(4)} == {"primary-0"}


def test_unset_limits_may_differ_per_replica_and_are_reported() -> None:
    pool, _, _ = make_pool(0, configured_max_num_seqs=64)
    for i, tokens in enumerate([8192, 16384]):
        pool.add_replica(f"primary-{i}", f"rocm:{i}")
        limits = {"max_num_seqs": 64, "max_num_batched_tokens": tokens}
        assert pool.mark_ready(f"primary-{i}", i, limits)
    reported = [r["limits"]["max_num_batched_tokens"] for r in pool.inventory()["replicas"]]
    assert reported == [8192, 16384]


# ----------------------------------------------------------------- inventory + settings
def test_inventory_shape_and_deployment_state() -> None:
    pool, clock, _ = make_pool(2)
    pool.desired_replicas = 2
    exchange(pool, clock, "success", "primary-0", took=0.02)
    inv = pool.inventory()
    assert set(inv) == {
        "name",
        "artifact",
        "state",
        "desired_replicas",
        "ready_replicas",
        "ejected_replicas",
        "frontend_cache_bytes",
        "replicas",
    }
    assert (inv["name"], inv["artifact"], inv["state"]) == ("primary", "vllm-sr/d3-edge", "ready")
    assert inv["frontend_cache_bytes"] == 0  # several replicas: each worker keeps its own
    pool.desired_replicas = 1
    assert pool.inventory()["frontend_cache_bytes"] == 64 * 1024 * 1024
    pool.desired_replicas = 2
    rep = inv["replicas"][0]
    assert set(rep) == {
        "id", "deployment", "device", "pid", "state", "ready", "inflight", "max_inflight",
        "outstanding_bytes", "restarts", "limits", "last_error", "ejected_until", "ejections",
        "consecutive_timeouts", "threads", "requests", "requests_per_s", "latency_p50_ms",
        "latency_p99_ms", "adaptive_threads", "requests_by_kind", "retried_away",
        "restart_reason", "usage", "revision", "supervision_failures", "dtype",
        "result_cache_bytes",
    }  # fmt: skip
    assert rep["latency_p50_ms"] == pytest.approx(20.0)
    assert (rep["requests"], rep["pid"], rep["device"], rep["max_inflight"]) == (
        1,
        100,
        "rocm:0",
        32,
    )
    pool.mark_exited("primary-1", "signal 9")
    assert pool.inventory()["state"] == "degraded"
    assert pool.inventory()["ready_replicas"] == 1
    pool.mark_exited("primary-0", "signal 9")
    assert pool.inventory()["state"] == "unavailable"


def test_restarts_and_adaptive_threads_show_in_inventory() -> None:
    pool, _, _ = make_pool(1)
    pool.increment_restarts("primary-0")
    assert pool.increment_restarts("primary-0") == 2
    pool.set_adaptive_threads("primary-0", {"mode": 1})
    rep = pool.inventory()["replicas"][0]
    assert (rep["restarts"], rep["adaptive_threads"]) == (2, {"mode": 1})
    pool.set_restarts("primary-0", 0)
    assert pool.inventory()["replicas"][0]["restarts"] == 0


def test_a_hung_replica_is_out_until_its_next_process_is_ready() -> None:
    pool, _, _ = make_pool(2)
    reason = "hung: forward running 12.0 s > bound 10.0 s"
    pool.mark_hung("primary-0", reason)
    doc = pool.inventory()["replicas"][0]
    assert (doc["state"], doc["ready"], doc["last_error"]) == ("hung", False, reason)
    pool.mark_exited("primary-0", reason)  # killed: the exit carries the hang as its reason
    assert pool.inventory()["replicas"][0]["restart_reason"] == reason
    pool.mark_starting("primary-0", 777)
    assert {pool.acquire(1).replica_id for _ in range(4)} == {"primary-1"}
    assert pool.mark_ready("primary-0", 777, {"max_num_seqs": 64}, 1)
    assert pool.replica("primary-0").state is ReplicaState.READY
    assert "primary-0" in {pool.acquire(1).replica_id for _ in range(4)}


def test_a_hung_only_replica_brings_back_the_ejected_one() -> None:
    """Hung is out like any state that cannot serve: an ejected peer serves again."""
    pool, _, rec = make_pool(2)
    pool.outliers.eject("primary-1", duration_ms=60_000)
    pool.mark_hung("primary-0", "hung")
    assert pool.acquire(1).replica_id == "primary-1"
    assert rec.of(ev.REPLICA_READMITTED)[-1]["why"] == "no_other_replica"


def test_what_the_supervisor_reports_reaches_the_record_through_the_pool() -> None:
    """The pool is the one writer of its records: usage and supervision failures come in
    through its methods and show in the inventory."""
    pool, _, _ = make_pool(1)
    pool.set_usage("primary-0", {"cpu_percent": 12.5, "rss_bytes": 1 << 20, "gpu": None})
    pool.note_supervision_failed("primary-0", 2, "supervision failed: RuntimeError: boom")
    doc = pool.inventory()["replicas"][0]
    assert doc["usage"] == {"cpu_percent": 12.5, "rss_bytes": 1 << 20, "gpu": None}
    assert doc["supervision_failures"] == 2
    assert doc["last_error"] == "supervision failed: RuntimeError: boom"
    with pytest.raises(NotFound):
        pool.set_usage("primary-9", {})


def test_requests_per_second_over_the_last_ten_seconds() -> None:
    pool, clock, _ = make_pool(1)
    for _ in range(20):
        exchange(pool, clock, "success", took=0.0)
    assert pool.inventory()["replicas"][0]["requests_per_s"] == pytest.approx(2.0)
    clock.advance(11)
    assert pool.inventory()["replicas"][0]["requests_per_s"] == 0.0


def test_duplicate_and_unknown_replica_ids() -> None:
    pool, _, _ = make_pool(1)
    with pytest.raises(Conflict):
        pool.add_replica("primary-0", "cpu")
    with pytest.raises(NotFound, match="primary-0"):
        pool.mark_ready("primary-7", 1)


def test_settings_defaults_and_validation() -> None:
    s = PoolSettings()
    assert (s.max_inflight_per_replica, s.consecutive_timeouts, s.max_ejection_percent) == (
        32,
        3,
        50,
    )
    assert s.effective_max_ejection_ms == 300_000
    assert PoolSettings(base_ejection_ms=1_000_000).effective_max_ejection_ms == 3_600_000
    assert PoolSettings(timeout_ms=2000).deadline_s(500) == 0.5
    assert PoolSettings(timeout_ms=2000).deadline_s(None) == 2.0
    assert PoolSettings(timeout_ms=2000).deadline_s(9000) == 2.0
    with pytest.raises(ValueError, match="max_ejection_ms"):
        PoolSettings(base_ejection_ms=5000, max_ejection_ms=1000)
    with pytest.raises(ValueError, match="extra"):
        PoolSettings(bogus=1)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("field", "refused", "accepted"),
    [
        ("hang_after_ms", 999, 1000),
        ("hang_after_ms", 86_400_001, 86_400_000),
        ("timeout_ms", 0, 1),
        ("timeout_ms", 3_600_001, 3_600_000),
        ("consecutive_timeouts", 1001, 1000),
        ("base_ejection_ms", 3_600_001, 3_600_000),
        ("max_ejection_percent", 101, 100),
    ],
)
def test_settings_bounds_are_configs(field: str, refused: int, accepted: int) -> None:
    """The pool's settings accept exactly what config.yaml accepts for the same field."""
    from pydantic import ValidationError

    from vllm_sr.config.schema import Deployment, OutlierDetection

    config_model: Any = OutlierDetection if field in OutlierDetection.model_fields else Deployment
    replicas: dict[str, Any] = {} if config_model is OutlierDetection else {"replicas": [{}]}
    for value, ok in ((refused, False), (accepted, True)):
        doc = {field: value, **replicas}
        if field == "base_ejection_ms":
            doc["max_ejection_ms"] = value
        try:
            config_model.model_validate(doc)
            config_ok = True
        except ValidationError:
            config_ok = False
        try:
            PoolSettings.model_validate({k: v for k, v in doc.items() if k != "replicas"})
            pool_ok = True
        except ValidationError:
            pool_ok = False
        assert (config_ok, pool_ok) == (ok, ok), (field, value)


def test_settings_from_a_deployment_object() -> None:
    class OD:
        consecutive_timeouts = 5
        base_ejection_ms = 1000
        max_ejection_ms = None
        max_ejection_percent = 30

    class Engine:
        max_num_seqs = 64
        max_num_batched_tokens = None

    class Dep:
        timeout_ms = 2000
        hang_after_ms = None
        outlier_detection = OD()
        engine_args = Engine()

    s = PoolSettings.from_deployment(Dep())
    assert (s.timeout_ms, s.consecutive_timeouts, s.base_ejection_ms) == (2000, 5, 1000)
    assert (s.effective_max_ejection_ms, s.max_ejection_percent) == (10_000, 30)
    assert (s.configured_max_num_seqs, s.configured_max_num_batched_tokens) == (64, None)


def test_settings_from_the_config_schema() -> None:
    from vllm_sr.config.schema import Deployment

    dep = Deployment.model_validate(
        {
            "artifact": "vllm-sr/d3-edge",
            "timeout_ms": 2000,
            "engine_args": {"max_num_seqs": 64, "max_num_batched_tokens": 8192},
            "replicas": [{"device": "rocm:0"}, {"device": "rocm:1"}],
            "outlier_detection": {"consecutive_timeouts": 0, "base_ejection_ms": 500},
        }
    )
    s = PoolSettings.from_deployment(dep)
    assert (s.timeout_ms, s.consecutive_timeouts, s.effective_max_ejection_ms) == (2000, 0, 5000)
    assert (s.configured_max_num_seqs, s.configured_max_num_batched_tokens) == (64, 8192)
    assert not s.policy().enabled


def test_readmit_undoes_a_drain_of_a_live_worker() -> None:
    pool, _, rec = make_pool(2)
    pool.mark_draining("primary-1")
    assert {pool.acquire(0).replica_id for _ in range(3)} == {"primary-0"}
    assert pool.outliers.readmit("primary-1")
    assert pool.replica("primary-1").state.value == "ready"
    assert [f["why"] for f in rec.of(ev.REPLICA_READMITTED)] == ["undrain"]
    pool.mark_exited("primary-0", "exit 1")
    assert pool.acquire(0).replica_id == "primary-1"
