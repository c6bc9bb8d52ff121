"""Clients of the control API: ``ControlClient`` (blocking, for the CLI) and
``AsyncControlClient`` (aiohttp, for the dashboard). Both raise ``vllm_sr.errors`` types:
``ServiceNotRunning`` when nothing listens on the socket, ``Forbidden`` when the socket or the
request is refused, and the server's own error (by its code) otherwise."""

from __future__ import annotations

import errno
import http.client
import json
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from vllm_sr import errors
from vllm_sr.control.protocol import HEARTBEAT
from vllm_sr.errors import DeadlineExceeded, Forbidden, ServiceNotRunning, VllmSrError

DEFAULT_TIMEOUT_S = 30.0
# A mutation answers once applied: a scale or reload waits for new workers to get ready, which
# the service allows up to its ready_timeout_s (600 s by default).
COMMAND_TIMEOUT_S = 900.0
# A stream sends a heartbeat every few seconds; this much silence means the service is gone.
STREAM_IDLE_TIMEOUT_S = 30.0


def _error_classes() -> dict[str, type[VllmSrError]]:
    found: dict[str, type[VllmSrError]] = {}
    todo: list[type[VllmSrError]] = [VllmSrError]
    while todo:
        cls = todo.pop()
        found.setdefault(cls.code, cls)
        todo.extend(cls.__subclasses__())
    return found


def error_from_response(status: int, body: bytes) -> VllmSrError:
    """The typed error for a non-2xx answer (by the body's code, else by the status)."""
    try:
        info = json.loads(body)["error"]
        code, message = str(info["code"]), str(info["message"])
    except (ValueError, KeyError, TypeError):
        code, message = "", body.decode("utf-8", errors="replace").strip() or f"HTTP {status}"
    cls = _error_classes().get(code) or _BY_STATUS.get(status, VllmSrError)
    try:
        exc = cls(message)
    except TypeError:
        exc = VllmSrError(message)
    details = _safe_details(body)
    if details:
        exc.details = details
    return exc


def _safe_details(body: bytes) -> dict[str, Any] | None:
    try:
        details = json.loads(body)["error"].get("details")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return details if isinstance(details, dict) else None


_BY_STATUS: dict[int, type[VllmSrError]] = {
    400: errors.InvalidRequest,
    403: errors.Forbidden,
    404: errors.NotFound,
    408: errors.DeadlineExceeded,
    409: errors.Conflict,
    413: errors.RequestTooLarge,
    503: errors.Unavailable,
    504: errors.DeadlineExceeded,
}


def connect_error(path: Path, exc: OSError) -> VllmSrError:
    """Why connecting to the socket failed, as the error the CLI turns into an exit code."""
    if exc.errno in (errno.ENOENT, errno.ECONNREFUSED, errno.ENOTDIR):
        return ServiceNotRunning(
            f"vllm-sr is not running: nothing is serving on {path} ({exc.strerror})"
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return Forbidden(
            f"cannot connect to {path}: permission denied "
            "(join the socket's group, vllm-sr by default, or use sudo)"
        )
    return ServiceNotRunning(f"cannot reach vllm-sr on {path}: {exc}")


def _replica_path(replica: str, action: str) -> str:
    return f"/v1/replicas/{quote(replica, safe='')}/{action}"


def _scale_path(deployment: str) -> str:
    return f"/v1/deployments/{quote(deployment, safe='')}/scale"


def _events_path(since: int | None, stream: bool) -> str:
    base = "/v1/events/stream" if stream else "/v1/events"
    return base if since is None else f"{base}?since={int(since)}"


def _eject_body(duration_ms: int | None) -> dict[str, Any]:
    return {} if duration_ms is None else {"duration_ms": int(duration_ms)}


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self._path))
        except OSError:
            sock.close()
            raise
        self.sock = sock


class ControlClient:
    """Blocking client; one connection per call (the CLI makes a handful)."""

    def __init__(
        self,
        path: str | Path,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        command_timeout_s: float = COMMAND_TIMEOUT_S,
    ) -> None:
        self.path = Path(path)
        self.timeout_s = timeout_s
        self.command_timeout_s = command_timeout_s

    def _open(self, method: str, target: str, body: Any, timeout: float | None) -> Any:
        conn = _UnixHTTPConnection(self.path, timeout)
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        try:
            conn.request(method, target, body=data, headers=headers)
            resp = conn.getresponse()
        except TimeoutError:
            conn.close()
            raise DeadlineExceeded(f"vllm-sr on {self.path} did not answer in time") from None
        except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected) as exc:
            conn.close()
            raise ServiceNotRunning(f"vllm-sr on {self.path} closed the connection") from exc
        except OSError as exc:
            conn.close()
            raise connect_error(self.path, exc) from exc
        if resp.status >= 300:
            payload = resp.read()
            conn.close()
            raise error_from_response(resp.status, payload)
        return conn, resp

    def request(self, method: str, target: str, body: Any = None) -> dict[str, Any]:
        timeout = self.timeout_s if method == "GET" else self.command_timeout_s
        conn, resp = self._open(method, target, body, timeout)
        try:
            result: dict[str, Any] = json.loads(resp.read())
            return result
        finally:
            conn.close()

    def inventory(self) -> dict[str, Any]:
        return self.request("GET", "/v1/inventory")

    def health(self) -> dict[str, Any]:
        return self.request("GET", "/v1/health")

    def config(self) -> dict[str, Any]:
        return self.request("GET", "/v1/config")

    def events(self, since: int | None = None) -> dict[str, Any]:
        return self.request("GET", _events_path(since, stream=False))

    def stream_events(
        self,
        since: int | None = None,
        *,
        heartbeats: bool = False,
        idle_timeout_s: float = STREAM_IDLE_TIMEOUT_S,
    ) -> Iterator[dict[str, Any]]:
        """Events as they happen (after replaying those past ``since``); ends when the
        service closes the stream, after yielding its closing line."""
        conn, resp = self._open("GET", _events_path(since, stream=True), None, idle_timeout_s)
        try:
            while True:
                try:
                    line = resp.readline()
                except TimeoutError:
                    raise DeadlineExceeded(
                        f"no event or heartbeat from {self.path} for {idle_timeout_s:g} s"
                    ) from None
                if not line:
                    return
                event = json.loads(line)
                if heartbeats or event.get("event") != HEARTBEAT:
                    yield event
        finally:
            conn.close()

    def drain(self, replica: str) -> dict[str, Any]:
        return self.request("POST", _replica_path(replica, "drain"), {})

    def eject(self, replica: str, duration_ms: int | None = None) -> dict[str, Any]:
        return self.request("POST", _replica_path(replica, "eject"), _eject_body(duration_ms))

    def readmit(self, replica: str) -> dict[str, Any]:
        return self.request("POST", _replica_path(replica, "readmit"), {})

    def restart(self, replica: str) -> dict[str, Any]:
        return self.request("POST", _replica_path(replica, "restart"), {})

    def scale(self, deployment: str, replicas: int) -> dict[str, Any]:
        return self.request("POST", _scale_path(deployment), {"replicas": int(replicas)})

    def reload(self) -> dict[str, Any]:
        return self.request("POST", "/v1/reload", {})


