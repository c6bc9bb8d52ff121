"""The control API's endpoints. Handlers validate, check the peer, and hand a ``Command`` to the
backend; every error leaves as the one error answer (``vllm_sr.wire`` through
``httpserver.error_response``): ``{"error": {"code", "message", "retryable"}}`` with the error's
status, a refused config's problems in ``details.problems``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar
from urllib.parse import parse_qs

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from vllm_sr import jsonbody
from vllm_sr.clock import Clock
from vllm_sr.control.auth import AccessPolicy, Peer, peer_of
from vllm_sr.control.commands import Command, CommandKind
from vllm_sr.control.outcome_policy import IDEMPOTENCY_HEADER, OutcomePolicy, principal_of
from vllm_sr.control.stream import EventStream, dumps
from vllm_sr.errors import Forbidden, InvalidRequest, VllmSrError
from vllm_sr.events import EventBus
from vllm_sr.httpserver import PathRoutes, Request, Response, StreamResponse, error_response
from vllm_sr.router.learning.outcomes import Outcome, OutcomeBody, normalize

log = logging.getLogger("vllm_sr.control")


class ControlBackend(Protocol):
    """What the server needs from the supervisor (or a fake in tests)."""

    events: EventBus

    def inventory(self) -> dict[str, Any]: ...

    def health(self) -> dict[str, Any]: ...

    def effective_config(self) -> dict[str, Any]: ...

    async def replay(
        self,
        decision: str | None = None,
        since: int = 0,
        recipe: str | None = None,
        session: str | None = None,
    ) -> dict[str, Any]: ...

    async def outcome(self, outcome: Outcome) -> dict[str, Any]: ...

    async def submit(self, command: Command) -> dict[str, Any]: ...


class ServerView(Protocol):
    """The server as its routes see it (``ControlServer``; no import back up to it)."""

    backend: ControlBackend
    policy: AccessPolicy
    outcomes: OutcomePolicy
    clock: Clock
    closing: bool
    streams: set[EventStream]
    heartbeat_s: float
    write_timeout_s: float
    subscriber_queue: int


Answer = Response | StreamResponse
Route = Callable[[ServerView, Request, dict[str, str]], Awaitable[Answer]]
_M = TypeVar("_M", bound=BaseModel)


def _json(body: Any, status: int = 200) -> Response:
    return Response(dumps(body).encode(), status)


async def handle(server: ServerView, request: Request) -> Answer:
    """Answer one request: a refusal found while reading it (413, 408), an unknown path (404)
    or method (405), a handler's typed error, and a bug (500, logged) all as the one error."""
    try:
        if request.error is not None:
            raise request.error
        route, params = ROUTES.resolve(request)
        return await route(server, request, params)
    except VllmSrError as exc:
        return error_response(exc)
    except Exception:
        log.exception("control API: %s %s failed", request.method, request.path)
        return error_response(
            VllmSrError(f"internal error serving {request.method} {request.path}; see the log")
        )


# --- reads -------------------------------------------------------------------------------


async def _inventory(server: ServerView, request: Request, _: dict[str, str]) -> Answer:
    return _json(server.backend.inventory())


async def _health(server: ServerView, request: Request, _: dict[str, str]) -> Answer:
    body = dict(server.backend.health())
    body["caller"] = _caller(server, request)
    return _json(body)


def _caller(server: ServerView, request: Request) -> dict[str, object]:
    """Whether this peer may mutate, so a client can disable its actions up front."""
    try:
        peer = _peer(request)
    except InvalidRequest as exc:
        return {"uid": None, "may_mutate": False, "why": exc.message}
    try:
        server.policy.check_mutation(peer)
    except Forbidden as exc:
        return {"uid": peer.uid, "may_mutate": False, "why": exc.message}
    return {"uid": peer.uid, "may_mutate": True, "why": None}


async def _config(server: ServerView, request: Request, _: dict[str, str]) -> Answer:
    return _json(server.backend.effective_config())


def _query(request: Request, name: str) -> str | None:
    values = parse_qs(request.query, keep_blank_values=True).get(name)
    return values[0] if values else None


def _since(request: Request) -> int | None:
    raw = _query(request, "since")
    if raw is None:
        return None
    if not raw.isdigit():
        raise InvalidRequest(f"since: expected a whole number >= 0 (an event seq), got {raw!r}")
    return int(raw)


