"""One outbound HTTP/1.1 connection, as the client (``vllm_sr.pool.client``) drives it: an
asyncio protocol whose answer is parsed by ``httptools`` (llhttp, the parser uvicorn uses) fed
straight from ``data_received``, and the typed ways an exchange on it ends.

An exchange is buffered (``begin``: one future, resolved with the whole answer; the frontend's
exchanges with workers) or streamed (``begin_stream``: the answer's head resolves a
``StreamedAnswer``, whose body is handed over as it arrives; an LLM backend's chat). Either
way the caller's body bytes go out unchanged and the server's come back unchanged. An exchange
that ends without a whole answer raises ``Broken``, which says whether any byte of an answer
had arrived (``before_answer``: the request may be sent elsewhere), whether the connection
was never opened (``connecting``) and whether the cause was this process's own shortage of
descriptors (``local``). Caps: the answer's head (``MAX_HEADER_BYTES``) and a buffered body
(``MAX_RESPONSE_BYTES``); past either the connection is closed and the exchange broken. A
streamed body has no cap: the reader's pace bounds what is held (``StreamedAnswer``).
"""

from __future__ import annotations

import asyncio
import errno
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httptools

from vllm_sr import wire

if TYPE_CHECKING:
    from vllm_sr.pool.stream import StreamedAnswer

# Cap on what a worker may send back; a larger answer is a broken worker, not a big result.
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
MAX_HEADER_BYTES = 64 * 1024
# What the frontend's answer contract passes on to callers from a worker's answer (docs/serve.md):
# the worker's timing split, and a 429's or 503's advice on when to try again.
PASSED_HEADERS = (b"server-timing", b"retry-after")
FORWARD_HEADER = (
    wire.FORWARD_HEADER.lower().encode()
)  # the worker's "1"/"0": did a forward produce the answer


@dataclass(frozen=True)
class WorkerResponse:
    status: int
    body: bytes
    content_type: str
    headers: dict[str, str]
    # Whether a forward produced the answer (``X-Vsr-Forward``); None when the worker does
    # not say (an attached runtime that is not ours).
    forward: bool | None = None

    def json(self) -> object:
        return json.loads(self.body)


# A connect that fails for want of our own resources says nothing of the worker.
LOCAL_SHORTAGE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class Broken(Exception):
    """The exchange on one connection ended without a whole answer."""

    def __init__(
        self, reason: str, *, before_answer: bool, local: bool = False, connecting: bool = False
    ) -> None:
        super().__init__(reason)
        self.before_answer = before_answer
        self.local = local  # this process is out of descriptors (or memory) to connect with
        self.connecting = connecting  # no connection was opened (refused, TLS, timed out...)


