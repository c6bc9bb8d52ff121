"""Writes router_replay records to their store so that the store can never fail a chat.

States: ``new`` (not tried), ``up``, ``down``, ``closed`` (its generation was replaced).
``start`` (the router's start and each reload that changes the store) tries once, bounded by
the store's connect timeout, and returns either way: a store that cannot be reached leaves the
router serving with the store ``down``. While ``down``, a record is counted lost
(``lost["store_down"]``) at once, with no attempt on the chat's path; the first write or read
at or after ``retry_at`` starts one reconnect in the background (the chat that triggers it does
not wait for it), and each failed attempt doubles the wait (1 s to 60 s). A write that fails
marks the store down the same way (``lost["store_error"]``). Losses are logged at most once a
minute, with their count.

``async_writes``: false (upstream's default) awaits the record's write before the chat's
answer is handed back (at most ``WRITE_TIMEOUT_S``; a stream's bytes have all gone by then);
true puts it on a bounded queue that one task drains, so the answer never waits; a full queue
loses the record (``lost["queue_full"]``). Upstream's async writes go through a queue of 100
that the request still waits on; here nothing waits.

Timing decisions take a clock (tests drive them with a fake one); I/O is the store's."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Coroutine
from typing import TypeVar

from vllm_sr.backoff import Backoff
from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.errors import VllmSrError
from vllm_sr.router.replay.store import (
    ReadResult,
    Record,
    ReplayQuery,
    ReplayStore,
    StoreUnavailable,
)

log = logging.getLogger("vllm_sr.router.replay")

WRITE_TIMEOUT_S = 3.0
CONNECT_TIMEOUT_S = 5.0  # the whole connect (the store's own timeouts are shorter)
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0
LOG_EVERY_S = 60.0
QUEUE_SIZE = 1000
_T = TypeVar("_T")


class ReplayWriter:
    def __init__(
        self,
        store: ReplayStore,
        *,
        async_writes: bool = False,
        clock: Clock = SYSTEM_CLOCK,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self.store = store
        self.async_writes = async_writes
        self.clock = clock
        self.state = "new"
        self.backoff = Backoff(BACKOFF_FIRST_S, BACKOFF_MAX_S, clock=clock)
        self.written = 0
        self.lost: Counter[str] = Counter()
        self.last_error = ""
        self._lock = asyncio.Lock()
        self._reconnect: asyncio.Task[None] | None = None
        self._queue: asyncio.Queue[tuple[Record, int]] = asyncio.Queue(queue_size)
        self._drain: asyncio.Task[None] | None = None
        self._logged_at: float | None = None
        self._unlogged = 0

    async def start(self) -> None:
        """Try the store once (bounded); never raises."""
        await self._connect()

    async def _connect(self, retry: bool = False) -> None:
        """The first try (``retry`` False: only while ``new``, so chats that arrive during it
        do not each try again) or a reconnect."""
        async with self._lock:
            if self.state == "up" or (self.state == "down" and not retry):
                return
            try:
                await asyncio.wait_for(self.store.connect(), CONNECT_TIMEOUT_S)
            except (StoreUnavailable, TimeoutError) as exc:
                self._down(exc, None)
                return
            if self.state != "up":
                log.info("router_replay store %s is up", self.store.kind)
            self.state = "up"
            self.backoff.reset()

    def _down(self, exc: BaseException, reason: str | None) -> None:
        own = exc.message if isinstance(exc, VllmSrError) else None
        message = own or f"{type(exc).__name__}: {exc}"
        was = self.state
        self.state = "down"
        self.last_error = message
        self.backoff.fail()
        if was != "down":
            log.warning(
                "router_replay store %s is down (records are lost until it is back; "
                "retrying in %.0f s): %s",
                self.store.kind,
                self.backoff.current,
                message,
            )
        if reason is not None:
            self._lose(reason)

    def _lose(self, reason: str) -> None:
        self.lost[reason] += 1
        self._unlogged += 1
        now = self.clock.monotonic()
        if self._logged_at is None or now - self._logged_at >= LOG_EVERY_S:
            log.warning(
                "router_replay: %d record(s) lost (%s; store %s: %s)",
                self._unlogged,
                reason,
                self.store.kind,
                self.last_error or "-",
            )
            self._logged_at, self._unlogged = now, 0

    def _maybe_reconnect(self) -> None:
        if self.state == "down" and self._reconnect is None and self.backoff.due():
            self._reconnect = asyncio.ensure_future(self._reconnect_once())

    async def _reconnect_once(self) -> None:
        try:
            await self._connect(retry=True)
        finally:
            self._reconnect = None

    async def write(self, record: Record, max_records: int) -> None:
        """Keep ``record`` (never raises; a record that cannot be kept is counted lost)."""
        if self.state == "new":
            await self._connect()
        if not self.async_writes:
            await self._write_now(record, max_records)
            return
        if self._drain is None:
            self._drain = asyncio.ensure_future(self._drain_queue())
        try:
            self._queue.put_nowait((record, max_records))
        except asyncio.QueueFull:
            self._lose("queue_full")

    async def _drain_queue(self) -> None:
        while True:
            record, max_records = await self._queue.get()
            try:
                await self._write_now(record, max_records)
            finally:
                self._queue.task_done()

    async def _write_now(self, record: Record, max_records: int) -> None:
        if self.state != "up":
            self._maybe_reconnect()
            self._lose("closed" if self.state == "closed" else "store_down")
            return
        try:
            await asyncio.wait_for(self.store.add(record, max_records), WRITE_TIMEOUT_S)
        except (StoreUnavailable, TimeoutError) as exc:
            self._down(exc, "store_error")
            return
        self.written += 1

    async def read(self, query: ReplayQuery) -> ReadResult:
        """The store's records; raises StoreUnavailable (retryable) while it is down."""
        return await self._ask(self.store.read(query))

    async def get(self, record_id: str) -> Record | None:
        """One record by id; raises StoreUnavailable (retryable) while the store is down."""
        return await self._ask(self.store.get(record_id))

    async def append_outcome(self, record_id: str, outcome: Record) -> bool:
        """Add a verdict to the record (False: no such record); raises StoreUnavailable while
        the store is down."""
        return await self._ask(self.store.append_outcome(record_id, outcome))

    async def _ask(self, query: Coroutine[object, object, _T]) -> _T:
        if self.state == "new":
            await self._connect()
        if self.state != "up":
            query.close()
            self._maybe_reconnect()
            raise StoreUnavailable(
                f"the router_replay store {self.store.kind} is down ({self.last_error}); "
                "it is retried in the background, ask again"
            )
        try:
            return await asyncio.wait_for(query, WRITE_TIMEOUT_S)
        except (StoreUnavailable, TimeoutError) as exc:
            self._down(exc, None)
            raise StoreUnavailable(
                f"the router_replay store {self.store.kind} failed: {self.last_error}"
            ) from None

    async def flush(self) -> None:
        """Wait until every queued record was written or lost (async_writes)."""
        if self._drain is not None:
            await self._queue.join()

    async def close(self) -> None:
        """Write what is queued (bounded), then close the store; a chat still in flight from
        the replaced generation counts its record lost (``closed``) and reopens nothing."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.flush(), WRITE_TIMEOUT_S)
        self.state = "closed"
        for task in (self._drain, self._reconnect):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._drain = self._reconnect = None
        with contextlib.suppress(StoreUnavailable, TimeoutError):
            await asyncio.wait_for(self.store.close(), WRITE_TIMEOUT_S)

    def to_json(self) -> dict[str, object]:
        """For the inventory and /metrics."""
        return {
            "store": self.store.kind,
            "state": self.state,
            "written": self.written,
            "lost": dict(self.lost),
            "queued": self._queue.qsize(),
        }
