"""Clients of the control API, one interface with a blocking side (``ControlClient``, for the
CLI) and an async side (``AsyncControlClient``, for the dashboard), both httpx over the Unix
socket. ``_Calls`` builds every request once (path, body); each side only sends it. Both raise
``vllm_sr.errors`` types: ``ServiceNotRunning`` when nothing listens on the socket,
``Forbidden`` when the socket or the request is refused, ``DeadlineExceeded`` on a timeout, and
the server's own error (by its code) otherwise."""

from __future__ import annotations

import errno
import json
from collections.abc import AsyncIterator, Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import quote, urlencode

import httpx

from vllm_sr import errors
from vllm_sr.control.protocol import HEARTBEAT
from vllm_sr.errors import (
    EXIT_FAILURE,
    ConfigError,
    DeadlineExceeded,
    Forbidden,
    ServiceNotRunning,
    VllmSrError,
)

DEFAULT_TIMEOUT_S = 30.0
# A mutation answers once applied: a scale or reload waits for new workers to get ready, which
# the service allows up to its ready_timeout_s (600 s by default).
COMMAND_TIMEOUT_S = 900.0
# A stream sends a heartbeat every few seconds; this much silence means the service is gone.
STREAM_IDLE_TIMEOUT_S = 30.0
# Pooled connections (async side) are dropped well before the server's idle timeout (15 s)
# would close them, so a request never goes out on a connection the server is closing.
KEEPALIVE_S = 5.0


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
    details = _safe_details(body)
    problems = details.get("problems") if details else None
    exc: VllmSrError
    try:
        if issubclass(cls, ConfigError) and isinstance(problems, list):
            exc = cls(message, [str(p) for p in problems])
        else:
            exc = cls(message)
    except TypeError:
        exc = VllmSrError(message)
    if details:
        exc.details = details
    # The service refused or failed the request: for the CLI that is exit 1 whatever the
    # error's code means in the service (78 there is "restarting cannot help").
    exc.exit_code = EXIT_FAILURE
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


@dataclass(frozen=True)
class Call:
    """One request of the control API: method, path (with its query), JSON body and any
    headers."""

    method: str
    target: str
    body: dict[str, Any] | None = None
    headers: dict[str, str] | None = None


def _replica_call(replica: str, action: str, body: dict[str, Any] | None = None) -> Call:
    return Call("POST", f"/v1/replicas/{quote(replica, safe='')}/{action}", body or {})


def _events_target(since: int | None, stream: bool) -> str:
    base = "/v1/events/stream" if stream else "/v1/events"
    return base if since is None else f"{base}?since={int(since)}"


R = TypeVar("R")


class _Calls(Generic[R]):
    """Every call of the control API, built once; ``_send`` is the side's way to make it
    (a dict for the blocking client, an awaitable of one for the async client)."""

    def _send(self, call: Call) -> R:
        raise NotImplementedError

    def request(self, method: str, target: str, body: Any = None) -> R:
        return self._send(Call(method, target, body))

    def inventory(self) -> R:
        return self._send(Call("GET", "/v1/inventory"))

    def health(self) -> R:
        return self._send(Call("GET", "/v1/health"))

    def config(self) -> R:
        return self._send(Call("GET", "/v1/config"))

    def replay(
        self,
        decision: str | None = None,
        since: int | None = None,
        recipe: str | None = None,
        session: str | None = None,
    ) -> R:
        pairs = (
            ("decision", decision),
            ("recipe", recipe),
            ("session_id", session),
            ("since", since),
        )
        query = {k: str(v) for k, v in pairs if v is not None}
        return self._send(Call("GET", "/v1/replay" + (f"?{urlencode(query)}" if query else "")))

    def events(self, since: int | None = None) -> R:
        return self._send(Call("GET", _events_target(since, stream=False)))

    def drain(self, replica: str) -> R:
        return self._send(_replica_call(replica, "drain"))

    def eject(self, replica: str, duration_ms: int | None = None) -> R:
        body = {} if duration_ms is None else {"duration_ms": int(duration_ms)}
        return self._send(_replica_call(replica, "eject", body))

    def readmit(self, replica: str) -> R:
        return self._send(_replica_call(replica, "readmit"))

    def restart(self, replica: str) -> R:
        return self._send(_replica_call(replica, "restart"))

    def scale(self, deployment: str, replicas: int) -> R:
        target = f"/v1/deployments/{quote(deployment, safe='')}/scale"
        return self._send(Call("POST", target, {"replicas": int(replicas)}))

    def reload(self) -> R:
        return self._send(Call("POST", "/v1/reload", {}))

    def outcome(
        self,
        replay_id: str,
        verdict: str,
        idempotency_key: str,
        *,
        target: str = "model",
        target_ref: str | None = None,
        reason: str | None = None,
        score: float | None = None,
        metadata: dict[str, str] | None = None,
    ) -> R:
        """Router Learning's outcome verdict on the chat recorded as ``replay_id``."""
        body: dict[str, Any] = {"replay_id": replay_id, "target": target, "verdict": verdict}
        extra = (("target_ref", target_ref), ("reason", reason), ("score", score))
        body.update((k, v) for k, v in extra if v is not None)
        if metadata:
            body["metadata"] = dict(metadata)
        headers = {"Idempotency-Key": idempotency_key}
        return self._send(Call("POST", "/v1/router/outcomes", body, headers))


