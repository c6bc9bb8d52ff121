"""The router's side of the signal processes: one :class:`SignalProcConnection` per running
process (an asyncio protocol on the parent's end of its socket pair) and the
:class:`SignalDispatch` that hands a chat's CPU-bound signals to the least busy ready one.

The supervisor owns the processes (``vllm_sr/supervisor/signal_procs.py``: spawn, ready,
restart with backoff, events, inventory) and adds each ready connection here; the router only
calls :meth:`SignalDispatch.run`. A process that dies (or a job past its deadline) fails its
jobs with :class:`SignalProcessFailed`, never anything else, so the one call site in
``route.py`` can turn it into "those signals did not match" (and, later, "unknown").
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import pickle
import socket
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from vllm_sr.errors import VllmSrError
from vllm_sr.router.signal_proc_wire import FrameError, FrameReader, encode, encode_raw

if TYPE_CHECKING:
    from vllm_sr.router.cpu_signals import CpuReport, ViewFields
    from vllm_sr.router.rules import SignalKey
    from vllm_sr.router.signals import SignalResult

log = logging.getLogger("vllm_sr.router")

# Where a chat's CPU-bound step runs (measured with bench/router_signals.py --handoff;
# docs/router.md, "Signal processes"). The hand-off costs the loop 70-145 us per chat up to
# 1 KiB of text (pickling, the socket, two wake-ups) and adds the process's compute and
# wake-ups to the chat's latency. So a chat stays on the loop when the loop has nothing else
# to do (no other chat in the router: handing off would only add latency), unless its text is
# so long that it would hold the loop for milliseconds (ALONE_MIN_CHARS); with other chats in
# flight it goes to a process when its step is heavy (language or pii: 0.4 ms and more even
# for 16 characters) or its text passes DEFAULT_MIN_CHARS (keywords alone: 34 us at 256
# characters, 138 us at 1 KiB, so more than the hand-off from about 1 KiB on).
DEFAULT_MIN_CHARS = 1024
ALONE_MIN_CHARS = 8192
# A chat's deployment answers go to a process only while one has at most this many jobs in
# flight. Reading them there saves the loop 0.25-0.35 ms a chat, but costs the process more
# (measured at c=64 with one process on 2 cores: 0.7-1.0 ms more per chat, its language
# detection slowing beside the banks' memory): where the processes are the bottleneck the
# answers are read on the loop, where they have room (more cores, less load) they are not.
ROOM_JOBS = 1
DEFAULT_JOB_TIMEOUT_S = 10.0


class SignalProcessFailed(VllmSrError):
    """A signal process could not answer a job: it died (``reason`` ``died``), it did not
    answer in time (``timeout``) or its evaluation raised (``error``)."""

    code = "signal_process_failed"
    http_status = 503
    retryable = True

    def __init__(self, message: str, *, reason: str, process: str = "") -> None:
        super().__init__(message, reason=reason, process=process)
        self.reason = reason
        self.process = process


@dataclass(frozen=True)
class Spec:
    """What a process must hold before a job names it, pickled once by the router and sent
    once per process: a generation's CPU-bound signals (``kind`` ``config``, a
    ``CpuSignalSpec``) or one deployment's questions with their cached embeddings
    (``questions``, a ``DeploymentQuestions``). Ids are unique across both kinds."""

    kind: str
    id: int
    body: bytes


@dataclass(frozen=True)
class SignalJob:
    """One chat's off-loop step: its CPU-bound signals (``spec_id``: the generation's
    ``CpuSignalSpec``) on its ``fields``, and its deployments' answers to read (``answers``:
    the questions' spec id and the answer's bytes as they came). With ``known`` (the results
    the chat had before the step) the process also runs the derived steps and answers with
    the chat's whole results (``CpuReport.finished``). ``specs``: every spec it names."""

    spec_id: int
    fields: ViewFields
    answers: tuple[tuple[int, bytes], ...] = ()
    specs: tuple[Spec, ...] = ()
    known: dict[SignalKey, SignalResult] | None = None


