"""Only an answer a forward produced counts as a success (issue 25 part 2), a worker's own 504
is a timeout (issue 30 part 4), ejected replicas serve again when no other can take requests
(issue 25 part 3), and a worker's Retry-After reaches the caller (issue 25 part 4).

The pool side runs on a fake clock with scripted clients; the worker side is the real worker
API (a fake model) and the real WorkerClient over a real socket."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any

import pytest

from tests.support.workers import short_socket_dir
from tests.unit.test_exchange import idle, make, run
from tests.unit.test_pool import exchange as pool_exchange
from tests.unit.test_pool import make_pool
from tests.unit.test_worker_api import serve, stop
from tests.unit.test_worker_client_wire import Scripted, sends
from vllm_sr import events as ev
from vllm_sr.errors import DeadlineExceeded, Overloaded
from vllm_sr.pool import outlier
from vllm_sr.pool.client import WorkerClient, WorkerResponse
from vllm_sr.pool.exchange import exchange, outcome_of
from vllm_sr.worker.result_cache import ResultCache


def answer(status: int, forward: bool | None) -> WorkerResponse:
    return WorkerResponse(status, b"{}", "application/json", {}, forward)


@pytest.mark.parametrize(
    ("status", "forward", "expected"),
    [
        (200, True, "success"),
        (200, False, "no_forward"),  # a result-cache hit
        (400, False, "no_forward"),  # a verdict on the input, from the HTTP loop
        (413, False, "no_forward"),
        (200, None, "success"),  # a runtime that does not say: nothing better is known
        (400, None, "no_forward"),
        (429, False, "refused"),
        (504, False, "timeout"),  # the worker's deadline_exceeded
        (504, None, "timeout"),
        (500, False, "failure"),
        (503, False, "failure"),
    ],
)
def test_outcome_of_counts_only_forwards_as_successes(
    status: int, forward: bool | None, expected: str
) -> None:
    assert outcome_of(status, forward) == expected


# ------------------------------------------------------------------ a hung replica (part 2)
TIMEOUT_S = 1.0


def hung_that_still_answers(clock: Any, answers_cache: bool) -> Any:
    """A replica whose forward hangs: a new text runs out of its deadline; a cached text
    (200, no forward) and a bad request (400, no forward) are still answered at once, when
    ``answers_cache``."""

    def script(path: str, body: bytes, timeout_s: float | None, headers: Any) -> Any:
        if answers_cache and b"cached" in body:
            return answer(200, False)
        if answers_cache and b"bad" in body:
            return answer(400, False)
        clock.advance(timeout_s or TIMEOUT_S)
        return DeadlineExceeded("no answer in time", replica="primary-0")

    return script


def healthy(path: str, body: bytes, timeout_s: float | None, headers: Any) -> Any:
    return answer(200, True)


def traffic_until_ejected(answers_cache: bool) -> tuple[int, int, dict[str, Any]]:
    """A mix of new texts, cached texts and bad requests, until primary-0 is ejected.
    Returns (exchanges sent in all, timeouts primary-0 had, the ejection event)."""
    pool, clock, rec, clients = make([lambda *a: None, healthy], timeout_ms=1000)
    clients[0].script = hung_that_still_answers(clock, answers_cache)
    kinds = itertools.cycle([b'{"input":"new %d"}', b'{"input":"cached"}', b'{"input":"bad"}'])

    async def drive() -> int:
        for n in range(1, 200):
            body = next(kinds).replace(b"%d", str(n).encode())
            clock.advance(0.2)
            with contextlib.suppress(DeadlineExceeded):
                await exchange(pool, "/v1/embeddings", body, clock=clock)
            if rec.of(ev.REPLICA_EJECTED):
                return n
        raise AssertionError(f"never ejected: {pool.replica('primary-0')}")

    sent = run(drive())
    assert idle(pool)
    timeouts = pool.replica("primary-0").outcomes["timeout"]
    return sent, timeouts, rec.of(ev.REPLICA_EJECTED)[0]


def test_a_hung_replica_that_still_answers_its_cache_is_ejected_as_fast_as_a_silent_one() -> None:
    _, silent_timeouts, silent = traffic_until_ejected(answers_cache=False)
    _, chatty_timeouts, chatty = traffic_until_ejected(answers_cache=True)
    assert silent["replica"] == chatty["replica"] == "primary-0"
    # The threshold (3) of timeouts, with cache hits and 400s in between resetting nothing.
    assert silent_timeouts == chatty_timeouts == 3
    assert silent["timeouts"] == chatty["timeouts"] == 3


def test_answers_without_a_forward_neither_reset_nor_vouch() -> None:
    pool, clock, rec = make_pool(2, timeout_ms=1000)
    for _ in range(3):
        pool_exchange(pool, clock, "timeout", "primary-0", took=1.0)
        clock.advance(0.5)  # past its short failure backoff
        pool_exchange(pool, clock, "no_forward", "primary-0")  # its own cache: no reset
        pool_exchange(pool, clock, "no_forward", "primary-1")  # the peer's cache: no vouching
    hung, peer = pool.replica("primary-0"), pool.replica("primary-1")
    assert hung.consecutive_timeouts == 3 and not hung.ejected
    assert rec.of(ev.REPLICA_EJECTION_WITHHELD)[0]["rule"] == outlier.RULE_NO_OTHER_ANSWERED
    assert peer.last_success_at is None and peer.outcomes["no_forward"] == 3
    pool_exchange(pool, clock, "success", "primary-1")  # a forward answered: now it may go
    clock.advance(0.5)
    pool_exchange(pool, clock, "timeout", "primary-0", took=1.0)
    assert hung.ejected


# ------------------------------------------------------------------ the worker's 504 (30/4)
def test_a_worker_answering_504_counts_timeouts_and_is_ejected() -> None:
    pool, clock, rec, clients = make([lambda *a: None, healthy], timeout_ms=1000)
    clients[0].script = lambda *a: answer(504, False)

    async def drive() -> None:
        for _ in range(12):
            clock.advance(0.2)
            resp = await exchange(pool, "/v1/embeddings", b"{}", clock=clock)
            assert resp.status in (200, 504)
            if rec.of(ev.REPLICA_EJECTED):
                return

    run(drive())
    r = pool.replica("primary-0")
    assert r.outcomes["timeout"] == 3 and r.outcomes["failure"] == 0
    assert rec.of(ev.REPLICA_EJECTED)[0]["timeouts"] == 3


# ------------------------------------------------------------------ restore rule (part 3)
def eject_first_of_two() -> tuple[Any, Any, Any]:
    pool, clock, rec = make_pool(2, timeout_ms=1000)
    pool.outliers.eject("primary-0", duration_ms=60_000)
    assert pool.replica("primary-0").ejected
    return pool, clock, rec


def test_with_the_only_other_replica_backing_off_the_ejected_one_serves_again() -> None:
    pool, clock, rec = eject_first_of_two()
    lease = pool.acquire(10)
    pool.release(lease, "failure")  # primary-1 enters its short failure backoff
    assert pool.replica("primary-1").in_backoff(clock.monotonic())
    lease = pool.acquire(10)  # today's main: 503 unavailable
    assert lease.replica_id == "primary-0" and not pool.replica("primary-0").ejected
    assert rec.of(ev.REPLICA_READMITTED)[-1]["why"] == outlier.WHY_NO_OTHER


def test_with_the_only_other_replica_merely_full_the_429_stays() -> None:
    pool, _, rec = eject_first_of_two()
    for _ in range(pool.settings.max_inflight_per_replica):
        pool.acquire(10)
    with pytest.raises(Overloaded):
        pool.acquire(10)
    assert pool.replica("primary-0").ejected and not rec.of(ev.REPLICA_READMITTED)


@pytest.mark.parametrize("leaves", ["starting", "draining", "unreachable", "backoff"])
def test_a_peer_that_cannot_take_requests_readmits_the_ejected(leaves: str) -> None:
    pool, clock, rec = eject_first_of_two()
    if leaves == "starting":
        pool.mark_starting("primary-1", 200)
    elif leaves == "draining":
        pool.mark_draining("primary-1")
    elif leaves == "unreachable":
        pool.outliers.probe_result("primary-1", healthy=False)
    else:
        pool.mark_backoff_restart("primary-1", clock.monotonic() + 5)
    assert not pool.replica("primary-0").ejected
    assert rec.of(ev.REPLICA_READMITTED)[-1]["why"] == outlier.WHY_NO_OTHER


# ------------------------------------------------------------------ the worker's headers
async def test_the_worker_says_whether_a_forward_produced_each_answer() -> None:
    s = await serve(result_cache=ResultCache(1 << 20), revision="sha256:aaaa")
    try:
        body = {"input": ["one", "two words"]}
        first = await s.client.post("/v1/embeddings", json=body)
        again = await s.client.post("/v1/embeddings", json=body)  # from its result cache
        bad = await s.client.post("/v1/embeddings", json={"input": 7})
        assert (first.status, again.status, bad.status) == (200, 200, 400)
        assert first.headers["X-Vsr-Forward"] == "1"
        assert again.headers["X-Vsr-Forward"] == "0"
        assert bad.headers["X-Vsr-Forward"] == "0"
    finally:
        await stop(s)


async def test_the_client_reads_the_forward_mark_and_passes_retry_after_on() -> None:
    srv = Scripted(
        replies={
            "/fwd": sends(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Vsr-Forward: 1\r\n"
                b"Server-Timing: total;dur=1.0\r\nContent-Length: 2\r\n\r\n{}"
            ),
            "/hit": sends(b"HTTP/1.1 200 OK\r\nX-Vsr-Forward: 0\r\nContent-Length: 2\r\n\r\n{}"),
            "/full": sends(
                b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 3\r\nX-Vsr-Forward: 0\r\n"
                b"Content-Length: 2\r\n\r\n{}"
            ),
            "/other": sends(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"),
        }
    )
    srv.path = str(short_socket_dir(prefix="vsr-w-") / "w.sock")
    server = await asyncio.start_unix_server(srv.handle, srv.path)
    client = WorkerClient(uds=srv.path, replica_id="r0")
    try:
        fwd = await client.post("/fwd", b"{}", timeout_s=5)
        hit = await client.post("/hit", b"{}", timeout_s=5)
        full = await client.post("/full", b"{}", timeout_s=5)
        other = await client.post("/other", b"{}", timeout_s=5)
        assert (fwd.forward, hit.forward, full.forward, other.forward) == (True, False, False, None)
        assert full.headers == {"Retry-After": "3"}  # today's main drops it
        assert fwd.headers == {"Server-Timing": "total;dur=1.0"}  # the mark is not passed on
    finally:
        await client.close()
        server.close()