class AsyncControlClient:
    """aiohttp client over the Unix socket; use ``async with`` or call ``close()``."""

    def __init__(
        self,
        path: str | Path,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        command_timeout_s: float = COMMAND_TIMEOUT_S,
        limit: int = 16,
    ) -> None:
        self.path = Path(path)
        self.timeout_s = timeout_s
        self.command_timeout_s = command_timeout_s
        self._limit = limit
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # Close idle connections well before the server's idle timeout (15 s) would, so a
            # request never goes out on a connection the server is closing.
            connector = aiohttp.UnixConnector(
                path=str(self.path), limit=self._limit, keepalive_timeout=5.0
            )
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> AsyncControlClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _translate(self, exc: BaseException) -> VllmSrError:
        if isinstance(exc, aiohttp.ClientConnectorError):
            return connect_error(self.path, exc.os_error)
        if isinstance(exc, TimeoutError):
            return DeadlineExceeded(f"vllm-sr on {self.path} did not answer in time")
        return ServiceNotRunning(f"vllm-sr on {self.path} closed the connection ({exc})")

    async def request(self, method: str, target: str, body: Any = None) -> dict[str, Any]:
        total = self.timeout_s if method == "GET" else self.command_timeout_s
        timeout = aiohttp.ClientTimeout(total=total)
        # A read may go again on a fresh connection if a pooled one was closed under it;
        # a mutation never is sent twice.
        attempts = 2 if method == "GET" else 1
        for attempt in range(attempts):
            try:
                async with self._get_session().request(
                    method, f"http://localhost{target}", json=body, timeout=timeout
                ) as resp:
                    status, payload = resp.status, await resp.read()
                break
            except aiohttp.ServerDisconnectedError as exc:
                if attempt + 1 == attempts:
                    raise self._translate(exc) from exc
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise self._translate(exc) from exc
        if status >= 300:
            raise error_from_response(status, payload)
        result: dict[str, Any] = json.loads(payload)
        return result

    async def inventory(self) -> dict[str, Any]:
        return await self.request("GET", "/v1/inventory")

    async def health(self) -> dict[str, Any]:
        return await self.request("GET", "/v1/health")

    async def config(self) -> dict[str, Any]:
        return await self.request("GET", "/v1/config")

    async def events(self, since: int | None = None) -> dict[str, Any]:
        return await self.request("GET", _events_path(since, stream=False))

    async def stream_events(
        self,
        since: int | None = None,
        *,
        heartbeats: bool = False,
        idle_timeout_s: float = STREAM_IDLE_TIMEOUT_S,
    ) -> AsyncIterator[dict[str, Any]]:
        """Events as they happen (after replaying those past ``since``); ends when the
        service closes the stream, after yielding its closing line."""
        session = self._get_session()
        timeout = aiohttp.ClientTimeout(total=None, sock_read=idle_timeout_s)
        url = f"http://localhost{_events_path(since, stream=True)}"
        try:
            async with session.get(url, timeout=timeout) as resp:
                if resp.status >= 300:
                    raise error_from_response(resp.status, await resp.read())
                async for line in resp.content:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if heartbeats or event.get("event") != HEARTBEAT:
                        yield event
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self._translate(exc) from exc

    async def drain(self, replica: str) -> dict[str, Any]:
        return await self.request("POST", _replica_path(replica, "drain"), {})

    async def eject(self, replica: str, duration_ms: int | None = None) -> dict[str, Any]:
        return await self.request("POST", _replica_path(replica, "eject"), _eject_body(duration_ms))

    async def readmit(self, replica: str) -> dict[str, Any]:
        return await self.request("POST", _replica_path(replica, "readmit"), {})

    async def restart(self, replica: str) -> dict[str, Any]:
        return await self.request("POST", _replica_path(replica, "restart"), {})

    async def scale(self, deployment: str, replicas: int) -> dict[str, Any]:
        return await self.request("POST", _scale_path(deployment), {"replicas": int(replicas)})

    async def reload(self) -> dict[str, Any]:
        return await self.request("POST", "/v1/reload", {})