class _Side:
    """What both sides share: the socket, the timeouts, and turning answers and transport
    failures into typed errors."""

    def __init__(self, path: str | Path, timeout_s: float, command_timeout_s: float) -> None:
        self.path = Path(path)
        self.timeout_s = timeout_s
        self.command_timeout_s = command_timeout_s

    def _timeout(self, call: Call) -> httpx.Timeout:
        return httpx.Timeout(self.timeout_s if call.method == "GET" else self.command_timeout_s)

    def _stream_timeout(self, idle_timeout_s: float) -> httpx.Timeout:
        return httpx.Timeout(self.timeout_s, read=idle_timeout_s)

    @staticmethod
    def _kwargs(call: Call) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"json": call.body} if call.body is not None else {}
        if call.headers:
            kwargs["headers"] = call.headers
        return kwargs

    @staticmethod
    def _retryable(call: Call, exc: httpx.HTTPError, attempt: int) -> bool:
        # A read may go again on a fresh connection if a pooled one was closed under it;
        # a mutation is never sent twice.
        return call.method == "GET" and attempt == 0 and isinstance(exc, httpx.RemoteProtocolError)

    def _answer(self, response: httpx.Response) -> dict[str, Any]:
        if response.status_code >= 300:
            raise error_from_response(response.status_code, response.content)
        result: dict[str, Any] = json.loads(response.content)
        return result

    def _failure(self, exc: httpx.HTTPError, idle_timeout_s: float | None = None) -> VllmSrError:
        if isinstance(exc, httpx.ConnectError):
            cause = _os_error(exc)
            if cause is not None:
                return connect_error(self.path, cause)
            return ServiceNotRunning(f"vllm-sr is not running: nothing is serving on {self.path}")
        if isinstance(exc, httpx.ReadTimeout) and idle_timeout_s is not None:
            return DeadlineExceeded(
                f"no event or heartbeat from {self.path} for {idle_timeout_s:g} s"
            )
        if isinstance(exc, httpx.TimeoutException):
            return DeadlineExceeded(f"vllm-sr on {self.path} did not answer in time")
        return ServiceNotRunning(f"vllm-sr on {self.path} closed the connection ({exc})")


def _os_error(exc: BaseException) -> OSError | None:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _event(line: str, heartbeats: bool) -> dict[str, Any] | None:
    if not line.strip():
        return None
    event: dict[str, Any] = json.loads(line)
    return event if heartbeats or event.get("event") != HEARTBEAT else None


