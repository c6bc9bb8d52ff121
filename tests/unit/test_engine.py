"""The batching engine with a fake model: forwards under both limits, order of results,
shared forwards, failures, overload, the thread context and the fault delay."""

from __future__ import annotations

import threading
import time

import numpy
import pytest

from tests.support.fakes import FakeRunner, RecordingPolicy, expected_output
from vllm_sr.clock import FakeClock
from vllm_sr.errors import InvalidRequest, NotReady, Overloaded
from vllm_sr.worker.engine import Engine, Faults, ForwardFailed, Job, Limits
from vllm_sr.worker.threads import ThreadContext


def rows_of(*lengths: int, start: int = 1) -> list[list[int]]:
    return [[start + i] * n for i, n in enumerate(lengths)]


# -- the engine ----------------------------------------------------------------------------


def run_jobs(engine: Engine, jobs_rows: list[list[list[int]]]) -> list[Job]:
    """Queue every job before the forward thread starts (so packing sees them all)."""
    done = threading.Semaphore(0)
    jobs = [engine.submit(rows, lambda _j: done.release()) for rows in jobs_rows]
    engine.start()
    for _ in jobs:
        assert done.acquire(timeout=10)
    engine.stop(drain_timeout=1)
    return jobs


def test_results_come_back_in_row_order_across_split_forwards() -> None:
    runner = FakeRunner()
    engine = Engine(runner, Limits(3, 1000), clock=FakeClock())
    rows = rows_of(4, 9, 2, 7, 7, 1, 3, 8)
    (job,) = run_jobs(engine, [rows])
    assert len(runner.forwards) >= 3  # 8 rows, at most 3 per forward
    numpy.testing.assert_array_equal(job.result(), [expected_output(r) for r in rows])


def test_concurrent_jobs_share_forwards_and_each_gets_its_own_rows() -> None:
    runner = FakeRunner()
    engine = Engine(runner, Limits(64, 8192), clock=FakeClock())
    jobs_rows = [rows_of(3 + i % 4, start=10 * i) for i in range(20)]
    jobs = run_jobs(engine, jobs_rows)
    assert len(runner.forwards) == 1
    assert len(runner.forwards[0]) == 20
    for job, rows in zip(jobs, jobs_rows, strict=True):
        numpy.testing.assert_array_equal(job.result(), [expected_output(r) for r in rows])


def test_every_forward_respects_both_limits() -> None:
    runner = FakeRunner()
    limits = Limits(5, 40)
    engine = Engine(runner, limits, clock=FakeClock())
    lengths = [3, 9, 1, 7, 4, 8, 2, 6, 5, 5, 10, 2, 3]
    jobs = run_jobs(engine, [rows_of(n, start=i) for i, n in enumerate(lengths)])
    assert all(j.error is None for j in jobs)
    for forward in runner.forwards:
        assert len(forward) <= limits.max_num_seqs
        assert len(forward) * max(map(len, forward)) <= limits.max_num_batched_tokens
    assert sum(len(f) for f in runner.forwards) == len(lengths)


def test_a_failed_forward_fails_only_its_jobs() -> None:
    runner = FakeRunner()
    runner.fail_when = 666
    engine = Engine(runner, Limits(1, 1000), clock=FakeClock())
    good, bad, good2 = run_jobs(engine, [[[1, 2]], [[666, 1]], [[3]]])
    assert isinstance(bad.error, ForwardFailed)
    with pytest.raises(ForwardFailed):
        bad.result()
    assert good.result()[0].tolist() == expected_output([1, 2])
    assert good2.result()[0].tolist() == expected_output([3])


def test_queue_limit_refuses_with_overloaded() -> None:
    engine = Engine(FakeRunner(), Limits(4, 100), clock=FakeClock(), max_queue_rows=10)
    engine.submit(rows_of(*[2] * 8))
    with pytest.raises(Overloaded):
        engine.submit(rows_of(2, 2, 2))
    engine.submit(rows_of(2, 2))  # exactly at the limit is accepted


def test_empty_job_is_refused() -> None:
    engine = Engine(FakeRunner(), Limits(4, 100), clock=FakeClock())
    with pytest.raises(InvalidRequest):
        engine.submit([])


def test_limits_must_be_positive() -> None:
    with pytest.raises(InvalidRequest, match="max_num_seqs"):
        Limits(0, 10)


def test_each_forward_states_the_policys_count_on_the_context_and_reports_after() -> None:
    stated: list[int] = []
    current = [1]

    def set_threads(n: int) -> None:
        stated.append(n)
        current[0] = n

    context = ThreadContext(lambda: current[0], set_threads)
    policy = RecordingPolicy(threads=3)
    policy.rerun_at = 2
    runner = FakeRunner()
    engine = Engine(runner, Limits(2, 100), clock=FakeClock(), policy=policy, context=context)
    run_jobs(engine, [rows_of(4, 4, 4)])
    assert policy.asked == [8, 4]  # padded tokens of each forward: 2x4, then 1x4
    assert [(n, t) for n, t, _ in policy.after] == [(2, 3), (1, 3)]
    assert context.counts() == {3: 2, 2: 2}  # two served forwards at 3, two reruns at 2
    assert stated[0] == 3
    # A rerun repeats the same forward's rows.
    assert runner.forwards[1] == runner.forwards[0]


def test_timings_come_from_the_clock() -> None:
    clock = FakeClock()
    runner = FakeRunner()
    engine = Engine(runner, Limits(4, 100), clock=clock)
    job = engine.submit(rows_of(2))
    clock.advance(0.25)
    done = threading.Event()
    job.on_done = lambda _j: done.set()
    engine.start()
    assert done.wait(10)
    engine.stop(drain_timeout=1)
    assert job.queue_s == pytest.approx(0.25)


def test_stop_cuts_an_injected_forward_delay_short() -> None:
    runner = FakeRunner()
    engine = Engine(runner, Limits(4, 100), faults=Faults(True, 60.0))
    failed = threading.Event()
    job = engine.submit(rows_of(3), lambda _j: failed.set())
    engine.start()
    started = time.monotonic()
    engine.stop(drain_timeout=0.2)
    assert failed.wait(5)
    assert time.monotonic() - started < 5.0  # the 60 s delay did not run out
    assert isinstance(job.error, NotReady)
    assert runner.forwards == []


def test_stop_drains_queued_rows_then_refuses_new_ones() -> None:
    runner = FakeRunner()
    runner.gate = threading.Event()
    engine = Engine(runner, Limits(1, 100))
    finished = threading.Semaphore(0)
    engine.start()
    jobs = [engine.submit(rows_of(2, start=i), lambda _j: finished.release()) for i in range(3)]
    assert runner.entered.wait(5)
    stopper = threading.Thread(target=engine.stop, kwargs={"drain_timeout": 10})
    stopper.start()
    deadline = time.monotonic() + 5
    while not engine.stopping and time.monotonic() < deadline:
        time.sleep(0.005)  # polling the stopper thread's flag, with a deadline
    with pytest.raises(NotReady):
        engine.submit(rows_of(1))
    runner.gate.set()
    stopper.join(10)
    assert all(j.error is None for j in jobs)
    assert len(runner.forwards) == 3
