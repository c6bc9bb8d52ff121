"""WorkerClient: the frontend's and the supervisor's HTTP/1.1 client for one worker, over its
Unix socket (managed workers) or an attached runtime's endpoint (``http://``, ``https://`` or
``unix:``, see ``vllm_sr.endpoint``).

Answers are parsed by ``httptools`` (llhttp, the parser uvicorn uses) fed straight from an
asyncio protocol, rather than by a general client: the frontend forwards every request through
it, and the per-request Python work of a general client (URL objects, cookie jars, tracing
hooks, header multidicts) is most of what the frontend adds to a short request. Per worker it
keeps a pool of idle keep-alive connections (each with its own parser, reused), sends the
caller's body bytes unchanged and returns the worker's bytes unchanged; per exchange it
allocates one future and the answer.

Failures are typed: a connection that cannot be opened or breaks, or a worker that dies
mid-answer, is ``WorkerFailed`` (502) whose ``details["before_answer"]`` says whether any byte
of an answer had arrived (True: refused, reset or closed before answering, so the request may
be sent to another replica); a deadline that runs out is ``DeadlineExceeded`` (504); neither
hangs. A connection whose exchange did not finish cleanly (cancelled, timed out, broken, bytes
beyond the answer) is closed, never reused; chunked answers are read through their trailers.
When this process is out of descriptors (EMFILE) a new connection waits for one of the worker's
connections in use to come back instead of failing, so a shortage of ours is not counted
against the worker.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httptools

from vllm_sr import wire
from vllm_sr.endpoint import Endpoint, InvalidEndpoint, parse_endpoint
from vllm_sr.errors import DeadlineExceeded, WorkerFailed

# Cap on what a worker may send back; a larger answer is a broken worker, not a big result.
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
MAX_HEADER_BYTES = 64 * 1024
# What the frontend's answer contract passes on to callers from a worker's answer (docs/serve.md):
# the worker's timing split, and a 429's or 503's advice on when to try again.
PASSED_HEADERS = (b"server-timing", b"retry-after")
FORWARD_HEADER = (
    wire.FORWARD_HEADER.lower().encode()
)  # the worker's "1"/"0": did a forward produce the answer
CA_FILE_ENV = "VLLM_SR_ENDPOINT_CA_FILE"  # a CA bundle for https:// endpoints (PEM)


@dataclass(frozen=True)
class WorkerResponse:
    status: int
    body: bytes
    content_type: str
    headers: dict[str, str]
    # Whether a forward produced the answer (``X-Vsr-Forward``); None when the worker does
    # not say (an attached runtime that is not ours).
    forward: bool | None = None

    def json(self) -> Any:
        return json.loads(self.body)


# A connect that fails for want of our own resources says nothing of the worker.
LOCAL_SHORTAGE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class _Broken(Exception):
    """The exchange on one connection ended without a whole answer."""

    def __init__(self, reason: str, *, before_answer: bool, local: bool = False) -> None:
        super().__init__(reason)
        self.before_answer = before_answer
        self.local = local  # this process is out of descriptors (or memory) to connect with


class _Conn(asyncio.Protocol):
    """One connection: the transport, its parser, and the state of the exchange in flight."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[WorkerResponse] | None = None
        self.closed = False
        self.keep = False
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

    def begin(self, data: bytes) -> asyncio.Future[WorkerResponse]:
        assert self.transport is not None
        self._reset()
        self.keep = False
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self.waiter

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (asyncio's, or uvloop's, which does not subclass asyncio's).
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():  # bytes nobody asked for: the stream is corrupt
            self.keep = False
            self.abort()
            return
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail("the worker switched protocols", before_answer=False)
        except httptools.HttpParserError as exc:
            self._fail(f"not an HTTP/1.x answer: {exc}", before_answer=False)
        else:
            if not self.head_done:
                self.head_bytes += len(data)  # the head is unfinished: all of it is head
                if self.head_bytes > MAX_HEADER_BYTES:
                    self._fail(f"answer head over {MAX_HEADER_BYTES} bytes", before_answer=False)

    def eof_received(self) -> bool | None:
        self._lost("the worker closed the connection")
        return None  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._lost(f"connection lost: {exc}" if exc else "the worker closed the connection")

    def _lost(self, reason: str) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if self.head_done and self.until_eof:  # a body delimited by the end of the stream
            self.keep = False
            waiter.set_result(self._answer())
            return
        self._fail(reason, before_answer=not self.got_bytes)

    def _fail(self, reason: str, *, before_answer: bool) -> None:
        self.keep = False
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(_Broken(reason, before_answer=before_answer))
        self.abort()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # httptools callbacks
    def on_message_begin(self) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():  # a second answer to one request
            self._fail("bytes after the answer", before_answer=False)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head_done:
            return  # a trailer (after a chunked body): nothing of it is passed on
        self.header_bytes += len(name) + len(value)
        key = name.lower()
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

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > MAX_RESPONSE_BYTES:
            self._fail(f"answer over {MAX_RESPONSE_BYTES} bytes", before_answer=False)
        else:
            self.parts.append(body)

    def on_message_complete(self) -> None:
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


def _ssl_context(ca_file: str | None, value: str) -> ssl.SSLContext:
    """Verification on, against the system store or ``ca_file`` (a PEM bundle)."""
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidEndpoint(value, f"CA file {ca_file!r} cannot be loaded ({exc})") from exc


class WorkerClient:
    """HTTP to one worker: ``uds`` (a socket path) or ``base_url`` (``http://HOST[:PORT]`` or
    ``https://...``, optional ``/PREFIX``); ``from_endpoint`` takes any endpoint form."""

    def __init__(
        self,
        *,
        uds: str | None = None,
        base_url: str | None = None,
        replica_id: str = "",
        max_idle: int = 64,
        ca_file: str | None = None,
    ) -> None:
        if (uds is None) == (base_url is None):
            raise ValueError("WorkerClient needs exactly one of uds= or base_url=")
        self.uds = uds
        self.replica_id = replica_id
        self._endpoint: Endpoint | None = None
        self._ssl: ssl.SSLContext | None = None
        prefix, netloc = "", "worker"
        if base_url is not None:
            ep = parse_endpoint(base_url)
            if ep.scheme == "unix":
                raise InvalidEndpoint(base_url, "base_url takes http:// or https://")
            self._endpoint, prefix, netloc = ep, ep.prefix, ep.netloc
            if ep.tls:
                self._ssl = _ssl_context(ca_file, base_url)
        self._prefix = prefix
        self._max_idle = max_idle
        self._idle: list[_Conn] = []
        self._busy = 0  # connections carrying an exchange now
        self._freed: asyncio.Event | None = None  # made while someone waits for a connection
        self._host_header = f"Host: {netloc}\r\n".encode()

    @classmethod
    def from_endpoint(
        cls,
        url: str,
        replica_id: str,
        *,
        ca_file: str | None = None,
        env: Mapping[str, str] = os.environ,
        max_idle: int = 64,
    ) -> WorkerClient:
        """A client for an attached runtime's endpoint (see ``vllm_sr.endpoint``). For
        ``https://`` the certificate is verified against ``ca_file``, else the file named by
        ``VLLM_SR_ENDPOINT_CA_FILE``, else the system store. Raises ``InvalidEndpoint``."""
        ep = parse_endpoint(url)
        if ep.scheme == "unix":
            return cls(uds=ep.path, replica_id=replica_id, max_idle=max_idle)
        ca = ca_file if ca_file is not None else (env.get(CA_FILE_ENV) or None)
        return cls(base_url=url, replica_id=replica_id, max_idle=max_idle, ca_file=ca)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            if conn.transport is not None:
                conn.transport.close()

    async def _open(self) -> _Conn:
        """A new connection; any failure is a ``_Broken`` before the answer."""
        loop = asyncio.get_running_loop()
        try:
            if self.uds is not None:
                _, conn = await loop.create_unix_connection(_Conn, self.uds)
            else:
                ep = self._endpoint
                assert ep is not None
                server_hostname = ep.host if self._ssl is not None else None
                _, conn = await loop.create_connection(
                    _Conn, ep.host, ep.port, ssl=self._ssl, server_hostname=server_hostname
                )
        except OSError as exc:  # refused, no such socket, DNS, TLS handshake or certificate
            reason = f"cannot connect: {type(exc).__name__}: {exc}"
            local = exc.errno in LOCAL_SHORTAGE
            raise _Broken(reason, before_answer=True, local=local) from exc
        return conn

    async def _open_or_wait(self) -> _Conn | None:
        """A new connection; or, when this process is out of descriptors (EMFILE: the file
        limit, a flood) while exchanges with this worker are under way on other connections,
        None once one of those is back in the idle pool (within the request's deadline), so
        that a shortage of ours is not taken for a broken worker."""
        try:
            return await self._open()
        except _Broken as exc:
            if not exc.local or self._busy == 0:
                raise
        if self._freed is None:
            self._freed = asyncio.Event()
        await self._freed.wait()
        return None

    def _head(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str] | None
    ) -> bytes:
        lines = [f"{method} {self._prefix}{path} HTTP/1.1\r\n".encode(), self._host_header]
        if body is not None:
            lines.append(b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body))
        for key, value in (headers or {}).items():
            lines.append(f"{key}: {value}\r\n".encode())
        lines.append(b"\r\n")
        return b"".join(lines)

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        timeout_s: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> WorkerResponse:
        """One exchange. Raises ``DeadlineExceeded`` past ``timeout_s`` and ``WorkerFailed``
        (``details["before_answer"]``) when the worker cannot be reached or breaks the
        connection; any HTTP status is returned. Not for HEAD (its answer has no body)."""
        data = self._head(method, path, body, headers) + (body or b"")
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    while self._idle:
                        conn = self._idle.pop()
                        if conn.closed or conn.transport is None or conn.transport.is_closing():
                            continue
                        try:
                            return await self._exchange(conn, data)
                        except _Broken as exc:
                            if exc.before_answer:
                                continue  # closed while idle: take another (or a new one)
                            raise
                    fresh = await self._open_or_wait()
                    if fresh is not None:
                        return await self._exchange(fresh, data)
        except TimeoutError as exc:
            raise DeadlineExceeded(
                f"worker {self.replica_id} did not answer within {timeout_s:.3f} s",
                replica=self.replica_id,
            ) from exc
        except _Broken as exc:
            raise WorkerFailed(
                f"worker {self.replica_id} failed: {exc}",
                replica=self.replica_id,
                before_answer=exc.before_answer,
            ) from exc

    async def _exchange(self, conn: _Conn, data: bytes) -> WorkerResponse:
        done = False
        self._busy += 1
        try:
            resp = await conn.begin(data)
            done = True
            return resp
        finally:
            self._busy -= 1
            conn.waiter = None
            # Reuse only a connection whose exchange finished cleanly; a cancelled or failed
            # one may still carry half an answer.
            if done and conn.keep and not conn.closed and len(self._idle) < self._max_idle:
                self._idle.append(conn)
            elif done:
                conn.closed = True
                if conn.transport is not None:
                    conn.transport.close()
            else:
                conn.abort()
            if self._freed is not None:  # someone waits for a connection (or a descriptor)
                self._freed.set()
                self._freed = None

    async def post(
        self,
        path: str,
        body: bytes,
        *,
        timeout_s: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> WorkerResponse:
        return await self.request("POST", path, body, timeout_s=timeout_s, headers=headers)

    async def health(self, timeout_s: float = 2.0) -> tuple[int, dict[str, Any]]:
        """``GET /health`` -> (status, body). Raises like ``request``."""
        resp = await self.request("GET", "/health", timeout_s=timeout_s)
        try:
            doc = resp.json()
        except ValueError:
            doc = {}
        return resp.status, doc if isinstance(doc, dict) else {}

    async def set_faults(self, forward_delay_ms: int, timeout_s: float = 5.0) -> WorkerResponse:
        """``POST /debug/faults`` (answered only under VLLM_SR_ENABLE_FAULTS=1)."""
        body = json.dumps({"forward_delay_ms": forward_delay_ms}).encode()
        return await self.post("/debug/faults", body, timeout_s=timeout_s)