class SignalProcConnection(asyncio.Protocol):
    """The parent's end of one signal process's socket pair."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.pid: int | None = None
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.pending: dict[int, asyncio.Future[CpuReport]] = {}
        self.specs_sent: set[int] = set()
        self.jobs = 0  # answered
        self.failed_jobs = 0  # failed by its death, a deadline or an error
        self.cut = False  # this side cut the connection (a job passed its deadline: hung)
        self._ids = itertools.count(1)
        self._reader = FrameReader()

    @property
    def alive(self) -> bool:
        return self.transport is not None and not self.closed.done()

    @property
    def inflight(self) -> int:
        return len(self.pending)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods
        self.transport = cast("asyncio.Transport", transport)

    def data_received(self, data: bytes) -> None:
        try:
            messages = self._reader.feed(data)
        except FrameError as exc:
            log.error("signal process %s: %s; closing its connection", self.name, exc)
            if self.transport is not None:
                self.transport.abort()
            return
        for message in messages:
            self._on_message(message)

    def _on_message(self, message: tuple[object, ...]) -> None:
        kind = message[0]
        if kind == "ready" and not self.ready.done():
            self.pid = int(str(message[1]))
            self.ready.set_result(self.pid)
            return
        job_id = message[1]
        fut = self.pending.pop(job_id, None) if isinstance(job_id, int) else None
        if fut is None or fut.done():
            return  # its caller gave up (a deadline): the answer is dropped
        if kind == "ok":
            self.jobs += 1
            fut.set_result(message[2])  # type: ignore[arg-type]
        else:
            self.failed_jobs += 1
            fut.set_exception(
                SignalProcessFailed(
                    f"signal process {self.name}: {message[2]}", reason="error", process=self.name
                )
            )

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        if not self.ready.done():
            self.ready.set_exception(
                SignalProcessFailed(
                    f"signal process {self.name} went away before it was ready",
                    reason="died",
                    process=self.name,
                )
            )
            self.ready.exception()  # retrieved: a waiter may have given up already
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done():
                self.failed_jobs += 1
                fut.set_exception(
                    SignalProcessFailed(
                        f"signal process {self.name} (pid {self.pid}) died with the job in flight",
                        reason="died",
                        process=self.name,
                    )
                )

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def run(self, job: SignalJob, timeout_s: float) -> CpuReport:
        if not self.alive or self.transport is None:
            raise SignalProcessFailed(
                f"signal process {self.name} is gone", reason="died", process=self.name
            )
        for spec in job.specs:
            if spec.id not in self.specs_sent:
                self.specs_sent.add(spec.id)
                self.transport.write(encode((spec.kind, spec.id, spec.body)))
        job_id = next(self._ids)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[CpuReport] = loop.create_future()
        self.pending[job_id] = fut
        self.transport.write(encode_raw(_job_body(job_id, job)))
        # one timer per job (cheaper on the loop than wait_for's extra future and callbacks)
        timer = loop.call_later(timeout_s, self._expire, job_id, timeout_s)
        try:
            return await fut
        finally:
            timer.cancel()
            self.pending.pop(job_id, None)  # (a caller cancelled: its answer is dropped)

    def _expire(self, job_id: int, timeout_s: float) -> None:
        """A job past its deadline. The process is taken for hung: its connection is cut (its
        other jobs fail at once instead of each waiting out its own deadline), and the
        supervisor, seeing the connection closed, stops it and starts another."""
        fut = self.pending.pop(job_id, None)
        if fut is None or fut.done():
            return
        self.failed_jobs += 1
        fut.set_exception(
            SignalProcessFailed(
                f"signal process {self.name} did not answer within {timeout_s:g} s",
                reason="timeout",
                process=self.name,
            )
        )
        if self.transport is not None:
            self.cut = True
            self.transport.abort()


def _job_body(job_id: int, job: SignalJob) -> bytes:
    message = ("job", job_id, job.spec_id, job.fields, job.answers, job.known)
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


async def connect(sock: socket.socket, name: str) -> SignalProcConnection:
    """Wrap the parent's end of a socket pair."""
    loop = asyncio.get_running_loop()
    conn = SignalProcConnection(name)
    await loop.create_unix_connection(lambda: conn, sock=sock)
    return conn


class SignalDispatch:
    """The ready signal processes. ``min_chars``: below it a chat stays on the loop."""

    def __init__(
        self,
        *,
        min_chars: int = DEFAULT_MIN_CHARS,
        alone_min_chars: int = ALONE_MIN_CHARS,
        timeout_s: float = DEFAULT_JOB_TIMEOUT_S,
    ) -> None:
        self.min_chars = min_chars
        self.alone_min_chars = alone_min_chars
        self.timeout_s = timeout_s
        self.connections: list[SignalProcConnection] = []
        self.handed_off = 0
        self.on_loop = 0
        self.busy = 0  # chats in the router now, until their answer starts (``in_flight``)
        self.failures: Counter[str] = Counter()  # by reason

    def add(self, conn: SignalProcConnection) -> None:
        self.connections.append(conn)

    def remove(self, conn: SignalProcConnection) -> None:
        if conn in self.connections:
            self.connections.remove(conn)

    @contextlib.contextmanager
    def in_flight(self) -> Iterator[None]:
        """Around a chat in the router (``ChatRouter.handle_chat``): ``busy`` counts them."""
        self.busy += 1
        try:
            yield
        finally:
            self.busy -= 1

    def has_room(self) -> bool:
        """Whether a live process has at most ``ROOM_JOBS`` jobs in flight (a chat's answers
        then go along with its step)."""
        return any(c.alive and c.inflight <= ROOM_JOBS for c in self.connections)

    def takes(self, size: int, heavy: bool) -> bool:
        """Whether a chat's step goes to a process: one is ready, and the chat's text is past
        ``alone_min_chars``, or another chat is in the router and this one's step is
        ``heavy`` (language, pii) or its text is past ``min_chars``. Counts the answer."""
        alive = any(c.alive for c in self.connections)
        crowded = self.busy > 1 and (heavy or size >= self.min_chars)
        if alive and (crowded or size >= self.alone_min_chars):
            self.handed_off += 1
            return True
        self.on_loop += 1
        return False

    async def run(self, job: SignalJob) -> CpuReport:
        """One job on the least busy live process. Raises SignalProcessFailed."""
        live = [c for c in self.connections if c.alive]
        if not live:
            self.failures["died"] += 1
            raise SignalProcessFailed("no signal process is running", reason="died")
        conn = min(live, key=lambda c: c.inflight)
        try:
            return await conn.run(job, self.timeout_s)
        except SignalProcessFailed as exc:
            self.failures[exc.reason] += 1
            raise

    def inventory(self) -> dict[str, object]:
        return {
            "handed_off": self.handed_off,
            "on_loop": self.on_loop,
            "min_chars": self.min_chars,
            "alone_min_chars": self.alone_min_chars,
            "failures": dict(sorted(self.failures.items())),
        }
