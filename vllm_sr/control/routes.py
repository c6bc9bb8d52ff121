"""The control API's endpoints. Handlers validate, check the peer, and hand a ``Command`` to the
backend; errors leave as ``{"error": {"code", "message", "retryable"}}`` with the error's status."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from vllm_sr import jsonbody
from vllm_sr.clock import Clock
from vllm_sr.control.auth import AccessPolicy, Peer, read_peer
from vllm_sr.control.commands import Command, CommandKind
from vllm_sr.control.protocol import (
    HEARTBEAT,
    NDJSON,
    STREAM_CLOSED,
    STREAM_DROPPED,
)
from vllm_sr.errors import ConfigError, Forbidden, InvalidRequest, VllmSrError
from vllm_sr.events import EventBus, Subscription

log = logging.getLogger("vllm_sr.control")


class ControlBackend(Protocol):
    """What the server needs from the supervisor (or a fake in tests)."""

    events: EventBus

    def inventory(self) -> dict[str, Any]: ...

    def health(self) -> dict[str, Any]: ...

    def effective_config(self) -> dict[str, Any]: ...

    def replay(self, decision: str | None = None, since: int = 0) -> dict[str, Any]: ...

    async def submit(self, command: Command) -> dict[str, Any]: ...


class ServerView(Protocol):
    """The server as its routes see it (``ControlServer``; no import back up to it)."""

    backend: ControlBackend
    policy: AccessPolicy
    clock: Clock
    closing: bool
    streams: set[EventStream]
    max_body: int
    body_timeout_s: float
    heartbeat_s: float
    write_timeout_s: float
    subscriber_queue: int


SERVER_KEY: web.AppKey[ServerView] = web.AppKey("control_server")
_M = TypeVar("_M", bound=BaseModel)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), default=str)


def _json(body: Any, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=_dumps)


_HTTP_CODES = {
    400: "invalid_request",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "request_too_large",
}


def error_body(exc: VllmSrError) -> dict[str, Any]:
    """The error as JSON. A config error's problems (each naming its file, line and field)
    travel in ``details.problems``: its message alone only counts them, and a refused reload
    must say what is wrong (``systemctl reload`` shows the reload command's stderr)."""
    body = exc.to_json()
    if isinstance(exc, ConfigError) and exc.problems != [exc.message]:
        body["error"].setdefault("details", {})["problems"] = list(exc.problems)
    return body


@web.middleware
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except VllmSrError as exc:
        return _json(error_body(exc), exc.http_status)
    except web.HTTPException as exc:
        if exc.status == 404:
            message = f"no endpoint {request.method} {request.path}; see docs/control-api.md"
        elif exc.status == 405:
            message = f"{request.method} is not accepted on {request.path}"
        elif exc.status == 413:
            server = request.app[SERVER_KEY]
            message = f"request body over the {server.max_body}-byte limit"
        else:
            message = exc.reason
        code = _HTTP_CODES.get(exc.status, "http_error")
        body = {"error": {"code": code, "message": message, "retryable": False}}
        return _json(body, exc.status)
    except Exception:
        log.exception("control API: %s %s failed", request.method, request.path)
        err = VllmSrError(f"internal error serving {request.method} {request.path}; see the log")
        return _json(err.to_json(), 500)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/inventory", _inventory)
    app.router.add_get("/v1/health", _health)
    app.router.add_get("/v1/config", _config)
    app.router.add_get("/v1/events", _events)
    app.router.add_get("/v1/events/stream", _stream)
    app.router.add_get("/v1/replay", _replay)
    for action in ("drain", "eject", "readmit", "restart"):
        app.router.add_post(f"/v1/replicas/{{id}}/{action}", _replica_handler(action))
    app.router.add_post("/v1/deployments/{name}/scale", _scale)
    app.router.add_post("/v1/reload", _reload)


# --- reads -------------------------------------------------------------------------------


async def _inventory(request: web.Request) -> web.Response:
    return _json(request.app[SERVER_KEY].backend.inventory())


async def _health(request: web.Request) -> web.Response:
    body = dict(request.app[SERVER_KEY].backend.health())
    body["caller"] = _caller(request)
    return _json(body)


def _caller(request: web.Request) -> dict[str, object]:
    """Whether this peer may mutate, so a client can disable its actions up front."""
    try:
        peer = _peer(request)
    except InvalidRequest as exc:
        return {"uid": None, "may_mutate": False, "why": exc.message}
    try:
        request.app[SERVER_KEY].policy.check_mutation(peer)
    except Forbidden as exc:
        return {"uid": peer.uid, "may_mutate": False, "why": exc.message}
    return {"uid": peer.uid, "may_mutate": True, "why": None}


async def _config(request: web.Request) -> web.Response:
    return _json(request.app[SERVER_KEY].backend.effective_config())


def _since(request: web.Request) -> int | None:
    raw = request.query.get("since")
    if raw is None:
        return None
    if not raw.isdigit():
        raise InvalidRequest(f"since: expected a whole number >= 0 (an event seq), got {raw!r}")
    return int(raw)


async def _replay(request: web.Request) -> web.Response:
    """router_replay's records: ``?decision=D`` (one decision), ``?since=SEQ`` (after it)."""
    decision = request.query.get("decision") or None
    return _json(request.app[SERVER_KEY].backend.replay(decision, _since(request) or 0))


async def _events(request: web.Request) -> web.Response:
    bus = request.app[SERVER_KEY].backend.events
    events = bus.since(_since(request) or 0)
    ring = bus.since(0)
    return _json(
        {
            "events": [e.to_json() for e in events],
            "last_seq": bus.last_seq,
            # Events older than this have left the ring: a reader that asked for less missed some.
            "oldest_seq": ring[0].seq if ring else None,
        }
    )


class EventStream:
    """One NDJSON subscriber: replays from ``since``, then live events and heartbeats."""

    def __init__(self, server: ServerView, request: web.Request, since: int | None) -> None:
        self.server = server
        self.request = request
        self.since = since
        self.sub: Subscription = server.backend.events.subscribe(server.subscriber_queue)

    def wake(self) -> None:
        """Unblock the reader loop so it sees ``server.closing`` (the queue may be full)."""
        queue = self.sub.queue
        while queue.full():
            queue.get_nowait()
        queue.put_nowait(None)

    async def run(self) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": NDJSON, "Cache-Control": "no-store"})
        await resp.prepare(self.request)
        last = 0
        if self.since is not None:
            for old in self.server.backend.events.since(self.since):
                if not await self._send(resp, old.to_json()):
                    return resp
                last = old.seq
        while True:
            try:
                event = await asyncio.wait_for(self.sub.get(), self.server.heartbeat_s)
            except TimeoutError:
                line = {"event": HEARTBEAT, "time": self.server.clock.time()}
                if not await self._send(resp, line):
                    return resp
                continue
            if event is None:
                await self._send(resp, self._ending())
                break
            if event.seq <= last:
                continue
            if not await self._send(resp, event.to_json()):
                return resp
        await resp.write_eof()
        return resp

    def _ending(self) -> dict[str, Any]:
        if self.server.closing:
            return {"event": STREAM_CLOSED, "reason": "the service is stopping"}
        return {
            "event": STREAM_DROPPED,
            "reason": f"this reader fell {self.server.subscriber_queue} events behind",
        }

    async def _send(self, resp: web.StreamResponse, obj: dict[str, Any]) -> bool:
        data = (_dumps(obj) + "\n").encode()
        try:
            await asyncio.wait_for(resp.write(data), self.server.write_timeout_s)
        except TimeoutError:
            log.warning("control API: dropping an event stream reader that stopped reading")
            transport = self.request.transport
            if transport is not None:
                transport.abort()
            return False
        except ConnectionError:
            return False
        return True


async def _stream(request: web.Request) -> web.StreamResponse:
    server = request.app[SERVER_KEY]
    stream = EventStream(server, request, _since(request))
    server.streams.add(stream)
    try:
        return await stream.run()
    finally:
        server.streams.discard(stream)
        stream.sub.close()


# --- mutations ---------------------------------------------------------------------------


class _NoBody(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _EjectBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    duration_ms: StrictInt | None = Field(
        default=None, ge=1, le=3_600_000, description="how long; default the deployment's base"
    )


class _ScaleBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    replicas: StrictInt = Field(ge=0, le=1024, description="the deployment's new worker count")


async def _read_body(request: web.Request, model: type[_M]) -> _M:
    server = request.app[SERVER_KEY]
    return await jsonbody.read_json(
        request,
        model,
        max_bytes=server.max_body,
        timeout_s=server.body_timeout_s,
        allow_empty=True,  # `curl -X POST` with no body is an empty object
    )


def _peer(request: web.Request) -> Peer:
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        raise InvalidRequest("cannot identify the peer of this connection")
    return read_peer(sock)


def _authorize(request: web.Request, what: str) -> Peer:
    server = request.app[SERVER_KEY]
    peer = _peer(request)
    try:
        server.policy.check_mutation(peer)
    except Forbidden:
        log.warning("control API: refused %s from %s", what, peer.describe())
        raise
    log.info("control API: %s by %s", what, peer.describe())
    return peer


async def _submit(request: web.Request, command: Command) -> web.Response:
    backend = request.app[SERVER_KEY].backend
    # Shielded: once queued, a command is applied even if the client hangs up, and the
    # supervisor must not find its result future cancelled under it.
    task = asyncio.ensure_future(backend.submit(command))
    task.add_done_callback(_retrieve)
    result = await asyncio.shield(task)
    return _json({"ok": True, **(result or {})})


def _retrieve(task: asyncio.Future[dict[str, Any]]) -> None:
    """Take the outcome of a command whose client may have gone (no 'never retrieved')."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("control API: command failed: %s", task.exception())


def _replica_handler(kind: CommandKind) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        replica = request.match_info["id"]
        _authorize(request, f"{kind} {replica}")
        if kind == "eject":
            body = await _read_body(request, _EjectBody)
            command = Command(kind="eject", replica=replica, duration_ms=body.duration_ms)
        else:
            await _read_body(request, _NoBody)
            command = Command(kind=kind, replica=replica)
        return await _submit(request, command)

    return handle


async def _scale(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    _authorize(request, f"scale {name}")
    body = await _read_body(request, _ScaleBody)
    return await _submit(request, Command(kind="scale", deployment=name, replicas=body.replicas))


async def _reload(request: web.Request) -> web.Response:
    _authorize(request, "reload")
    await _read_body(request, _NoBody)
    return await _submit(request, Command(kind="reload"))
