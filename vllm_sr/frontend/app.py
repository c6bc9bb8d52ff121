"""The public HTTP API (``vllm_sr.httpserver``; 127.0.0.1:8080 by default).

``POST /v1/embeddings``, ``/v1/classify``, ``/v1/bundle`` go to the deployment ``model`` names
(default: the decision model's deployment) as one unit each; the body's bytes go to the worker
unchanged, and the worker's bytes come back unchanged. Router mode adds
``/v1/chat/completions``, ``/api/v1/eval`` (also at v0.4's ``/api/v1/routing/preview``) and,
configured, the Responses API (``/v1/responses``, ``/v1/responses/{id}``, ``.../input_items``).
``GET /v1/models``, ``/health``, ``/ready``, ``/startup-status``,
``/api/v1/inventory/model-runtime`` and ``/metrics`` describe the service. Errors are
``{"error": {"code", "message", "retryable"}}`` with the error's HTTP status (429 carries
Retry-After); an unknown path is 404 ``not_found``, another method 405 ``method_not_allowed``.
A caller that hangs up has its request cancelled (the pool frees its slot as "cancelled").
"""

from __future__ import annotations

import json
import logging
import time
from typing import Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from vllm_sr import jsonbody, wire
from vllm_sr.errors import InvalidRequest, Unavailable, VllmSrError
from vllm_sr.frontend.cache import CachedAnswer, ResultCache, cache_key
from vllm_sr.frontend.chat_mount import ChatMount
from vllm_sr.frontend.metrics import FrontendCollector
from vllm_sr.frontend.scrape import ScrapedCollector, merge, scrape
from vllm_sr.httpserver import (
    Handler,
    HttpServer,
    PathRoutes,
    Request,
    Response,
    StreamResponse,
    answer,
    error_response,
)
from vllm_sr.jsontypes import JsonObject
from vllm_sr.plan import RouterPlan
from vllm_sr.pool.directory import PoolDirectory
from vllm_sr.pool.exchange import exchange
from vllm_sr.pool.pool import ReplicaPool

log = logging.getLogger("vllm_sr.frontend")

MAX_BODY_BYTES = wire.MAX_BODY_BYTES
READ_TIMEOUT_S = wire.READ_TIMEOUT_S
SHUTDOWN_GRACE_S = 60.0  # requests in hand at stop get this long
RETRY_HEADER = wire.RETRY_HEADER
SURFACES = ("embeddings", "classify", "bundle")
JSON = "application/json"


def caller_timeout_ms(request: Request) -> float | None:
    return wire.deadline_ms(request.headers.get(wire.DEADLINE_KEY))


def model_of(body: bytes) -> str | None:
    """The ``model`` field, the only part of the body the frontend reads."""
    model = jsonbody.parse_json(body).get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequest(f"field 'model' must be a string naming a deployment, got {model!r}")
    return model


class Service(Protocol):
    """What the frontend needs of the running service (the supervisor implements it)."""

    @property
    def directory(self) -> PoolDirectory: ...

    @property
    def admitting(self) -> bool: ...

    def inventory(self) -> JsonObject: ...

    def health(self) -> JsonObject: ...

    def startup_status(self) -> JsonObject: ...

    def router_plan(self) -> RouterPlan | None: ...