class Connection(asyncio.Protocol):
    """One connection: the transport, its parser, and the state of the exchange in flight."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[WorkerResponse] | None = None  # a buffered exchange
        self.sink: StreamedAnswer | None = None  # a streamed exchange, until its body ends
        self.closed = False
        self.keep = False
        self.idle_since = 0.0  # when it last went back to the idle pool (the client's clock)
        self.drained: asyncio.Future[None] | None = None  # while the write buffer is full
        self._reset()

    def _reset(self) -> None:
        self.got_bytes = False  # any byte of this exchange's answer arrived
        self.head_done = False
        self.head_bytes = 0  # bytes of a head not finished yet
        self.header_bytes = 0  # names and values of the headers parsed
        self.until_eof = True  # no Content-Length nor chunked: the body ends with the stream
        self.ctype = "application/json"
        self.passed: dict[str, str] = {}
        self.forward: bool | None = None
        self.parts: list[bytes] = []
        self.size = 0
        self.interim = False  # the answer being parsed is a 1xx (a streamed exchange skips it)

    def begin(self, data: bytes) -> asyncio.Future[WorkerResponse]:
        assert self.transport is not None
        self._reset()
        self.keep = False
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self.waiter

    def begin_stream(self, data: bytes, sink: StreamedAnswer) -> None:
        """Send ``data``; the answer goes to ``sink`` (its ``head`` future, then its body)."""
        assert self.transport is not None
        self._reset()
        self.keep = False
        self.waiter = None
        self.sink = sink
        sink.attach(self.transport)
        self.transport.write(data)

    def _in_flight(self) -> bool:
        if self.sink is not None:
            return True
        waiter = self.waiter
        return waiter is not None and not waiter.done()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (asyncio's, or uvloop's, which does not subclass asyncio's).
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        waiter = self.waiter  # ``_in_flight()`` inlined: this runs per read
        if self.sink is None and (waiter is None or waiter.done()):
            # Bytes nobody asked for: the stream is corrupt.
            self.keep = False
            self.abort()
            return
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail("the server switched protocols", before_answer=False)
        except httptools.HttpParserError as exc:
            self._fail(f"not an HTTP/1.x answer: {exc}", before_answer=False)
        else:
            if not self.head_done:
                self.head_bytes += len(data)  # the head is unfinished: all of it is head
                if self.head_bytes > MAX_HEADER_BYTES:
                    self._fail(f"answer head over {MAX_HEADER_BYTES} bytes", before_answer=False)

    def eof_received(self) -> bool | None:
        self._lost("the server closed the connection")
        return None  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        drained = self.drained
        if drained is not None and not drained.done():
            drained.set_result(None)  # the writer finds the connection closed
        self._lost(f"connection lost: {exc}" if exc else "the server closed the connection")

    def pause_writing(self) -> None:
        self.drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        drained, self.drained = self.drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def _lost(self, reason: str) -> None:
        if not self._in_flight():
            return
        if self.head_done and self.until_eof:  # a body delimited by the end of the stream
            self.keep = False
            sink = self.sink
            if sink is not None:
                self.sink = None
                sink.end()
            elif self.waiter is not None:
                self.waiter.set_result(self._answer())
            return
        self._fail(reason, before_answer=not self.got_bytes)

    def _fail(self, reason: str, *, before_answer: bool) -> None:
        self.keep = False
        sink = self.sink
        if sink is not None:
            self.sink = None
            sink.fail(Broken(reason, before_answer=before_answer))
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(Broken(reason, before_answer=before_answer))
        self.abort()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # httptools callbacks
    def on_message_begin(self) -> None:
        if not self._in_flight():  # a second answer to one request
            self._fail("bytes after the answer", before_answer=False)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head_done:
            return  # a trailer (after a chunked body): nothing of it is passed on
        self.header_bytes += len(name) + len(value)
        key = name.lower()
        sink = self.sink
        if sink is not None:  # a streamed answer keeps every header (repeats joined)
            k, v = key.decode("latin-1"), value.decode("latin-1")
            sink.headers[k] = f"{sink.headers[k]}, {v}" if k in sink.headers else v
        if key == b"content-type":
            self.ctype = value.decode("latin-1")
        elif key == b"content-length" or key == b"transfer-encoding":
            self.until_eof = False
        elif key in PASSED_HEADERS:
            self.passed[name.decode("latin-1")] = value.decode("latin-1")
        elif key == FORWARD_HEADER:
            self.forward = value.strip() == b"1"

    def on_headers_complete(self) -> None:
        self.head_done = True
        if self.header_bytes > MAX_HEADER_BYTES:
            self._fail(f"answer head over {MAX_HEADER_BYTES} bytes", before_answer=False)
            return
        sink = self.sink
        if sink is not None:
            status = self.parser.get_status_code()
            if 100 <= status < 200:
                self.interim = True
                sink.headers.clear()
            else:
                sink.begin(status)

    def on_body(self, body: bytes) -> None:
        sink = self.sink
        if sink is not None:
            sink.feed(body)
            return
        self.size += len(body)
        if self.size > MAX_RESPONSE_BYTES:
            self._fail(f"answer over {MAX_RESPONSE_BYTES} bytes", before_answer=False)
        else:
            self.parts.append(body)

    def on_message_complete(self) -> None:
        sink = self.sink
        if sink is not None:
            if self.interim:
                self._reset()
                self.got_bytes = True
                return
            self.keep = self.parser.should_keep_alive()
            self.sink = None
            sink.end()
            return
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            self._reset()
            self.got_bytes = True
            return
        self.keep = self.parser.should_keep_alive()
        waiter.set_result(self._answer())

    def _answer(self) -> WorkerResponse:
        parts = self.parts
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        self.parts = []
        status = self.parser.get_status_code()
        return WorkerResponse(status, body, self.ctype, self.passed, self.forward)
