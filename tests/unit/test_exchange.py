"""The pool's exchange (vllm_sr/pool/exchange.py) on a fake clock with scripted clients: the
outcome fed back per replica, one retry elsewhere for a worker that broke before answering,
never a retry of a timeout, an answer or an exhausted deadline, the deadline sent to the worker,
and accounting that returns to zero whatever happens (issue 13 part 1)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from tests.unit.test_pool import Recorder
from vllm_sr import events as ev
from vllm_sr.clock import FakeClock
from vllm_sr.errors import DeadlineExceeded, Overloaded, WorkerFailed
from vllm_sr.pool import PoolSettings, ReplicaPool
from vllm_sr.pool.client import WorkerResponse
from vllm_sr.pool.exchange import DEADLINE_HEADER, exchange

Script = Callable[[str, bytes, float | None, dict[str, str]], Any]


class ScriptedClient:
    """A worker client whose every post runs ``script`` (returns a response or raises)."""

    def __init__(self, rid: str, clock: FakeClock, script: Script) -> None:
        self.rid = rid
        self.clock = clock
        self.script = script
        self.calls: list[dict[str, Any]] = []

    async def post(
        self,
        path: str,
        body: bytes,
        *,
        timeout_s: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> WorkerResponse:
        self.calls.append({"path": path, "body": body, "timeout_s": timeout_s, **(headers or {})})
        result = self.script(path, body, timeout_s, headers or {})
        if isinstance(result, BaseException):
            raise result
        return result


def ok(status: int = 200, body: bytes = b'{"ok":true}') -> WorkerResponse:
    return WorkerResponse(status, body, "application/json", {})


def broke(rid: str) -> WorkerFailed:
    return WorkerFailed(f"worker {rid} failed: ConnectionResetError", replica=rid)


def make(
    scripts: list[Script], **settings: Any
) -> tuple[ReplicaPool, FakeClock, Recorder, list[ScriptedClient]]:
    clock, rec = FakeClock(), Recorder()
    pool = ReplicaPool("primary", settings=PoolSettings(**settings), clock=clock, emit=rec)
    clients = []
    for i, script in enumerate(scripts):
        client = ScriptedClient(f"primary-{i}", clock, script)
        clients.append(client)
        pool.add_replica(f"primary-{i}", "cpu", client=client)
        pool.mark_ready(f"primary-{i}", 100 + i)
    return pool, clock, rec, clients


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def idle(pool: ReplicaPool) -> bool:
    return all(r.inflight == 0 and r.outstanding_bytes == 0 for r in pool.replicas())


def test_a_worker_that_broke_before_answering_is_retried_on_another_replica() -> None:
    pool, clock, rec, _ = make([lambda *a: broke("primary-0"), lambda *a: ok()])
    answer = run(exchange(pool, "/v1/embeddings", b'{"input":"x"}', clock=clock))
    assert (answer.status, answer.replica_id, answer.retries) == (200, "primary-1", 1)
    assert answer.retried_from == "primary-0"
    r0, r1 = pool.replica("primary-0"), pool.replica("primary-1")
    assert r0.outcomes["failure"] == 1 and r0.in_backoff(clock.monotonic())  # its backoff
    assert r1.outcomes["success"] == 1 and (r0.retried_away, pool.retries) == (1, 1)
    assert idle(pool)
    assert [e["replica"] for e in rec.of(ev.EXCHANGE_RETRIED)] == ["primary-0"]


def test_the_retry_goes_by_the_pick_rule_among_the_others() -> None:
    seen: list[str] = []

    def record(rid: str) -> Script:
        return lambda *a: (seen.append(rid), ok())[1]

    pool, clock, _, _ = make([lambda *a: broke("primary-0"), record("primary-1"), record("p2")])
    # primary-1 carries load: the retry must pick primary-2 (fewest outstanding bytes).
    held = pool.acquire(10_000, "primary-1")
    answer = run(exchange(pool, "/v1/embeddings", b"{}", clock=clock))
    assert answer.replica_id == "primary-2" and seen == ["p2"]
    pool.release(held, "success")
    assert idle(pool)


def test_one_retry_only_then_the_failure_is_answered() -> None:
    pool, clock, _, clients = make([lambda *a: broke("primary-0"), lambda *a: broke("primary-1")])
    with pytest.raises(WorkerFailed):
        run(exchange(pool, "/v1/embeddings", b"{}", clock=clock))
    assert [len(c.calls) for c in clients] == [1, 1] and idle(pool)


def test_a_timeout_is_never_retried() -> None:
    def slow(*a: Any) -> Exception:
        clock.advance(2.0)
        return DeadlineExceeded("no answer", replica="primary-0")

    pool, clock, _, clients = make([slow, lambda *a: ok()], timeout_ms=1000)
    with pytest.raises(DeadlineExceeded):
        run(exchange(pool, "/v1/embeddings", b"{}", clock=clock))
    assert len(clients[1].calls) == 0 and pool.replica("primary-0").consecutive_timeouts == 1
    assert pool.retries == 0 and idle(pool)


@pytest.mark.parametrize("status", [400, 404, 500, 503])
def test_an_answer_is_never_retried_whatever_its_status(status: int) -> None:
    pool, clock, _, clients = make([lambda *a: ok(status), lambda *a: ok()])
    answer = run(exchange(pool, "/v1/embeddings", b"{}", clock=clock))
    assert (answer.status, answer.retries, len(clients[1].calls)) == (status, 0, 0)


def test_no_retry_when_no_deadline_is_left() -> None:
    def late_break(*a: Any) -> Exception:
        clock.advance(1.5)  # the whole deadline went by before the connection broke
        return broke("primary-0")

    pool, clock, _, clients = make([late_break, lambda *a: ok()], timeout_ms=1000)
    with pytest.raises(WorkerFailed):
        run(exchange(pool, "/v1/embeddings", b"{}", clock=clock))
    assert len(clients[1].calls) == 0 and pool.retries == 0 and idle(pool)


def test_the_retry_gets_what_is_left_of_the_deadline() -> None:
    def half(*a: Any) -> Exception:
        clock.advance(0.6)
        return broke("primary-0")

    pool, clock, _, clients = make([half, lambda *a: ok()], timeout_ms=1000)
    run(exchange(pool, "/v1/embeddings", b"{}", caller_timeout_ms=5000, clock=clock))
    first, second = clients[0].calls[0], clients[1].calls[0]
    assert first["timeout_s"] == pytest.approx(1.0) and first[DEADLINE_HEADER] == "1000"
    assert second["timeout_s"] == pytest.approx(0.4) and second[DEADLINE_HEADER] == "400"


def test_a_retry_with_every_other_replica_full_is_overloaded_and_accounting_stays_exact() -> None:
    pool, clock, _, _ = make(
        [lambda *a: broke("primary-0"), lambda *a: ok()], max_inflight_per_replica=1
    )
    held = pool.acquire(5, "primary-1")
    with pytest.raises(Overloaded):
        run(exchange(pool, "/v1/embeddings", b"{}", clock=clock))
    r1 = pool.replica("primary-1")
    assert (r1.inflight, r1.outstanding_bytes) == (1, 5)
    pool.release(held, "success")
    assert idle(pool)


def test_with_no_other_replica_the_first_failure_is_answered() -> None:
    pool, clock, _, _ = make([lambda *a: broke("primary-0")])
    with pytest.raises(WorkerFailed):
        run(exchange(pool, "/v1/embeddings", b"{}", clock=clock))
    assert pool.retries == 0 and idle(pool)


def test_retry_events_are_throttled_but_every_retry_is_counted() -> None:
    pool, clock, rec, _ = make([lambda *a: broke("primary-0"), lambda *a: ok()])
    for _ in range(5):
        pool.replica("primary-0").backoff_until = None  # let it be picked first again
        pool.replica("primary-0").failure_backoff.reset()
        run(exchange(pool, "/v1/embeddings", b"{}", clock=clock))
    clock.advance(1.0)
    pool.replica("primary-0").backoff_until = None
    run(exchange(pool, "/v1/embeddings", b"{}", clock=clock))
    events = rec.of(ev.EXCHANGE_RETRIED)
    assert pool.retries == 6 and [e["count"] for e in events] == [1, 5]


def test_a_cancelled_caller_releases_its_lease() -> None:
    started = asyncio.Event()

    async def main() -> None:
        never = asyncio.get_running_loop().create_future()

        class Hanging:
            async def post(self, *a: Any, **k: Any) -> WorkerResponse:
                started.set()
                return await never

        pool = ReplicaPool("primary", clock=FakeClock())
        pool.add_replica("primary-0", "cpu", client=Hanging())
        pool.mark_ready("primary-0", 1)
        task = asyncio.ensure_future(exchange(pool, "/v1/embeddings", b"{}"))
        await started.wait()
        assert pool.replica("primary-0").inflight == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert idle(pool) and pool.replica("primary-0").outcomes["cancelled"] == 1

    run(main())


def test_a_replica_removed_mid_exchange_settles_its_own_record_not_its_successor() -> None:
    async def main() -> None:
        gate = asyncio.get_running_loop().create_future()

        class Gated:
            async def post(self, *a: Any, **k: Any) -> WorkerResponse:
                return await gate

        pool = ReplicaPool("primary", clock=FakeClock())
        old = pool.add_replica("primary-0", "cpu", client=Gated())
        pool.mark_ready("primary-0", 1)
        waker: list[int] = []
        old.idle_waiters.append(lambda: waker.append(1))
        task = asyncio.ensure_future(exchange(pool, "/v1/embeddings", b"{}"))
        await asyncio.sleep(0)
        pool.remove_replica("primary-0")  # a reload replaced it
        new = pool.add_replica("primary-0", "cpu", client=Gated())
        gate.set_result(ok())
        await task
        assert (old.inflight, waker) == (0, [1])  # the drain waiting on it wakes
        assert new.outcomes["success"] == 0 and new.inflight == 0

    run(main())


def test_a_worker_cut_off_mid_answer_is_not_retried() -> None:
    def mid_answer(*a: Any) -> Exception:
        return WorkerFailed("closed mid-answer", replica="primary-0", before_answer=False)

    pool, clock, _, clients = make([mid_answer, lambda *a: ok()])
    with pytest.raises(WorkerFailed):
        run(exchange(pool, "/v1/embeddings", b"{}", clock=clock))
    assert len(clients[1].calls) == 0 and pool.retries == 0 and idle(pool)
