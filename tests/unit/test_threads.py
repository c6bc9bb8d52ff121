"""The thread policy: fixed, adaptive (learning on a fake model with scripted per-count speed,
on a fake clock that the fake forward advances), the env switch and the per-thread context."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_sr.clock import FakeClock
from vllm_sr.control.threads_report import format_report
from vllm_sr.errors import ConfigError
from vllm_sr.events import THREADS_LEARNED, THREADS_RETIRED
from vllm_sr.worker.learner import AdaptiveThreads
from vllm_sr.worker.learner_stats import allowed_counts, bucket_label, bucket_of, identical
from vllm_sr.worker.policy import policy_from_env
from vllm_sr.worker.threads import (
    ENV_ADAPTIVE,
    FixedThreads,
    ThreadContext,
    batch_tokens,
    worker_cpu_budget,
)
from vllm_sr.worker.threads_record import ENV_RECORD_DIR, HostFacts, HostRecords

SHORT = [[7] * 10]  # 10 padded tokens: bucket 9-16
LONG = [[3] * 100, [5] * 100]  # 200 padded tokens: bucket 129-256


def scripted_seconds(threads: int, n_tokens: int) -> float:
    """Per-count cost: a sync overhead that grows with the count, plus work split between
    the threads. Short inputs are fastest at 1 thread, long ones at 4."""
    return 0.001 * threads + n_tokens * 1e-4 / threads


class FakeModel:
    def __init__(
        self,
        clock: FakeClock,
        drift: Callable[[int, int], bool] | None = None,
        speed: Callable[[int, int], float] = scripted_seconds,
    ) -> None:
        self.clock, self.speed = clock, speed
        self.drift = drift or (lambda threads, n: False)
        self.calls: list[int] = []

    def forward(self, rows: list[list[int]], threads: int) -> numpy.ndarray:
        n = batch_tokens(rows)
        self.calls.append(threads)
        self.clock.advance(self.speed(threads, n))
        out = numpy.array([[sum(r) / 7.0, len(r)] for r in rows], dtype=numpy.float32)
        if self.drift(threads, n):
            out[0, 0] = numpy.nextafter(out[0, 0], numpy.float32(numpy.inf))
        return out


class FakeEngine:
    """What the worker's engine does around each forward, minus batching."""

    def __init__(self, policy: Any, model: FakeModel, gap_s: float = 0.05) -> None:
        self.policy, self.model, self.gap_s = policy, model, gap_s
        self.served: list[int] = []

    def serve(self, rows: list[list[int]]) -> numpy.ndarray:
        self.model.clock.advance(self.gap_s)
        threads = self.policy.threads_for(batch_tokens(rows))
        self.served.append(threads)
        start = self.model.clock.monotonic()
        out = self.model.forward(rows, threads)
        took = self.model.clock.monotonic() - start
        self.policy.after_forward(rows, out, threads, took, lambda n: self.model.forward(rows, n))
        return out


def make(
    mode: int,
    drift: Callable[[int, int], bool] | None = None,
    speed: Callable[[int, int], float] = scripted_seconds,
    **kw: Any,
) -> tuple[AdaptiveThreads, FakeEngine, list[tuple[str, dict[str, Any]]]]:
    clock = FakeClock()
    events: list[tuple[str, dict[str, Any]]] = []
    policy = AdaptiveThreads(
        mode, 2, 4, emit=lambda name, **f: events.append((name, f)), clock=clock, **kw
    )
    return policy, FakeEngine(policy, FakeModel(clock, drift, speed)), events


def run_until(engine: FakeEngine, pred: Callable[[], bool], limit: int = 5000) -> int:
    for i in range(limit):
        if pred():
            return i
        engine.serve(SHORT if i % 2 else LONG)
    raise AssertionError(f"not reached in {limit} forwards: {engine.policy.report()}")


def bucket(report: dict[str, Any], label: str) -> dict[str, Any]:
    return next(b for b in report["buckets"] if b["bucket"] == label)


