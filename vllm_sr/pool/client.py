"""WorkerClient: this process's one outbound HTTP/1.1 client. The frontend's and the
supervisor's client for one worker, over its Unix socket (managed workers) or an attached
runtime's endpoint (``http://``, ``https://`` or ``unix:``, see ``vllm_sr.endpoint``); and
Router mode's client for the LLM backends on one origin (``vllm_sr.router.backends``).

Answers are parsed by ``httptools`` (llhttp, the parser uvicorn uses) fed straight from an
asyncio protocol (one ``vllm_sr.pool.connection.Connection`` per connection), rather than by a
general client: the frontend forwards every request through it, and the per-request Python
work of a general client (URL objects, cookie jars, tracing hooks, header multidicts, an
anyio layer) is most of what the frontend (or the router) adds to a short request. Per origin
it keeps a pool of idle keep-alive connections (each with its own parser, reused), sends the
caller's body bytes unchanged and returns the server's bytes unchanged; per exchange it
allocates one future and the answer. Redirects are never followed (a 3xx is an answer), and
no environment is read but the CA store's (no proxies, no ``.netrc``).

Two ways to exchange: ``request`` (buffered: the whole answer, up to ``MAX_RESPONSE_BYTES``)
and ``stream`` (status and headers first, then the body as it arrives, ``StreamedAnswer``).

Failures are typed: for ``request``, a connection that cannot be opened or breaks, or a
server that dies mid-answer, is ``WorkerFailed`` (502) whose ``details["before_answer"]`` says
whether any byte of an answer had arrived (True: refused, reset or closed before answering, so
the request may be sent to another replica); a deadline that runs out is ``DeadlineExceeded``
(504); neither hangs. ``stream`` raises the connection's own ``Broken`` (with ``connecting``:
never connected) and ``TimeoutError``. A connection whose exchange did not finish cleanly
(cancelled, timed out, broken, bytes beyond the answer) is closed, never reused; chunked
answers are read through their trailers. When this process is out of descriptors (EMFILE) a
new connection waits for one of the origin's connections in use to come back instead of
failing, so a shortage of ours is not counted against the server.

Limits, all optional (the workers' clients set none of them): ``max_connections`` open at once
(an exchange beyond it waits for one, within its deadline); ``idle_expiry_s`` (an idle
connection older than that is closed rather than reused: under a server's keep-alive, so a
request is not sent on a connection the server is closing); ``connect_timeout_s``;
``read_timeout_s`` (a streamed answer's head, and between two reads of its body) and
``write_timeout_s`` (a request body the server does not take).
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from collections.abc import Mapping
from functools import partial

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.endpoint import Endpoint, InvalidEndpoint, parse_endpoint
from vllm_sr.errors import DeadlineExceeded, WorkerFailed
from vllm_sr.jsontypes import JsonObject, json_object
from vllm_sr.pool.connection import (
    LOCAL_SHORTAGE,
    MAX_HEADER_BYTES,
    MAX_RESPONSE_BYTES,
    Broken,
    Connection,
    WorkerResponse,
)
from vllm_sr.pool.stream import StreamedAnswer, within

__all__ = [
    "CA_FILE_ENV",
    "MAX_HEADER_BYTES",
    "MAX_RESPONSE_BYTES",
    "Broken",
    "StreamedAnswer",
    "WorkerClient",
    "WorkerResponse",
]

CA_FILE_ENV = "VLLM_SR_ENDPOINT_CA_FILE"  # a CA bundle for https:// endpoints (PEM)


def _ssl_context(ca_file: str | None, value: str) -> ssl.SSLContext:
    """Verification on, against the system store (OpenSSL's ``SSL_CERT_FILE`` /
    ``SSL_CERT_DIR`` name another) or ``ca_file`` (a PEM bundle)."""
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidEndpoint(value, f"CA file {ca_file!r} cannot be loaded ({exc})") from exc


class WorkerClient:
    """HTTP to one origin: ``uds`` (a socket path) or ``base_url`` (``http://HOST[:PORT]`` or
    ``https://...``, optional ``/PREFIX`` put before every path); ``from_endpoint`` takes any
    endpoint form. ``ssl_context`` (shared by a caller's clients) replaces ``ca_file``'s."""

    def __init__(
        self,
        *,
        uds: str | None = None,
        base_url: str | None = None,
        replica_id: str = "",
        max_idle: int = 64,
        ca_file: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        max_connections: int | None = None,
        idle_expiry_s: float | None = None,
        connect_timeout_s: float | None = None,
        read_timeout_s: float | None = None,
        write_timeout_s: float | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if (uds is None) == (base_url is None):
            raise ValueError("WorkerClient needs exactly one of uds= or base_url=")
        if max_connections is not None and max_connections < 1:
            raise ValueError(f"max_connections={max_connections}: give 1 or more, or None")
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
                self._ssl = ssl_context or _ssl_context(ca_file, base_url)
        self._prefix = prefix
        self._max_idle = max_idle
        self._max_connections = max_connections
        self._idle_expiry_s = idle_expiry_s
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._write_timeout_s = write_timeout_s
        self._clock = clock
        self._idle: list[Connection] = []  # most recently used last
        self._busy = 0  # connections carrying (or opening for) an exchange now
        self._freed: asyncio.Event | None = None  # made while someone waits for a connection
        self._closed = False
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
        """Closes the idle connections; those in use close when their exchange ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            if conn.transport is not None:
                conn.transport.close()

    # -- connections -----------------------------------------------------------------------------
    async def _open(self) -> Connection:
        """A new connection; any failure is a ``Broken`` before the answer."""
        loop = asyncio.get_running_loop()
        try:
            if self.uds is not None:
                _, conn = await loop.create_unix_connection(Connection, self.uds)
            else:
                ep = self._endpoint
                assert ep is not None
                server_hostname = ep.host if self._ssl is not None else None
                opening = loop.create_connection(
                    Connection, ep.host, ep.port, ssl=self._ssl, server_hostname=server_hostname
                )
                if self._connect_timeout_s is None:
                    _, conn = await opening
                else:
                    async with asyncio.timeout(self._connect_timeout_s):
                        _, conn = await opening
        except OSError as exc:  # refused, no such socket, DNS, TLS, certificate, timed out
            reason = f"cannot connect: {type(exc).__name__}: {exc}"
            if isinstance(exc, TimeoutError):
                reason = f"cannot connect: timed out after {self._connect_timeout_s:g} s"
            local = exc.errno in LOCAL_SHORTAGE
            raise Broken(reason, before_answer=True, local=local, connecting=True) from exc
        return conn

    def _take_idle(self) -> Connection | None:
        """An idle connection still open and not past ``idle_expiry_s`` (counted busy), or
        None. The most recently used first: when it is too old, so are all the others."""
        idle = self._idle
        if not idle:
            return None
        expiry = self._idle_expiry_s
        oldest_ok = -1.0 if expiry is None else self._clock.monotonic() - expiry
        while idle:
            conn = idle.pop()
            transport = conn.transport
            if conn.closed or transport is None or transport.is_closing():
                continue
            if conn.idle_since < oldest_ok:
                for old in (conn, *idle):
                    if old.transport is not None:
                        old.transport.close()
                idle.clear()
                return None
            self._busy += 1
            return conn
        return None

    async def _acquire(self) -> Connection:
        """A new connection for one exchange (counted busy) once no idle one is left (callers
        try ``_take_idle`` first). Beyond ``max_connections`` it waits for one to come back
        (then an idle one may be returned). When this process is out of descriptors (EMFILE:
        the file limit, a flood) while other exchanges with this origin are under way, it
        waits for one of those too, so that a shortage of ours is not taken for a broken
        server."""
        while True:
            conn = self._take_idle()
            if conn is not None:
                return conn
            cap = self._max_connections
            if cap is None or self._busy < cap:
                self._busy += 1
                try:
                    return await self._open()
                except Broken as exc:
                    self._released()
                    if not exc.local or self._busy == 0:
                        raise
                except BaseException:
                    self._released()
                    raise
            if self._freed is None:
                self._freed = asyncio.Event()
            await self._freed.wait()

    def _release(self, conn: Connection, whole: bool) -> None:
        """An exchange on ``conn`` ended (``whole``: with its whole answer): back to the idle
        pool when it may carry another, else closed (cut when the answer was not whole)."""
        if whole and conn.keep and not conn.closed and not self._closed:
            if len(self._idle) < self._max_idle:
                conn.idle_since = self._clock.monotonic() if self._idle_expiry_s else 0.0
                self._idle.append(conn)
            elif conn.transport is not None:
                conn.transport.close()
        elif whole:
            conn.closed = True
            if conn.transport is not None:
                conn.transport.close()
        else:
            conn.sink = None  # nobody reads this answer now
            conn.abort()
        self._released()

    def _released(self) -> None:
        self._busy -= 1
        if self._freed is not None:  # someone waits for a connection (or a descriptor)
            self._freed.set()
            self._freed = None

    def _head(
        self, method: str, path: str, body: bytes | None, headers: Mapping[str, str] | None
    ) -> bytes:
        lines = [f"{method} {self._prefix}{path} HTTP/1.1\r\n".encode(), self._host_header]
        typed = False
        for key, value in (headers or {}).items():
            if "\n" in value or "\r" in value or "\n" in key or "\r" in key:
                raise ValueError(f"header {key!r}: a line break in a header is not accepted")
            typed = typed or key.lower() == "content-type"
            lines.append(f"{key}: {value}\r\n".encode())
        if body is not None:
            if not typed:
                lines.append(b"Content-Type: application/json\r\n")
            lines.append(b"Content-Length: %d\r\n" % len(body))
        lines.append(b"\r\n")
        return b"".join(lines)

    # -- exchanges -------------------------------------------------------------------------------
    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        timeout_s: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> WorkerResponse:
        """One buffered exchange. Raises ``DeadlineExceeded`` past ``timeout_s`` and
        ``WorkerFailed`` (``details["before_answer"]``) when the server cannot be reached or
        breaks the connection; any HTTP status is returned. Not for HEAD (no body)."""
        data = self._head(method, path, body, headers) + (body or b"")
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    conn = self._take_idle()
                    reused = conn is not None
                    if conn is None:
                        conn = await self._acquire()
                    try:
                        return await self._exchange(conn, data)
                    except Broken as exc:
                        if reused and exc.before_answer:
                            continue  # closed while idle: take another (or a new one)
                        raise
        except TimeoutError as exc:
            raise DeadlineExceeded(
                f"worker {self.replica_id} did not answer within {timeout_s:.3f} s",
                replica=self.replica_id,
            ) from exc
        except Broken as exc:
            raise WorkerFailed(
                f"worker {self.replica_id} failed: {exc}",
                replica=self.replica_id,
                before_answer=exc.before_answer,
            ) from exc

    async def _exchange(self, conn: Connection, data: bytes) -> WorkerResponse:
        done = False
        try:
            resp = await conn.begin(data)
            done = True
            return resp
        finally:
            conn.waiter = None
            # Reuse only a connection whose exchange finished cleanly; a cancelled or failed
            # one may still carry half an answer.
            self._release(conn, done)

    async def stream(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> StreamedAnswer:
        """One streamed exchange: returns once the answer's status and headers are in; read
        its body (``async for``, ``read()``) or ``aclose()`` it. Raises ``Broken``
        (``connecting``: no connection could be opened) or ``TimeoutError`` (the body not sent
        within ``write_timeout_s``, no head within ``read_timeout_s``). The caller's own
        deadline is an ``asyncio.timeout`` around this (and the reads)."""
        data = self._head(method, path, body, headers) + (body or b"")
        loop = asyncio.get_running_loop()
        while True:
            conn = self._take_idle()
            reused = conn is not None
            if conn is None:
                conn = await self._acquire()
            answer = StreamedAnswer(loop, partial(self._release, conn), self._read_timeout_s)
            try:
                conn.begin_stream(data, answer)
                if conn.drained is not None:  # the body is not all in the kernel yet
                    what = "did not take the request's body"
                    await within(conn.drained, self._write_timeout_s, what)
                if not answer.head.done():
                    await within(answer.head, self._read_timeout_s, "sent no answer")
                return answer
            except Broken as exc:
                if reused and exc.before_answer:
                    continue  # closed while idle: take another (or a new one)
                raise
            except BaseException:
                await answer.aclose()  # cancelled or timed out: the connection is cut
                raise

    async def post(
        self,
        path: str,
        body: bytes,
        *,
        timeout_s: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> WorkerResponse:
        return await self.request("POST", path, body, timeout_s=timeout_s, headers=headers)

    async def health(self, timeout_s: float = 2.0) -> tuple[int, JsonObject]:
        """``GET /health`` -> (status, body; {} when the body is not a JSON object). Raises
        like ``request``."""
        resp = await self.request("GET", "/health", timeout_s=timeout_s)
        try:
            doc = resp.json()
        except ValueError:
            doc = {}
        return resp.status, json_object(doc) or {}

    async def set_result_cache(self, max_bytes: int, timeout_s: float = 5.0) -> WorkerResponse:
        """``POST /admin/result-cache``: the running worker's result cache bound (0: off)."""
        body = json.dumps({"max_bytes": max_bytes}).encode()
        return await self.post("/admin/result-cache", body, timeout_s=timeout_s)

    async def set_faults(self, forward_delay_ms: int, timeout_s: float = 5.0) -> WorkerResponse:
        """``POST /debug/faults`` (answered only under VLLM_SR_ENABLE_FAULTS=1)."""
        body = json.dumps({"forward_delay_ms": forward_delay_ms}).encode()
        return await self.post("/debug/faults", body, timeout_s=timeout_s)
