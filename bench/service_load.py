"""The load generator of `make bench-service` (bench/service.py): keep-alive connections that
each write a request in one write and find its answer's end themselves, closed loops of distinct
texts, and the c=1 split of each answer's Server-Timing marks."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from typing import Any

from bench.ceiling import FIRST_NUMBER

REQUEST_NUMBERS = itertools.count(FIRST_NUMBER)


REQUEST_HEAD = (
    b"POST /v1/embeddings HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n"
)


class Conn(asyncio.Protocol):
    """One keep-alive connection of the load generator: it writes each request in one write
    and finds the answer's end from its head (status line, Content-Length) itself, so that
    the generator, on the same two cores, takes as little of them as a small C client would
    (asyncio's streams took about 0.4 ms of CPU per request at c=1, as much as the frontend)."""

    def __init__(self, timing: bool = False) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.end = -1  # where the answer ends in ``buf``, once its head is in
        self.status = 0
        self.timing = timing  # read the worker's Server-Timing marks (c=1 only: it costs CPU)
        self.marks: dict[str, float] = {}
        self.waiter: asyncio.Future[int] | None = None
        self.lost: Exception | None = None  # why the connection can take no more requests

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def post(self, body: bytes) -> asyncio.Future[int]:
        """The answer's status, once the whole answer has come."""
        assert self.transport is not None
        self.buf.clear()
        self.end = -1
        self.waiter = asyncio.get_running_loop().create_future()
        if self.lost is not None:
            self.waiter.set_exception(self.lost)
        else:
            self.transport.write(REQUEST_HEAD % len(body) + body)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():  # nobody asked: the stream is out of step
            self._fail(ConnectionError("bytes after an answer"))
            return
        self.buf += data
        if self.end < 0:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = bytes(self.buf[:head_end]).lower()
            at = head.find(b"\r\ncontent-length:")
            if at < 0:
                self._fail(ConnectionError("an answer without Content-Length"))
                return
            line_end = head.find(b"\r\n", at + 2)
            length = int(head[at + 17 : line_end if line_end >= 0 else None])
            self.status = int(head[9:12])
            self.end = head_end + 4 + length
            if self.timing:
                self.marks = server_timing(head)
        if len(self.buf) > self.end:
            self._fail(ConnectionError("bytes after the answer"))
        elif len(self.buf) == self.end and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(self.status)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionError("the service closed the connection"))

    def _fail(self, exc: Exception) -> None:
        """End the connection: the request in flight, and any later one, fail with ``exc``."""
        self.lost = self.lost or exc
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(self.lost)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


def server_timing(head: bytes) -> dict[str, float]:
    """The ``Server-Timing`` marks of an answer's (lower-cased) head, in milliseconds:
    ``parse;dur=0.021, tokenize;dur=0.140, ...`` -> {"parse": 0.021, "tokenize": 0.14, ...}."""
    at = head.find(b"\r\nserver-timing:")
    if at < 0:
        return {}
    line_end = head.find(b"\r\n", at + 2)
    marks = {}
    for part in head[at + 16 : line_end if line_end >= 0 else None].split(b","):
        name, _, dur = part.strip().partition(b";dur=")
        if dur:
            marks[name.decode()] = float(dur)
    return marks


def bodies(texts: list[str]) -> list[bytes]:
    """Each text's JSON body up to its request number: ``numbered(texts, n)``'s body is
    ``bodies(texts)[n % len(texts)] + b"%d\"}" % n`` (json.dumps of a dict per request cost
    more than the rest of the generator's work)."""
    return [json.dumps({"input": f"{t} #"}).encode()[:-2] for t in texts]


async def load(port: int, texts: list[str], concurrency: int, seconds: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    timing = concurrency == 1

    def conn() -> Conn:
        return Conn(timing)

    conns = [(await loop.create_connection(conn, "127.0.0.1", port))[1] for _ in range(concurrency)]
    heads = bodies(texts)
    latencies: list[float] = []
    marks: list[dict[str, float]] = []
    stop_at = 0.0

    async def client(conn: Conn) -> None:
        while time.perf_counter() < stop_at:
            # Distinct across the whole run: a text sent in an earlier cell would be answered
            # from the workers' result caches (two replicas keep them).
            n = next(REQUEST_NUMBERS)
            body = heads[n % len(heads)] + b'%d"}' % n
            t0 = time.perf_counter()
            if await conn.post(body) != 200:
                raise RuntimeError("the service answered an error")
            latencies.append(time.perf_counter() - t0)
            if timing:
                marks.append({**conn.marks, "client": latencies[-1] * 1000})

    stop_at = time.perf_counter() + 0.5  # warm every connection
    await asyncio.gather(*(client(c) for c in conns))
    latencies.clear()
    marks.clear()
    start = time.perf_counter()
    stop_at = start + seconds
    await asyncio.gather(*(client(c) for c in conns))
    elapsed = time.perf_counter() - start
    for c in conns:
        assert c.transport is not None
        c.transport.close()
    latencies.sort()
    return {
        "rows_s": len(latencies) / elapsed,
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        **({"split": c1_split(marks)} if timing else {}),
    }


def c1_split(marks: list[dict[str, float]]) -> dict[str, float]:
    """Medians over the requests of a c=1 cell, in ms: the time outside the worker's handler
    (load generator, frontend, the worker's server), and inside it tokenizing, the forward
    (from the first forward that took the request's rows to its answer), and the rest (parse,
    queue, the hand-offs between the loop and the forward thread, JSON)."""

    marks = [m for m in marks if "total" in m]
    if not marks:  # no Server-Timing came back
        return {}

    def median(f: Any) -> float:
        return statistics.median(f(m) for m in marks)

    return {
        "outside": median(lambda m: m["client"] - m["total"]),
        "tokenize": median(lambda m: m.get("tokenize", 0.0)),
        "forward": median(lambda m: m.get("forward", 0.0)),
        "handler_rest": median(
            lambda m: m["total"] - m.get("forward", 0.0) - m.get("tokenize", 0.0)
        ),
    }