class Frontend:
    def __init__(
        self,
        service: Service,
        *,
        cache_entries: int = 4096,
        max_connections: int | None = None,
        chat: ChatMount | None = None,
    ) -> None:
        self.service = service
        self.directory = service.directory
        self.caches: dict[str, ResultCache] = {}
        self._cache_entries = cache_entries
        self._cache_generation = -1
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = FrontendCollector(self.directory, self.caches, self._config_view)
        self.registry.register(self.collector)
        self.scraped = ScrapedCollector()
        self.registry.register(self.scraped)
        # serve shares one with the supervisor, which builds each generation's router when it
        # publishes the generation (never on a request)
        self.chat = chat if chat is not None else ChatMount(self.directory)
        self._router_metrics = False  # RouterCollector registered (with the first routed plan)
        self.routes: dict[str, dict[str, Handler]] = {
            **{f"/v1/{s}": {"POST": self._surface(s)} for s in SURFACES},
            "/v1/models": {"GET": self.models},
            "/v1/chat/completions": {"POST": self.chat_completions},
            "/v1/responses": {"POST": self._responses("create")},
            "/v1/responses/{id}": {
                "GET": self._responses("retrieve"),
                "DELETE": self._responses("delete"),
            },
            "/v1/responses/{id}/input_items": {"GET": self._responses("input_items")},
            "/api/v1/eval": {"POST": self.route_eval},
            "/api/v1/routing/preview": {"POST": self.route_eval},  # v0.4's path, one handler
            "/health": {"GET": self.health},
            "/ready": {"GET": self.ready},
            "/startup-status": {"GET": self.startup_status},
            "/api/v1/inventory/model-runtime": {"GET": self.inventory},
            "/metrics": {"GET": self.metrics},
        }
        self.paths = PathRoutes(self.routes)  # fixed paths: one dict lookup, as before
        # cancel_on_disconnect: a caller that hangs up frees its admission slot at once (the
        # pool records "cancelled"); the worker's forward may still finish on its own.
        self.server = HttpServer(
            self.handle,
            max_body=MAX_BODY_BYTES,
            read_timeout_s=READ_TIMEOUT_S,
            cancel_on_disconnect=True,
            max_connections=max_connections,  # the host setting; past it: 503 and closed
        )
        self.address: str = ""

    # ------------------------------------------------------------------ serving
    async def start(self, host: str, port: int) -> str:
        await self.sync_router()
        _, bound_port = await self.server.listen_tcp(host, port)
        self.address = f"{host}:{bound_port}"
        return self.address

    async def handle(self, request: Request) -> Response | StreamResponse:
        """Every request: its route; errors (a path or method not served, a body over the cap
        or too slow to come) as JSON."""
        if request.error is not None:  # over the cap, or too slow to come: on any route
            surface = request.path.removeprefix("/v1/")
            if surface in SURFACES:
                self.collector.count(surface, request.error.http_status)
            return error_response(request.error)
        return await answer(self.paths, request)

    async def sync_router(self) -> None:
        """Take the service's router settings, at start (a no-op when the supervisor already
        built them: it builds each generation's router when it publishes it; a request never
        does)."""
        await self.chat.update(self.service.router_plan())
        self._register_router_metrics()

    def _register_router_metrics(self) -> None:
        if self.chat.chat is not None and not self._router_metrics:
            # Imported here: Engine mode never loads the router (lazy Router mode).
            from vllm_sr.router.metrics import RouterCollector

            chat = self.chat
            self.registry.register(RouterCollector(lambda: chat.chat, lambda: chat.responses))
            self._router_metrics = True

    async def chat_completions(self, request: Request) -> Response | StreamResponse:
        return await self.chat.handle_chat(request, self.service.admitting)

    def _responses(self, op: str) -> Handler:
        """The Responses API's handlers (Router mode, with global.services.response_api)."""

        async def handler(request: Request) -> Response | StreamResponse:
            return await self.chat.handle_responses(request, self.service.admitting, op)

        return handler

    async def stop(self) -> None:
        await self.chat.close()
        await self.server.close(SHUTDOWN_GRACE_S)

    def _cache_for(self, name: str, max_bytes: int) -> ResultCache | None:
        """The deployment's cache when its pool keeps one (``frontend_cache_bytes`` > 0: one
        replica, vllm_sr.pool.result_caches); multi-replica deployments bypass it."""
        if self._cache_generation != self.directory.generation:
            self.caches.clear()  # a new generation may answer differently (or scale)
            self._cache_generation = self.directory.generation
        if max_bytes <= 0 or self._cache_entries <= 0:
            return None
        cache = self.caches.get(name)
        if cache is None:
            cache = self.caches[name] = ResultCache(self._cache_entries, max_bytes)
        return cache

    def _surface(self, surface: str) -> Handler:
        path = f"/v1/{surface}"

        async def handler(request: Request) -> Response:
            try:
                return await self._exchange(request, surface, path)
            except VllmSrError as exc:
                self.collector.count(surface, exc.http_status)
                return error_response(exc)

        return handler

    async def _exchange(self, request: Request, surface: str, path: str) -> Response:
        if not self.service.admitting:
            raise Unavailable("the service is stopping", retry_after_s=1.0)
        body = request.body
        timeout_ms = caller_timeout_ms(request)
        pool = self.directory.resolve(model_of(body))
        cache = self._cache_for(pool.deployment, pool.frontend_cache_bytes)
        key = b""
        if cache is not None:
            key = cache_key(surface, pool.deployment, body, served_dtype(pool))
        if cache is not None:
            hit = cache.get(key)
            if hit is not None:
                self.collector.count(surface, hit.status)
                return Response(hit.body, hit.status, hit.content_type, {"X-Cache": "hit"})
        started = time.monotonic()
        resp = await exchange(pool, path, body, timeout_ms)
        self.collector.latency.observe(pool.deployment, surface, time.monotonic() - started)
        if cache is not None and resp.status == 200:
            cache.put(key, CachedAnswer(resp.status, resp.body, resp.content_type))
        self.collector.count(surface, resp.status)
        headers = dict(resp.headers)
        if resp.retries:
            headers[RETRY_HEADER] = f"{resp.retries}; from={resp.retried_from}"
        return Response(resp.body, resp.status, resp.content_type, headers)

    # ------------------------------------------------------------------ descriptions
    async def models(self, request: Request) -> Response:
        data = self.chat.models_data()
        for name, pool in self.directory.items():
            inv = pool.inventory()
            data.append(
                {
                    "id": name,
                    "object": "model",
                    "kind": "deployment",
                    "owned_by": "vllm-sr",
                    "artifact": pool.artifact,
                    "default": name == self.directory.default,
                    "state": inv["state"],
                    "desired_replicas": inv["desired_replicas"],
                    "ready_replicas": inv["ready_replicas"],
                }
            )
        return _json({"object": "list", "data": data})

    async def route_eval(self, request: Request) -> Response:
        return await self.chat.handle_eval(request)

    async def health(self, request: Request) -> Response:
        doc = self.service.health()
        return _json(doc, 200 if doc["ready"] else 503)

    async def ready(self, request: Request) -> Response:
        """v0.4's readiness: 503 while a worker of the generation is still starting, loading
        or warming, or a deployment has no serving replica (vllm_sr/supervisor/readiness.py)."""
        doc = self.service.startup_status()
        brief = {k: doc[k] for k in ("ready", "phase", "generation")}
        return _json(brief, 200 if doc["ready"] else 503)

    async def startup_status(self, request: Request) -> Response:
        return _json(self.service.startup_status())

    async def inventory(self, request: Request) -> Response:
        return _json(self.service.inventory())

    def _config_view(self) -> JsonObject | None:
        """The inventory's ``service.config`` (None: the service watches no file)."""
        service = self.service.inventory().get("service")
        view = service.get("config") if isinstance(service, dict) else None
        return view if isinstance(view, dict) else None

    async def metrics(self, request: Request) -> Response:
        self._register_router_metrics()  # Router mode's families, once a generation routes
        self.scraped.families = merge(await scrape(self.directory))
        return Response(generate_latest(self.registry), content_type=CONTENT_TYPE_LATEST)


def served_dtype(pool: ReplicaPool) -> str:
    """The precision the deployment's serving replica resolved ("" before one reports): part
    of the frontend cache's key, so an answer of one precision never answers for another."""
    for r in pool.replicas():
        if r.serving and r.capabilities:
            return str(r.capabilities.get("dtype") or "")
    return ""


def _json(doc: object, status: int = 200) -> Response:
    return Response(json.dumps(doc).encode(), status)
