"""WorkerClient: the frontend's and the supervisor's HTTP client for one worker, over its Unix
socket (managed workers) or TCP (attached runtimes, ``http://host:port``).

A small HTTP/1.1 client on asyncio streams rather than a general one: the frontend forwards
every request through it, and the per-request Python work of a general client (URL objects,
cookie jars, tracing hooks, header multidicts) is most of what the frontend adds to a short
request. It keeps idle keep-alive connections per worker, sends the caller's body bytes
unchanged and returns the worker's bytes unchanged. Failures are typed: a connection that
breaks or a worker that dies mid-request is ``WorkerFailed`` (502), a deadline that runs out is
``DeadlineExceeded`` (504); neither hangs. A connection whose exchange did not finish cleanly
is closed, never reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from vllm_sr.errors import DeadlineExceeded, WorkerFailed

# Cap on what a worker may send back; a larger answer is a broken worker, not a big result.
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
MAX_HEADER_BYTES = 64 * 1024
PASSED_HEADERS = (b"server-timing",)


@dataclass(frozen=True)
class WorkerResponse:
    status: int
    body: bytes
    content_type: str
    headers: dict[str, str]

    def json(self) -> Any:
        return json.loads(self.body)


class _StaleConnection(Exception):
    """A kept-alive connection was closed by the worker before it answered anything."""


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class WorkerClient:
    """HTTP to one worker. ``uds`` (a socket path) or ``base_url`` (``http://host:port``)."""

    def __init__(
        self,
        *,
        uds: str | None = None,
        base_url: str | None = None,
        replica_id: str = "",
        max_idle: int = 64,
    ) -> None:
        if (uds is None) == (base_url is None):
            raise ValueError("WorkerClient needs exactly one of uds= or base_url=")
        self.uds = uds
        self.replica_id = replica_id
        self._host = "worker"
        self._port = 0
        self._prefix = ""
        if base_url is not None:
            parts = urlsplit(base_url)
            if parts.scheme != "http" or not parts.hostname:
                raise ValueError(f"base_url {base_url!r}: accepted: http://HOST:PORT[/PREFIX]")
            self._host = parts.hostname
            self._port = parts.port or 80
            self._prefix = parts.path.rstrip("/")
        self._max_idle = max_idle
        self._idle: list[Conn] = []
        self._host_header = f"Host: {self._host}\r\n".encode()

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()

    async def _open(self) -> Conn:
        if self.uds is not None:
            return await asyncio.open_unix_connection(self.uds, limit=MAX_HEADER_BYTES)
        return await asyncio.open_connection(self._host, self._port, limit=MAX_HEADER_BYTES)

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
        """One exchange. Raises ``DeadlineExceeded`` past ``timeout_s`` and ``WorkerFailed`` when
        the worker cannot be reached or breaks the connection; any HTTP status is returned."""
        data = self._head(method, path, body, headers) + (body or b"")
        try:
            async with asyncio.timeout(timeout_s):
                while self._idle:
                    conn = self._idle.pop()
                    try:
                        return await self._exchange(conn, data, reused=True)
                    except _StaleConnection:
                        continue  # closed while idle: take another (or a new one)
                return await self._exchange(await self._open(), data, reused=False)
        except TimeoutError as exc:
            raise DeadlineExceeded(
                f"worker {self.replica_id} did not answer within {timeout_s:.3f} s",
                replica=self.replica_id,
            ) from exc
        except (OSError, EOFError, ValueError, asyncio.LimitOverrunError, _StaleConnection) as exc:
            raise WorkerFailed(
                f"worker {self.replica_id} failed: {type(exc).__name__}: {exc}",
                replica=self.replica_id,
            ) from exc

    async def _exchange(self, conn: Conn, data: bytes, *, reused: bool) -> WorkerResponse:
        reader, writer = conn
        done = False
        try:
            writer.write(data)
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                if reused and not exc.partial:
                    raise _StaleConnection() from exc
                raise
            status, ctype, passed, length, chunked, keep = _parse_head(head)
            if chunked:
                body = await _read_chunked(reader)
            elif length is not None:
                if length > MAX_RESPONSE_BYTES:
                    raise ValueError(f"response of {length} bytes is over the cap")
                body = await reader.readexactly(length)
            else:
                body = await reader.read(MAX_RESPONSE_BYTES + 1)
                keep = False
            done = True
            return WorkerResponse(status, body, ctype, passed)
        finally:
            # Reuse only a connection whose exchange finished cleanly; a cancelled or failed
            # one may still carry half an answer.
            if done and keep and len(self._idle) < self._max_idle:
                self._idle.append(conn)
            else:
                writer.close()

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


def _parse_head(head: bytes) -> tuple[int, str, dict[str, str], int | None, bool, bool]:
    """-> (status, content type, passed-through headers, content length, chunked, keep-alive)."""
    lines = head.split(b"\r\n")
    first = lines[0].split(b" ", 2)
    if len(first) < 2 or not first[0].startswith(b"HTTP/1."):
        raise ValueError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    status = int(first[1])
    keep = first[0] == b"HTTP/1.1"
    ctype, length, chunked = "application/json", None, False
    passed: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, _, value = line.partition(b":")
        key = name.strip().lower()
        value = value.strip()
        if key == b"content-length":
            length = int(value)
        elif key == b"content-type":
            ctype = value.decode("latin-1")
        elif key == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif key == b"connection":
            keep = value.lower() == b"keep-alive" or (keep and value.lower() != b"close")
        elif key in PASSED_HEADERS:
            passed[name.strip().decode("latin-1")] = value.decode("latin-1")
    return status, ctype, passed, length, chunked, keep


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            with contextlib.suppress(asyncio.IncompleteReadError):
                await reader.readuntil(b"\r\n")  # the blank line after the last chunk
            return b"".join(parts)
        total += size
        if total > MAX_RESPONSE_BYTES:
            raise ValueError(f"response over {MAX_RESPONSE_BYTES} bytes")
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)
