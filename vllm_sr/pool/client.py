"""WorkerClient: the frontend's and the supervisor's HTTP client for one worker, over its Unix
socket (managed workers) or TCP (attached runtimes).

One aiohttp session per worker keeps connections alive between requests, so a forwarded request
costs one write and one read on an open socket. Request bodies go through as the caller's bytes
(no JSON re-encoding) and responses come back as bytes. Failures are typed: a connection that
breaks or a worker that dies mid-request is ``WorkerFailed`` (502), a deadline that runs out is
``DeadlineExceeded`` (504); neither hangs.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from vllm_sr.errors import DeadlineExceeded, WorkerFailed

# Cap on what a worker may send back; a larger answer is a broken worker, not a big result.
MAX_RESPONSE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class WorkerResponse:
    status: int
    body: bytes
    content_type: str
    headers: dict[str, str]

    def json(self) -> Any:
        return json.loads(self.body)


class WorkerClient:
    """HTTP to one worker. ``uds`` (a socket path) or ``base_url`` (``http://host:port``)."""

    def __init__(
        self,
        *,
        uds: str | None = None,
        base_url: str | None = None,
        replica_id: str = "",
        max_connections: int = 64,
    ) -> None:
        if (uds is None) == (base_url is None):
            raise ValueError("WorkerClient needs exactly one of uds= or base_url=")
        self.uds = uds
        self.base_url = (base_url or "http://worker").rstrip("/")
        self.replica_id = replica_id
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector: aiohttp.BaseConnector
            if self.uds is not None:
                connector = aiohttp.UnixConnector(
                    path=self.uds, limit=self._max_connections, keepalive_timeout=60
                )
            else:
                connector = aiohttp.TCPConnector(limit=self._max_connections, keepalive_timeout=60)
            # No session-wide timeout: every call states its own deadline.
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None),
                skip_auto_headers=("User-Agent",),
                auto_decompress=False,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

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
        session = self._ensure_session()
        hdrs = {"Content-Type": "application/json"} if body is not None else {}
        if headers:
            hdrs.update(headers)
        try:
            async with asyncio.timeout(timeout_s):
                async with session.request(
                    method, self.base_url + path, data=body, headers=hdrs
                ) as resp:
                    data = await resp.content.read(MAX_RESPONSE_BYTES + 1)
                    if len(data) > MAX_RESPONSE_BYTES:
                        raise WorkerFailed(
                            f"worker {self.replica_id} sent more than {MAX_RESPONSE_BYTES} bytes",
                            replica=self.replica_id,
                        )
                    return WorkerResponse(
                        resp.status,
                        data,
                        resp.headers.get("Content-Type", "application/json"),
                        {k: v for k, v in resp.headers.items() if k == "Server-Timing"},
                    )
        except TimeoutError as exc:
            raise DeadlineExceeded(
                f"worker {self.replica_id} did not answer within {timeout_s:.3f} s",
                replica=self.replica_id,
            ) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise WorkerFailed(
                f"worker {self.replica_id} failed: {type(exc).__name__}: {exc}",
                replica=self.replica_id,
            ) from exc

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
