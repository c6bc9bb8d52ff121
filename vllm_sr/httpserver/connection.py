"""The connection protocol: one client connection, its bytes parsed by ``httptools`` (llhttp,
the parser uvicorn uses) as they arrive, its requests run through the handler one at a time in
the order they came, each answer written back. The guarantees it keeps are listed in
``vllm_sr.httpserver``'s docstring; ``HttpServer`` (``server.py``) makes one per connection."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import TYPE_CHECKING, cast

import httptools

from vllm_sr.errors import InvalidRequest, RequestTooLarge, VllmSrError
from vllm_sr.httpserver.peer import PeerCredentials, unix_peer
from vllm_sr.httpserver.routing import error_response
from vllm_sr.httpserver.streaming import StreamResponse
from vllm_sr.httpserver.types import Request, Response, render
from vllm_sr.jsonbody import RequestTimeout

if TYPE_CHECKING:
    from vllm_sr.httpserver.server import HttpServer

log = logging.getLogger("vllm_sr.httpserver")

MAX_HEAD_BYTES = 64 * 1024  # request line and headers together
LINGER_S = 2.0  # after refusing bad bytes: how long the client may go on sending before the close


class CodingNotImplemented(VllmSrError):
    """A transfer coding other than ``chunked``: the body cannot be framed, so it is refused."""

    code = "not_implemented"
    http_status = 501


class _Unframeable(Exception):
    def __init__(self, coding: str) -> None:
        super().__init__(coding)
        self.coding = coding


class Connection(asyncio.Protocol):
    """One client connection: parses requests, runs them through the handler one at a time
    (in the order they came), writes each answer."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.loop = server.loop
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.pending: deque[tuple[Request, bool]] = deque()  # read, not yet handled
        self.handling: asyncio.Task[None] | None = None
        self.closing = False  # answer what is being handled, then close
        self.dropping = False  # the current request was refused: read its bytes, keep none
        # The request being read.
        self.reading = False
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.size = 0
        self.head_size = 0
        self.in_head = False  # between the request's first byte and the end of its headers
        self.held = False  # reading paused by us while pipelined requests wait their turn
        self.discarding = False  # refused and answered: what still comes is dropped
        self.writable: asyncio.Event | None = None  # cleared while the transport is full
        self.stream: StreamResponse | None = None  # the streamed answer under way, if any
        self.timer: asyncio.TimerHandle | None = None
        self.peer: PeerCredentials | None = None  # who connected, over a Unix socket

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports (the frontend runs on uvloop) are not asyncio.Transport subclasses
        self.transport = cast(asyncio.Transport, transport)
        cap = self.server.max_connections
        if cap is not None and len(self.server.connections) >= cap:
            self.server.turned_away += 1
            self.discarding = True  # whatever it sends is not read
            self.transport.write(self.server.full_answer)
            self.transport.close()
            return
        self.server.connections.add(self)
        self.peer = unix_peer(self.transport.get_extra_info("socket"))
        self._await_next()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.forget(self)
        self._cancel_timer()
        self.transport = None
        self.pending.clear()
        if self.writable is not None:
            self.writable.set()  # a stream waiting to write wakes, and finds the client gone
        if self.server.cancel_on_disconnect and self.handling is not None:
            self.handling.cancel()
        # Otherwise a request being handled runs to its end (a worker's forward is already
        # queued); the answer has nowhere to go and is dropped.

    def pause_writing(self) -> None:
        if self.writable is None:
            self.writable = asyncio.Event()
        self.writable.clear()

    def resume_writing(self) -> None:
        if self.writable is not None:
            self.writable.set()

    async def send(self, data: bytes) -> None:
        """Write part of a streamed answer, waiting while the client is slow to read."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the client has gone")
        self.transport.write(data)
        if self.writable is not None and not self.writable.is_set():
            await self.writable.wait()
            if self.transport is None:
                raise ConnectionResetError("the client has gone")

    def data_received(self, data: bytes) -> None:
        if self.discarding:
            return
        head_before = self.in_head
        try:
            self.parser.feed_data(data)
            if head_before and self.in_head:
                # All of it was head; httptools hands a header over only once it ends, so a
                # header without end would otherwise grow unmeasured.
                self._count_head(len(data))
        except httptools.HttpParserUpgrade:
            self.closing = True  # no protocol switches here; answer what was read, then close
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _Unframeable):  # raised in a callback, wrapped
                coding = exc.__context__.coding
                self._refuse(
                    CodingNotImplemented(
                        f"Transfer-Encoding: {coding!r} is not implemented; send the body "
                        "with Content-Length or with Transfer-Encoding: chunked alone"
                    )
                )
                return
            if self.head_size > MAX_HEAD_BYTES:
                cap = MAX_HEAD_BYTES
                self._refuse(RequestTooLarge(f"request head: over the cap of {cap} bytes"))
            else:
                self._refuse(InvalidRequest(f"malformed HTTP request: {exc}"))

    # -- httptools callbacks
    def on_message_begin(self) -> None:
        self.reading = True
        self.in_head = True
        self.url = b""
        self.headers = {}
        self.body = []
        self.size = 0
        self.head_size = 0
        if not self.held:  # a request we hold back is not the client's delay
            self._arm_timer()

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        seen = self.headers.get(key)
        self.headers[key] = text if seen is None else f"{seen}, {text}"

    def on_headers_complete(self) -> None:
        self.in_head = False
        coding = self.headers.get("transfer-encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            raise _Unframeable(coding)  # stops the parser; data_received refuses it
        if self.dropping:
            return
        length = self.headers.get("content-length")
        cap = self.server.max_body
        if length is not None and length.isdigit() and int(length) > cap:
            self._too_large(f"body: {int(length)} bytes is over the cap of {cap} bytes")
        elif (
            self.headers.get("expect", "").lower() == "100-continue"
            and self.parser.get_http_version() == "1.1"
            and self.handling is None
            and not self.pending
            and self.transport is not None
        ):
            # Only with no answer owed before it (behind one, the client sends the body after
            # its own wait): a 100 is the interim answer to the oldest request unanswered.
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self.dropping:
            return
        self.size += len(body)
        if self.size > self.server.max_body:
            self.body = []
            self._too_large(f"body: over the cap of {self.server.max_body} bytes")
            return
        self.body.append(body)

    def on_message_complete(self) -> None:
        self._cancel_timer()
        self.reading = False
        if self.dropping:
            # The refused request has been read to its end: the connection can close now.
            self.dropping = False
            self.closing = True
            self._close_when_idle()
            return
        if self.closing:
            return  # sent after a request that ended the connection, or after close()
        keep_alive = self.parser.should_keep_alive()
        self._queue(self._request(b"".join(self.body)), keep_alive)

    # -- reading
    def _count_head(self, n: int) -> None:
        self.head_size += n
        if self.head_size > MAX_HEAD_BYTES:  # stops the parser; data_received answers
            raise httptools.HttpParserError(f"request head over {MAX_HEAD_BYTES} bytes")

    def _request(self, body: bytes, error: VllmSrError | None = None) -> Request:
        url = self.url
        if not url.startswith(b"/") and b"://" in url:  # absolute form: http://host/path
            rest = url.split(b"://", 1)[1]
            slash = rest.find(b"/")
            url = rest[slash:] if slash >= 0 else b"/"
        path, _, query = url.decode("latin-1").partition("?")
        method = self.parser.get_method().decode("latin-1")
        version = self.parser.get_http_version()
        return Request(method, path, query, self.headers, body, error, self, self.peer, version)

    def _too_large(self, message: str) -> None:
        """Answer 413 now; drop the rest of this request's bytes, then close."""
        self.dropping = True
        self.closing = True
        self._queue(self._request(b"", RequestTooLarge(message)), keep_alive=False)

    def _stalled(self) -> None:
        self.timer = None
        if self.dropping:  # the refused request's rest did not come in time either
            self._close()
            return
        if not self.reading:
            return
        timeout = self.server.read_timeout_s
        error = RequestTimeout(f"body: not received within {timeout:g} s (the client stalled)")
        self.reading = False
        self.dropping = False
        self.closing = True
        if self.transport is not None:
            self.transport.pause_reading()
        self._queue(self._request(b"", error), keep_alive=False)

    def _refuse(self, error: VllmSrError) -> None:
        """Bytes that are not HTTP: answer them when no answer is owed, then close (else the
        answers owed go out first and the connection closes without this one)."""
        self._cancel_timer()
        self.reading = False
        self.in_head = False
        self.dropping = False  # the parser is stuck: the rest of a refused body will not come
        self.closing = True
        if self.transport is not None:
            self.transport.pause_reading()
        if self.handling is None and not self.pending:
            self._write(error_response(error), head_only=False)
            self._linger()

    def _linger(self) -> None:
        """Close once the client has had the answer: end our side, drop what it still sends
        (closing with its bytes unread would reset the connection, and the client could lose
        the answer), close on its end or after ``LINGER_S``."""
        if self.transport is None or not self.transport.can_write_eof():
            self._close()
            return
        self.discarding = True
        self.transport.write_eof()
        self.transport.resume_reading()
        self._cancel_timer()
        self.timer = self.loop.call_later(LINGER_S, self._close)

    def _await_next(self) -> None:
        """Idle between requests: closed after the server's ``idle_timeout_s``."""
        self._cancel_timer()
        self.timer = self.loop.call_later(self.server.idle_timeout_s, self._idle_expired)

    def _idle_expired(self) -> None:
        self.timer = None
        if not self.reading and self.handling is None and not self.pending:
            self._close()

    def _arm_timer(self) -> None:
        self._cancel_timer()
        self.timer = self.loop.call_later(self.server.read_timeout_s, self._stalled)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    # -- handling
    def _queue(self, request: Request, keep_alive: bool) -> None:
        self.pending.append((request, keep_alive))
        if self.handling is None:
            self._next()
        elif self.transport is not None:
            self.transport.pause_reading()  # pipelined: read on once the queue is answered
            self.held = True
            self._cancel_timer()  # a request half read meanwhile waits on us, not the client

    def _next(self) -> None:
        request, keep_alive = self.pending.popleft()
        self.handling = self.loop.create_task(self._handle(request, keep_alive))

    async def _handle(self, request: Request, keep_alive: bool) -> None:
        try:
            response = await self.server.handler(request)
        except asyncio.CancelledError:
            self.handling = None
            self._close()  # no answer, so none after it can go out in order
            raise
        except Exception:
            log.exception("internal error on %s %s", request.method, request.path)
            response = error_response(VllmSrError("internal error"))
        stream, self.stream = self.stream, None
        if stream is not None and response is not stream:
            # A stream began and then the handler failed (or answered otherwise): no other
            # answer can follow its head, so the cut is made visible by a reset.
            self.handling = None
            self.pending.clear()
            if self.transport is not None:
                self.transport.abort()
            return
        if stream is not None:
            # Its head and chunks went out as it ran; the end goes out if it was left open.
            with contextlib.suppress(ConnectionError):
                await stream.write_eof()
            keep_alive = keep_alive and stream.chunked  # else its end is the close
        self.handling = None
        if self.transport is None:
            return
        if stream is None:
            if isinstance(response, StreamResponse):  # never prepared: an empty answer
                response = Response(b"", response.status, response.content_type, response.headers)
            close = (self.closing and not self.pending) or not keep_alive
            try:
                self._write(response, head_only=request.method == "HEAD", close=close)
            except ValueError:  # a header that cannot be sent: answer 500 and end here
                log.exception("unsendable answer to %s %s", request.method, request.path)
                self._write(error_response(VllmSrError("internal error")), head_only=False)
                keep_alive = False
        if not keep_alive:
            self.pending.clear()  # nothing after a last request is answered
            if self.dropping:  # read the rest of the refused request; then it closes
                self.transport.resume_reading()
            else:
                self._close()
        elif self.pending:
            self._next()
        elif self.closing:
            self._close_when_idle()
        else:  # paused while pipelined requests waited (a next one may be half read)
            self.transport.resume_reading()
            self.held = False
            if self.reading:
                self._arm_timer()
            else:
                self._await_next()

    def _write(self, response: Response, *, head_only: bool, close: bool = True) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(render(response, head_only=head_only, close=close))

    def _close_when_idle(self) -> None:
        # A refused request still being read keeps the connection open until it is dropped.
        if self.handling is None and not self.pending and not self.dropping:
            self._close()

    def _close(self) -> None:
        self._cancel_timer()
        if self.transport is not None:
            self.transport.close()

    def shut(self) -> None:
        """The server is closing: close now if idle, else after the answer in hand."""
        self.closing = True
        if self.handling is None and not self.pending:
            self._close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