def test_allowed_counts_and_buckets() -> None:
    assert allowed_counts(2, 4) == [1, 2, 4]
    assert allowed_counts(3, 8) == [1, 2, 3, 4, 8]
    assert allowed_counts(1, 1) == [1]
    assert [bucket_of(n) for n in (0, 1, 2, 3, 4, 5, 16, 17)] == [0, 0, 1, 2, 2, 3, 4, 5]
    assert bucket_label(bucket_of(10)) == "9-16"
    assert batch_tokens(LONG) == 200 and batch_tokens([[1], [1, 2, 3]]) == 6


def test_identical_compares_raw_bits() -> None:
    a = numpy.array([0.0, 1.0], dtype=numpy.float32)
    assert identical(a, a.copy())
    assert not identical(a, numpy.array([-0.0, 1.0], dtype=numpy.float32))  # == says equal
    assert not identical(a, a.astype(numpy.float64))


def test_mode1_learns_fastest_count_per_bucket_and_serves_configured() -> None:
    policy, engine, events = make(1)
    policy.golden_passed()
    run_until(engine, lambda: policy.report()["state"] == "learned")  # type: ignore[index]
    report = policy.report()
    assert report is not None
    assert bucket(report, "9-16")["best"] == 1
    assert bucket(report, "129-256")["best"] == 4
    learned = {f["bucket"]: f["threads"] for name, f in events if name == THREADS_LEARNED}
    assert learned == {"9-16": 1, "129-256": 4}
    assert set(engine.served) == {2}  # mode 1 never serves another count
    # Long forwards dominate the time, so the one count to pin is 4.
    assert report["recommended_threads"] == 4
    assert report["recommendation"] == "pin --threads 4"
    short = bucket(report, "9-16")["counts"]
    assert [c["threads"] for c in short] == [1, 2, 4]
    assert all(c["samples"] >= policy.min_samples for c in short)
    assert short[0]["median_ms"] == pytest.approx(scripted_seconds(1, 10) * 1000, rel=1e-6)
    assert "pin --threads 4" in format_report(report)


def test_recommendation_weighs_buckets_by_traffic() -> None:
    # Ten short forwards per long one: 1 thread's gain on short inputs and 4's on long ones
    # cancel out against 2 (expected time per forward 4.1 / 3.7 / 5.2 ms), so pin 2.
    policy, engine, _ = make(1)
    policy.golden_passed()
    for i in range(4000):
        if policy.report()["state"] == "learned":  # type: ignore[index]
            break
        engine.serve(LONG if i % 11 == 0 else SHORT)
    report = policy.report()
    assert report is not None and report["state"] == "learned"
    assert [b["best"] for b in report["buckets"]] == [1, 4]
    assert report["recommended_threads"] == 2


def test_a_count_must_beat_configured_by_the_margin() -> None:
    # 4 threads is 3 % faster everywhere, under the 5 % margin: the configured count stays.
    policy, engine, events = make(2, speed=lambda t, n: 0.01 * (0.97 if t == 4 else 1.0))
    policy.golden_passed()
    run_until(engine, lambda: policy.report()["state"] == "learned")  # type: ignore[index]
    assert {f["threads"] for name, f in events if name == THREADS_LEARNED} == {2}
    assert policy.threads_for(200) == 2 and policy.threads_for(10) == 2
    assert policy.report()["recommended_threads"] == 2  # type: ignore[index]


def test_no_exploration_before_golden_check() -> None:
    policy, engine, _ = make(1)
    for _ in range(50):
        engine.serve(LONG)
    assert engine.model.calls == [2] * 50  # served passes only
    policy.golden_passed()
    # Exploring starts as soon as served time has earned its time share.
    for _ in range(30):
        engine.serve(LONG)
    assert len(engine.model.calls) > 50 + 30


def test_warm_pass_at_configured_before_each_timed_shadow() -> None:
    policy, engine, _ = make(1)
    policy.golden_passed()
    for _ in range(200):
        engine.serve(LONG)
    calls = engine.model.calls
    extra = [c for i, c in enumerate(calls)]
    # Every forward is served at 2; an exploring forward is followed by warm 2, then shadow.
    i, shadows = 0, []
    while i < len(extra):
        assert extra[i] == 2
        if i + 2 < len(extra) and extra[i + 2] != 2:
            assert extra[i + 1] == 2  # the warm pass
            shadows.append(extra[i + 2])
            i += 3
        else:
            i += 1
    assert set(shadows) == {1, 4}


