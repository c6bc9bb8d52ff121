"""A streamed answer: the status and headers as soon as the head is parsed, then the body as an
async iterator of the bytes as they arrive (a chat's SSE goes through token by token), for
bodies that are chunked, have a Content-Length or end with the connection.

Flow control: what has arrived and not been read is held here; past ``HIGH_WATER_BYTES`` the
connection stops reading from its socket (``pause_reading``: the server's sends then block in
TCP, not in our memory) until the reader has taken it. A read waits at most
``read_timeout_s`` for the next bytes (``TimeoutError``); a connection that breaks mid-body
raises its ``Broken`` once the bytes that did arrive are read. The connection goes back to its
client (``release``) as soon as the body's last byte arrives, or is closed when the reader
gives up first (``aclose``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from vllm_sr.pool.connection import MAX_RESPONSE_BYTES, Broken

HIGH_WATER_BYTES = 256 * 1024  # held unread before the socket is no longer read


def _expire(waiter: asyncio.Future[None], message: str) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError(message))


async def within(waiter: asyncio.Future[None], seconds: float | None, what: str) -> None:
    """Await ``waiter``; past ``seconds`` it fails with ``TimeoutError`` ("the server
    {what} within N s"). A timer on the future: no task, no cancellation (cheap per read)."""
    if seconds is None:
        await waiter
        return
    timer = asyncio.get_running_loop().call_later(
        seconds, _expire, waiter, f"the server {what} within {seconds:g} s"
    )
    try:
        await waiter
    finally:
        timer.cancel()


class StreamedAnswer:
    """One streamed answer. ``head`` resolves when ``status`` and ``headers`` (lower-case
    names; repeated headers joined with ", ") are known; iterate for the body."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        release: Callable[[bool], None],
        read_timeout_s: float | None = None,
    ) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.head: asyncio.Future[None] = loop.create_future()
        self._loop = loop
        self._release: Callable[[bool], None] | None = release  # None once called
        self._read_timeout_s = read_timeout_s
        self._transport: asyncio.Transport | None = None
        self._parts: list[bytes] = []
        self._held = 0  # bytes in _parts
        self._paused = False
        self._ended = False
        self._error: BaseException | None = None
        self._wake: asyncio.Future[None] | None = None

    @property
    def media_type(self) -> str:
        """The Content-Type without parameters, lower case (``text/event-stream``)."""
        return self.headers.get("content-type", "").split(";", 1)[0].strip().lower()

    # -- fed by the connection ------------------------------------------------------------------
    def attach(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def begin(self, status: int) -> None:
        self.status = status
        if not self.head.done():
            self.head.set_result(None)

    def feed(self, data: bytes) -> None:
        self._parts.append(data)
        self._held += len(data)
        if self._held > HIGH_WATER_BYTES and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wakeup()

    def end(self) -> None:
        """The body's last byte arrived: the connection goes back to its client."""
        self._ended = True
        self._resume()
        self._wakeup()
        self._give_back(True)

    def fail(self, exc: Broken) -> None:
        if not self.head.done():
            self.head.set_exception(exc)
        self._error = exc
        self._wakeup()
        self._give_back(False)

    # -- read by the caller ---------------------------------------------------------------------
    def __aiter__(self) -> StreamedAnswer:
        return self

    async def __anext__(self) -> bytes:
        """Everything that arrived since the last read (at least one byte)."""
        while True:
            parts = self._parts
            if parts:
                data = parts[0] if len(parts) == 1 else b"".join(parts)
                self._parts = []
                self._held = 0
                self._resume()
                return data
            if self._error is not None:
                raise self._error
            if self._ended:
                raise StopAsyncIteration
            await self._next()

    async def read(self, limit: int = MAX_RESPONSE_BYTES) -> bytes:
        """The rest of the body, whole; ``Broken`` past ``limit`` bytes."""
        out: list[bytes] = []
        size = 0
        async for data in self:
            size += len(data)
            if size > limit:
                await self.aclose()
                raise Broken(f"answer over {limit} bytes", before_answer=False)
            out.append(data)
        return b"".join(out)

    async def aclose(self) -> None:
        """Done with the answer: a body not read to its end closes the connection."""
        if not self._ended:
            self._error = self._error or Broken("closed by the reader", before_answer=False)
            self._give_back(False)

    async def _next(self) -> None:
        self._wake = self._loop.create_future()
        try:
            await within(self._wake, self._read_timeout_s, "sent nothing more")
        finally:
            self._wake = None

    def _wakeup(self) -> None:
        waiter = self._wake
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _resume(self) -> None:
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()

    def _give_back(self, whole: bool) -> None:
        release, self._release = self._release, None
        if release is not None:
            release(whole)
