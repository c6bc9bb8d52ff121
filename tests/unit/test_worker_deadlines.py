"""Deadlines reach the worker: queued rows whose request's deadline passed are dropped before
a forward (a running forward continues), answered 504 ``deadline_exceeded`` and counted; and
/health says how long the running forward has taken. Engine and API on a fake clock."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests.support.fakes import FakeRunner
from tests.unit.test_worker_api import serve, stop
from vllm_sr.clock import FakeClock
from vllm_sr.errors import DeadlineExceeded, InvalidRequest
from vllm_sr.worker.api import DEADLINE_HEADER, deadline_from_header
from vllm_sr.worker.engine import Engine, Job, Limits


class CountingMetrics:
    def __init__(self) -> None:
        self.dropped = 0

    def observe_forward(self, rows: int, padded: int, seconds: float) -> None:
        return None

    def set_queue_depth(self, rows: int) -> None:
        return None

    def count_deadline_dropped(self, rows: int) -> None:
        self.dropped += rows


def held_engine(clock: FakeClock) -> tuple[Engine, FakeRunner, CountingMetrics, Job]:
    """An engine whose first forward (one row [1]) is held in the runner's gate."""
    runner = FakeRunner()
    runner.gate = threading.Event()
    metrics = CountingMetrics()
    engine = Engine(runner, Limits(8, 1000), clock=clock, metrics=metrics)
    engine.start()
    first = engine.submit([[1]], deadline=clock.monotonic() + 0.1)
    assert runner.entered.wait(5)
    return engine, runner, metrics, first


def finish(engine: Engine, runner: FakeRunner, *jobs: Job) -> None:
    done = threading.Semaphore(0)
    for job in jobs:
        job.on_done = lambda _j: done.release()
    assert runner.gate is not None
    runner.gate.set()
    for _ in jobs:
        assert done.acquire(timeout=10)
    engine.stop(drain_timeout=1)


def test_queued_rows_past_their_deadline_are_dropped_before_the_forward() -> None:
    clock = FakeClock()
    engine, runner, metrics, first = held_engine(clock)
    late = engine.submit([[2], [3, 3]], deadline=clock.monotonic() + 0.5)
    on_time = engine.submit([[4]], deadline=clock.monotonic() + 5.0)
    no_deadline = engine.submit([[5]])
    clock.advance(1.0)  # past `first` (running) and `late` (queued), not `on_time`
    finish(engine, runner, first, late, on_time, no_deadline)
    assert first.error is None  # the running forward continued past its deadline
    assert isinstance(late.error, DeadlineExceeded)
    assert late.error.http_status == 504 and late.error.code == "deadline_exceeded"
    with pytest.raises(DeadlineExceeded, match="deadline passed 500 ms"):
        late.result()
    assert on_time.error is None and no_deadline.error is None
    forwarded = [row for fwd in runner.forwards for row in fwd]
    assert [2] not in forwarded and [3, 3] not in forwarded
    assert [4] in forwarded and [5] in forwarded
    assert metrics.dropped == 2


def test_without_deadlines_nothing_is_dropped() -> None:
    clock = FakeClock()
    engine, runner, metrics, first = held_engine(clock)
    job = engine.submit([[2]])
    clock.advance(3600)
    finish(engine, runner, first, job)
    assert job.error is None and metrics.dropped == 0


def test_forward_running_s_counts_the_running_forward_on_the_clock() -> None:
    clock = FakeClock()
    engine, runner, _, first = held_engine(clock)
    assert engine.busy
    clock.advance(2.5)
    assert engine.forward_running_s == pytest.approx(2.5)
    finish(engine, runner, first)
    assert not engine.busy and engine.forward_running_s == 0.0


@pytest.mark.parametrize("raw", ["0", "-5", "abc", "", "nan", "inf", "1e999"])
def test_bad_deadline_headers_are_refused_naming_the_header(raw: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        deadline_from_header(raw, 10.0)
    assert DEADLINE_HEADER in str(err.value) and repr(raw) in str(err.value)


def test_a_deadline_header_is_milliseconds_from_receipt() -> None:
    assert deadline_from_header("1500", 10.0) == pytest.approx(11.5)
    assert deadline_from_header("0.5", 0.0) == pytest.approx(0.0005)
    assert deadline_from_header(None, 10.0) is None


async def test_api_answers_504_for_a_request_that_waited_past_its_deadline() -> None:
    clock = FakeClock()
    s = await serve(clock=clock)
    s.runner.gate = threading.Event()
    loop = asyncio.get_running_loop()
    try:
        first = asyncio.ensure_future(s.client.post("/v1/embeddings", json={"input": "a"}))
        assert await loop.run_in_executor(None, s.runner.entered.wait, 5)
        health = await (await s.client.get("/health")).json()
        assert health["forward_running"] is True and health["forward_running_s"] == 0.0
        headers = {DEADLINE_HEADER: "250"}
        late = asyncio.ensure_future(
            s.client.post("/v1/embeddings", json={"input": ["b", "c"]}, headers=headers)
        )
        bundle = asyncio.ensure_future(
            s.client.post(
                "/v1/bundle",
                json={"tasks": [{"id": "t", "embeddings": {"input": "d"}}]},
                headers=headers,
            )
        )
        while s.engine.queue_depth < 3:
            await asyncio.sleep(0.01)
        clock.advance(1.25)
        health = await (await s.client.get("/health")).json()
        assert health["forward_running_s"] == pytest.approx(1.25)
        assert health["queue_rows"] == 3
        s.runner.gate.set()
        assert (await first).status == 200
        for pending in (late, bundle):
            resp = await pending
            assert resp.status == 504
            assert (await resp.json())["error"]["code"] == "deadline_exceeded"
        text = await (await s.client.get("/metrics")).text()
        assert "vllm_sr_worker_deadline_dropped_rows_total 3.0" in text
        assert 'vllm_sr_worker_requests_total{status="504",surface="embeddings"} 1.0' in text
        health = await (await s.client.get("/health")).json()
        assert health["forward_running"] is False and health["forward_running_s"] == 0.0
    finally:
        await stop(s)


async def test_api_refuses_a_bad_deadline_header_with_400() -> None:
    s = await serve()
    try:
        resp = await s.client.post(
            "/v1/embeddings", json={"input": "a"}, headers={DEADLINE_HEADER: "soon"}
        )
        assert resp.status == 400
        error = (await resp.json())["error"]
        assert error["code"] == "invalid_request" and DEADLINE_HEADER in error["message"]
        ok = await s.client.post(
            "/v1/embeddings", json={"input": "a"}, headers={DEADLINE_HEADER: "5000"}
        )
        assert ok.status == 200
    finally:
        await stop(s)