def test_drift_retires_for_good_and_answers_stay_configured() -> None:
    drift = lambda threads, n: threads == 4 and n > 100  # noqa: E731
    policy, engine, events = make(2, drift=drift)
    policy.golden_passed()
    run_until(engine, lambda: policy.retired)
    retired = [f for name, f in events if name == THREADS_RETIRED]
    assert len(retired) == 1
    assert retired[0]["threads"] == 4
    assert retired[0]["bucket"] == "129-256" and retired[0]["tokens"] == 200
    calls_then = len(engine.model.calls)
    for i in range(300):
        out = engine.serve(SHORT if i % 2 else LONG)
        assert identical(out, engine.model.forward(SHORT if i % 2 else LONG, 2))
    assert (
        engine.model.calls.count(4) == 0
        or max(i for i, c in enumerate(engine.model.calls) if c == 4) < calls_then
    )  # no pass at any other count after retiring
    assert set(engine.served) == {2}
    report = policy.report()
    assert report is not None and report["state"] == "retired"
    assert "4 threads drifted" in report["retire_reason"]
    assert "200 padded tokens" in report["retire_reason"]
    assert report["recommended_threads"] is None


def test_mode2_switches_a_bucket_only_after_its_window() -> None:
    policy, engine, events = make(2, window=8)
    policy.golden_passed()
    run_until(engine, lambda: any(n == THREADS_LEARNED for n, _ in events))
    # Learned but not yet verified: still served at the configured count.
    while bucket(policy.report(), "129-256")["phase"] != "serving":  # type: ignore[arg-type]
        b = bucket(policy.report(), "129-256")  # type: ignore[arg-type]
        if b["best"] == 4:
            assert policy.threads_for(200) == 2
            assert b["matches"] < 8
        engine.serve(LONG)
    b = bucket(policy.report(), "129-256")  # type: ignore[arg-type]
    assert b["matches"] == 8
    assert policy.threads_for(200) == 4
    engine.serve(LONG)
    assert engine.served[-1] == 4


def test_mode2_audit_catches_drift_of_a_served_count() -> None:
    # Bit-identical while learning and verifying, drifts once serving 4: the audit retires it.
    state = {"serving": False}
    drift = lambda threads, n: state["serving"] and threads == 4  # noqa: E731
    policy, engine, events = make(2, drift=drift, window=4, audit_share=0.2)
    policy.golden_passed()
    run_until(engine, lambda: policy.threads_for(200) == 4)
    state["serving"] = True
    run_until(engine, lambda: policy.retired)
    assert policy.threads_for(200) == 2
    assert [f["threads"] for n, f in events if n == THREADS_RETIRED] == [4]


def test_exploration_stays_in_its_share_and_pass_cap() -> None:
    policy, engine, _ = make(1, share=0.1, max_shadow_per_s=1000.0)
    policy.golden_passed()
    for _ in range(400):
        engine.serve(LONG)
    extra = len(engine.model.calls) - 400
    assert 0 < extra <= 2 * (0.1 * 400 + 1)
    # Burst with no time passing: the per-second cap bounds passes, whatever the share.
    policy, engine, _ = make(1, share=1.0, max_shadow_per_s=6.0)
    engine.gap_s = 0.0
    engine.model.clock.advance(10.0)
    policy.golden_passed()
    for _ in range(40):
        engine.serve(LONG)
    report = policy.report()
    assert report is not None
    # Forwards take time too (~5 ms each), refilling a little; far under the share's 80.
    assert report["shadow_passes"] <= 6 + 40 * 0.02 * 6 + 2