async def _replay(server: ServerView, request: Request, _: dict[str, str]) -> Answer:
    """router_replay's records: ``?decision=D`` (one decision), ``?recipe=R`` (one recipe),
    ``?session_id=S`` (one session), ``?since=SEQ`` (after it)."""
    decision = _query(request, "decision") or None
    recipe = _query(request, "recipe") or None
    session = (_query(request, "session_id") or "").strip() or None
    return _json(await server.backend.replay(decision, _since(request) or 0, recipe, session))


async def _events(server: ServerView, request: Request, _: dict[str, str]) -> Answer:
    bus = server.backend.events
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


async def _stream(server: ServerView, request: Request, _: dict[str, str]) -> Answer:
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


def _body(request: Request, model: type[_M]) -> _M:
    # The server has read it whole within the size cap and body timeout (else request.error).
    # `curl -X POST` with no body is an empty object.
    return jsonbody.parse_json(request.body, model, allow_empty=True)


def _peer(request: Request) -> Peer:
    if request.peer is None:
        raise InvalidRequest("cannot identify the peer of this connection")
    return peer_of(request.peer)


def _authorize(server: ServerView, request: Request, what: str) -> Peer:
    peer = _peer(request)
    try:
        server.policy.check_mutation(peer)
    except Forbidden:
        log.warning("control API: refused %s from %s", what, peer.describe())
        raise
    log.info("control API: %s by %s", what, peer.describe())
    return peer


async def _submit(server: ServerView, command: Command) -> Answer:
    # Shielded: once queued, a command is applied even if the client hangs up, and the
    # supervisor must not find its result future cancelled under it.
    task = asyncio.ensure_future(server.backend.submit(command))
    task.add_done_callback(_retrieve)
    result = await asyncio.shield(task)
    return _json({"ok": True, **(result or {})})


def _retrieve(task: asyncio.Future[dict[str, Any]]) -> None:
    """Take the outcome of a command whose client may have gone (no 'never retrieved')."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("control API: command failed: %s", task.exception())


def _replica_route(kind: CommandKind) -> Route:
    async def route(server: ServerView, request: Request, params: dict[str, str]) -> Answer:
        replica = params["id"]
        _authorize(server, request, f"{kind} {replica}")
        if kind == "eject":
            body = _body(request, _EjectBody)
            command = Command(kind="eject", replica=replica, duration_ms=body.duration_ms)
        else:
            _body(request, _NoBody)
            command = Command(kind=kind, replica=replica)
        return await _submit(server, command)

    return route


async def _scale(server: ServerView, request: Request, params: dict[str, str]) -> Answer:
    name = params["name"]
    _authorize(server, request, f"scale {name}")
    body = _body(request, _ScaleBody)
    return await _submit(server, Command(kind="scale", deployment=name, replicas=body.replicas))


async def _reload(server: ServerView, request: Request, _: dict[str, str]) -> Answer:
    _authorize(server, request, "reload")
    _body(request, _NoBody)
    return await _submit(server, Command(kind="reload"))


async def _outcome(server: ServerView, request: Request, _: dict[str, str]) -> Answer:
    """Router Learning's outcome verdict on a routed chat (upstream's route and body;
    vllm_sr/router/learning/outcomes.py): the peer must be allowed to change the service,
    then the policy's key and rate checks (control/outcome_policy.py), then the verdict."""
    peer = _authorize(server, request, "outcome verdict")
    body = jsonbody.parse_json(request.body, OutcomeBody)
    key, source = server.outcomes.enforce(
        request.headers.get(IDEMPOTENCY_HEADER), principal_of(peer)
    )
    result = await server.backend.outcome(normalize(body, key, source))
    stamp = datetime.fromtimestamp(server.clock.time(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return _json({"success": True, **result, "timestamp": stamp})


_REPLICA_ACTIONS: tuple[CommandKind, ...] = ("drain", "eject", "readmit", "restart")

ROUTES: PathRoutes[Route] = PathRoutes(
    {
        "/v1/inventory": {"GET": _inventory},
        "/v1/health": {"GET": _health},
        "/v1/config": {"GET": _config},
        "/v1/events": {"GET": _events},
        "/v1/events/stream": {"GET": _stream},
        "/v1/replay": {"GET": _replay},
        "/v1/router/outcomes": {"POST": _outcome},
        **{f"/v1/replicas/{{id}}/{a}": {"POST": _replica_route(a)} for a in _REPLICA_ACTIONS},
        "/v1/deployments/{name}/scale": {"POST": _scale},
        "/v1/reload": {"POST": _reload},
    }
)
