"""WorkerClient: the frontend's and the supervisor's HTTP/1.1 client for one worker, over its
Unix socket (managed workers) or an attached runtime's endpoint (``http://``, ``https://`` or
``unix:``, see ``vllm_sr.endpoint``).

Answers are parsed by ``httptools`` (llhttp, the parser uvicorn uses) fed straight from an
asyncio protocol (one ``vllm_sr.pool.connection.Connection`` per connection), rather than by a
general client: the frontend forwards every request through
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
import json
import os
import ssl
from collections.abc import Mapping

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

__all__ = [
    "CA_FILE_ENV",
    "MAX_HEADER_BYTES",
    "MAX_RESPONSE_BYTES",
    "WorkerClient",
    "WorkerResponse",
]

CA_FILE_ENV = "VLLM_SR_ENDPOINT_CA_FILE"  # a CA bundle for https:// endpoints (PEM)


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
        self._idle: list[Connection] = []
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
                _, conn = await loop.create_connection(
                    Connection, ep.host, ep.port, ssl=self._ssl, server_hostname=server_hostname
                )
        except OSError as exc:  # refused, no such socket, DNS, TLS handshake or certificate
            reason = f"cannot connect: {type(exc).__name__}: {exc}"
            local = exc.errno in LOCAL_SHORTAGE
            raise Broken(reason, before_answer=True, local=local) from exc
        return conn

    async def _open_or_wait(self) -> Connection | None:
        """A new connection; or, when this process is out of descriptors (EMFILE: the file
        limit, a flood) while exchanges with this worker are under way on other connections,
        None once one of those is back in the idle pool (within the request's deadline), so
        that a shortage of ours is not taken for a broken worker."""
        try:
            return await self._open()
        except Broken as exc:
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
                        except Broken as exc:
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
        except Broken as exc:
            raise WorkerFailed(
                f"worker {self.replica_id} failed: {exc}",
                replica=self.replica_id,
                before_answer=exc.before_answer,
            ) from exc

    async def _exchange(self, conn: Connection, data: bytes) -> WorkerResponse:
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

    async def health(self, timeout_s: float = 2.0) -> tuple[int, JsonObject]:
        """``GET /health`` -> (status, body; {} when the body is not a JSON object). Raises
        like ``request``."""
        resp = await self.request("GET", "/health", timeout_s=timeout_s)
        try:
            doc = resp.json()
        except ValueError:
            doc = {}
        return resp.status, json_object(doc) or {}

    async def set_faults(self, forward_delay_ms: int, timeout_s: float = 5.0) -> WorkerResponse:
        """``POST /debug/faults`` (answered only under VLLM_SR_ENABLE_FAULTS=1)."""
        body = json.dumps({"forward_delay_ms": forward_delay_ms}).encode()
        return await self.post("/debug/faults", body, timeout_s=timeout_s)