class ControlClient(_Side, _Calls[dict[str, Any]]):
    """Blocking client; a connection per call (the CLI makes a handful). ``close()`` or
    ``with`` releases it."""

    def __init__(
        self,
        path: str | Path,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        command_timeout_s: float = COMMAND_TIMEOUT_S,
    ) -> None:
        super().__init__(path, timeout_s, command_timeout_s)
        self._client: httpx.Client | None = None

    def _http(self) -> httpx.Client:
        if self._client is None:
            # Plain HTTP over a Unix socket: never TLS, so no certificate store to load.
            transport = httpx.HTTPTransport(
                uds=str(self.path), verify=False, limits=httpx.Limits(max_keepalive_connections=0)
            )
            self._client = httpx.Client(transport=transport, base_url="http://localhost")
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, call: Call) -> dict[str, Any]:
        for attempt in range(2):
            try:
                response = self._http().request(
                    call.method, call.target, timeout=self._timeout(call), **self._kwargs(call)
                )
                return self._answer(response)
            except httpx.HTTPError as exc:
                if not self._retryable(call, exc, attempt):
                    raise self._failure(exc) from exc
        raise AssertionError("unreachable")

    def stream_events(
        self,
        since: int | None = None,
        *,
        heartbeats: bool = False,
        idle_timeout_s: float = STREAM_IDLE_TIMEOUT_S,
    ) -> Iterator[dict[str, Any]]:
        """Events as they happen (after replaying those past ``since``); ends when the
        service closes the stream, after yielding its closing line (``stream_closed`` or
        ``stream_dropped``)."""
        target = _events_target(since, stream=True)
        timeout = self._stream_timeout(idle_timeout_s)
        try:
            with self._http().stream("GET", target, timeout=timeout) as response:
                if response.status_code >= 300:
                    raise error_from_response(response.status_code, response.read())
                for line in response.iter_lines():
                    event = _event(line, heartbeats)
                    if event is not None:
                        yield event
        except httpx.HTTPError as exc:
            raise self._failure(exc, idle_timeout_s) from exc


class AsyncControlClient(_Side, _Calls[Awaitable[dict[str, Any]]]):
    """Async client with pooled connections; use ``async with`` or call ``close()``."""

    def __init__(
        self,
        path: str | Path,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        command_timeout_s: float = COMMAND_TIMEOUT_S,
        limit: int = 16,
    ) -> None:
        super().__init__(path, timeout_s, command_timeout_s)
        self._limit = limit
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            limits = httpx.Limits(max_connections=self._limit, keepalive_expiry=KEEPALIVE_S)
            transport = httpx.AsyncHTTPTransport(uds=str(self.path), verify=False, limits=limits)
            self._client = httpx.AsyncClient(transport=transport, base_url="http://localhost")
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def __aenter__(self) -> AsyncControlClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _send(self, call: Call) -> Awaitable[dict[str, Any]]:
        return self._exchange(call)

    async def _exchange(self, call: Call) -> dict[str, Any]:
        for attempt in range(2):
            try:
                response = await self._http().request(
                    call.method, call.target, timeout=self._timeout(call), **self._kwargs(call)
                )
                return self._answer(response)
            except httpx.HTTPError as exc:
                if not self._retryable(call, exc, attempt):
                    raise self._failure(exc) from exc
        raise AssertionError("unreachable")

    async def stream_events(
        self,
        since: int | None = None,
        *,
        heartbeats: bool = False,
        idle_timeout_s: float = STREAM_IDLE_TIMEOUT_S,
    ) -> AsyncIterator[dict[str, Any]]:
        """Events as they happen (after replaying those past ``since``); ends when the
        service closes the stream, after yielding its closing line."""
        target = _events_target(since, stream=True)
        timeout = self._stream_timeout(idle_timeout_s)
        try:
            async with self._http().stream("GET", target, timeout=timeout) as response:
                if response.status_code >= 300:
                    raise error_from_response(response.status_code, await response.aread())
                async for line in response.aiter_lines():
                    event = _event(line, heartbeats)
                    if event is not None:
                        yield event
        except httpx.HTTPError as exc:
            raise self._failure(exc, idle_timeout_s) from exc