def test_a_slow_count_costs_at_most_the_time_share() -> None:
    # 1 and 4 threads are 50x slower than the configured 2: the forward share alone would let
    # shadow passes take 5x the served time; the time share holds them to 20 %. A pass's cost
    # is predicted from the count's known ratio, so only a count's first pair can overshoot.
    slow = lambda t, n: 0.001 if t == 2 else 0.05  # noqa: E731
    policy, engine, _ = make(1, speed=slow, share=0.1, time_share=0.2, min_samples=50)
    policy.golden_passed()
    worst = 0.0
    for i in range(1, 2001):
        engine.serve(LONG)
        shadow = policy.report()["shadow_seconds"]  # type: ignore[index]
        worst = max(worst, shadow - 0.2 * i * 0.001)
    report = policy.report()
    assert report is not None and report["shadow_passes"] > 4
    assert worst <= 2 * 0.051 + 1e-9  # the first pair of each slow count, unpredicted
    assert report["shadow_seconds"] <= 0.2 * 2000 * 0.001 + 1e-9
    assert report["shadow_seconds"] >= 0.2 * 2000 * 0.001 - 0.051  # it still explores


@pytest.mark.parametrize(
    ("value", "kind", "mode"),
    [
        (None, FixedThreads, None),
        ("", FixedThreads, None),
        ("0", FixedThreads, None),
        ("1", AdaptiveThreads, 1),
        ("2", AdaptiveThreads, 2),
    ],
)
def test_policy_from_env(value: str | None, kind: type, mode: int | None, tmp_path: Path) -> None:
    env = {} if value is None else {ENV_ADAPTIVE: value}
    env[ENV_RECORD_DIR] = str(tmp_path)
    facts = HostFacts("Test CPU", "2.0", "6.1")
    if value == "2":  # mode 2 needs a record of this host vouching for its counts
        HostRecords(tmp_path, facts).learned([1, 2, 4], ["9-16"])
    policy = policy_from_env(2, 4, env, facts=lambda: facts)
    assert isinstance(policy, kind)
    if mode is not None:
        assert isinstance(policy, AdaptiveThreads) and policy.mode == mode
        assert policy.threads_for(10) == 2
    else:
        assert policy.report() is None and policy.threads_for(1000) == 2


@pytest.mark.parametrize("value", ["3", "yes", " 1", "on", "-1", "1.0"])
def test_policy_from_env_refuses_other_values(value: str) -> None:
    with pytest.raises(ConfigError) as err:
        policy_from_env(2, 4, {ENV_ADAPTIVE: value})
    text = str(err.value)
    assert ENV_ADAPTIVE in text and repr(value) in text
    assert "0" in text and "1" in text and "2" in text


def test_context_sets_only_on_change_and_counts() -> None:
    state = {"n": 4, "sets": 0}

    def setter(n: int) -> None:
        state["n"], state["sets"] = n, state["sets"] + 1

    ctx = ThreadContext(get_threads=lambda: state["n"], set_threads=setter)
    assert ctx.current is None
    with ctx.forward(threads=4):
        assert ctx.current == 4
    assert state["sets"] == 0
    with ctx.forward(threads=1):
        assert ctx.current == 1 and state["n"] == 1
    with ctx.forward(threads=1):
        pass
    assert state["sets"] == 1
    assert ctx.counts() == {4: 1, 1: 2}
    assert ctx.current is None
    with pytest.raises(ValueError, match="threads"), ctx.forward(threads=0):
        pass


ROUNDS = 3


def test_two_engines_interleaving_keep_their_own_count() -> None:
    """Real torch: two forward threads on two contexts (and on one) state 1 and 2 in
    lockstep; inside each forward the thread sees its own count, never the other's."""
    torch = pytest.importorskip("torch")
    parallel_info = torch.__config__.parallel_info
    shared = ThreadContext()
    contexts = {1: ThreadContext(), 2: shared}
    barrier = threading.Barrier(2, timeout=10)
    seen: dict[int, list[tuple[int, int | None]]] = {1: [], 2: []}
    x = torch.ones(64, 64)

    def engine(n: int) -> None:
        try:
            lockstep(n)
        except BaseException:
            barrier.abort()  # fail the other thread now, not at its barrier timeout
            raise

    def lockstep(n: int) -> None:
        for ctx in (contexts[n], shared):
            for _ in range(ROUNDS):
                with ctx.forward(threads=n):
                    barrier.wait()  # both are inside a forward now
                    torch.mm(x, x)
                    mkl = re.search(r"mkl_get_max_threads\(\) : (\d+)", parallel_info())
                    seen[n].append((torch.get_num_threads(), ctx.current))
                    if mkl:  # MKL's count follows the thread's too
                        assert int(mkl.group(1)) == n
                    barrier.wait()

    workers = [threading.Thread(target=engine, args=(n,)) for n in (1, 2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=30)
    assert seen[1] == [(1, 1)] * 2 * ROUNDS
    assert seen[2] == [(2, 2)] * 2 * ROUNDS
    assert shared.counts() == {1: ROUNDS, 2: 2 * ROUNDS}


@settings(max_examples=25, deadline=None)
@given(
    mode=st.sampled_from([1, 2]),
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=400),
    drift_count=st.sampled_from([None, 1, 4]),
    drift_above=st.integers(0, 300),
)
def test_served_counts_stay_exact_whatever_the_traffic(
    mode: int, lengths: list[int], drift_count: int | None, drift_above: int
) -> None:
    """Mode 1 serves only the configured count; once retired (at most once) every mode serves
    only it and runs no other pass; mode 2 serves another count only where it was verified."""
    drift = lambda t, n: t == drift_count and n > drift_above  # noqa: E731
    policy, engine, events = make(mode, drift=drift, window=3, share=0.5, min_samples=2)
    policy.golden_passed()
    retired_at = None
    for n in lengths:
        engine.serve([[1] * n])
        if retired_at is None and policy.retired:
            retired_at = len(engine.served), len(engine.model.calls)
    if mode == 1:
        assert set(engine.served) == {2}
    retires = [f for name, f in events if name == THREADS_RETIRED]
    assert len(retires) <= 1
    if retired_at is not None:
        assert retires and retires[0]["threads"] == drift_count
        assert set(engine.served[retired_at[0] :]) <= {2}
        assert set(engine.model.calls[retired_at[1] :]) <= {2}
    report = policy.report()
    assert report is not None
    for b in report["buckets"]:
        if b["phase"] == "serving" and not policy.retired:
            assert b["matches"] >= 3 and b["serving"] == b["best"]


def test_report_text_lives_apart_from_the_worker() -> None:
    """`vllm-sr ctl threads` prints with a module that pulls in neither numpy nor the worker
    (and the worker does not reach up into the control package for it)."""
    import subprocess
    import sys

    code = (
        "import sys, vllm_sr.control.threads_report as t; "
        "bad = [m for m in sys.modules if m.startswith(('numpy', 'vllm_sr.worker'))]; "
        "assert not bad, bad; print(t.format_report(None))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert ENV_ADAPTIVE in out.stdout
    from vllm_sr.worker import threads

    assert not hasattr(threads, "format_report")


# -- the allowed counts follow the planner's CPU budget (issue 30) ---------------------------


def test_the_learner_is_bounded_by_the_cgroup_quota_not_the_affinity(tmp_path: Path) -> None:
    """2 configured threads on a 64-CPU host under a 4-CPU quota explore 1, 2, 4: not up to 64."""
    root, proc = tmp_path / "cgroup", tmp_path / "self-cgroup"
    (root / "svc").mkdir(parents=True)
    (root / "svc" / "cpu.max").write_text("400000 100000\n")
    proc.write_text("0::/svc\n")
    measure = {"cgroup_root": root, "proc_cgroup": proc, "machine_cpus": 64}
    budget = worker_cpu_budget(affinity=range(64), **measure)
    assert budget == 4
    assert AdaptiveThreads(1, 2, budget).allowed == [1, 2, 4]
    # Pinned to exactly its 2 configured CPUs, 2 is its ceiling (docs/adaptive-threads.md).
    assert AdaptiveThreads(1, 2, worker_cpu_budget(affinity=[5, 6], **measure)).allowed == [1, 2]


def test_a_worker_measures_its_budget_the_way_the_planner_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_sr.placement import cpu
    from vllm_sr.worker.options import WorkerOptions, build_state

    monkeypatch.setattr(cpu, "cgroup_quota_cpus", lambda *a: 1)  # a 1-CPU quota
    env = {ENV_ADAPTIVE: "1", ENV_RECORD_DIR: str(tmp_path)}
    state = build_state(WorkerOptions("vllm-sr/d3-edge", threads=1), env)
    report = state.policy.report()
    assert report is not None and report["budget"] == 1 and report["allowed"] == [1]
