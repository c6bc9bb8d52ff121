"""``POST /v1/chat/completions``, ``GET /v1/models`` and ``POST /api/v1/eval`` of Router mode
(``vllm_sr.httpserver`` handlers).

The flow: ``model`` is an auto name -> route (signals, decision, model); a providers model
name -> that model's backend, no signals; anything else -> 400 ``model "X" is not available``
(upstream's status and message). The chosen model's backend gets the body with ``model``
rewritten and, for a matched decision, upstream's reasoning fields (vllm_sr/router/reasoning.py);
its answer comes back as it is (SSE streamed through). Answer headers, as upstream names them:

- ``x-vsr-selected-model``: the providers model name;
- ``x-vsr-selected-decision`` and ``x-vsr-selected-confidence`` (``%.4f``): the decision, when
  one matched;
- ``x-vsr-selected-algorithm``: ``single`` / ``static`` (a decision picked the model) or
  ``default`` (no decision: ``default_model``);
- with ``x-vsr-debug: true`` on the request: ``x-vsr-matched-<family>`` per signal family that
  matched (``x-vsr-matched-keywords``, ``-context``, ...) and ``x-vsr-selected-reasoning``;

and ours (upstream has nothing like them):

- ``x-vsr-matched-signals``: every matched signal as ``type:name``, comma-separated;
- ``x-vsr-routing-fallback``: present when the default model was used because routing could
  not decide (``signals:<error code>``: the signals' deployment was down, full, slow or
  answered badly; ``models_unhealthy``: the decision's models have no healthy backend).

Errors are ``{"error": {"code", "message", "retryable"}}``, which OpenAI clients read.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from vllm_sr import httpserver
from vllm_sr.config.recipes import DEFAULT_RECIPE
from vllm_sr.config.routing import Providers, Routing
from vllm_sr.config.routing_plugins import DecisionPlugins, decision_plugins
from vllm_sr.errors import InvalidRequest, NotFound, Overloaded, Unavailable, VllmSrError
from vllm_sr.httpserver import Handler, Request, Response, StreamResponse
from vllm_sr.router import eval as route_eval
from vllm_sr.router import fallback
from vllm_sr.router.backends import AttemptFailed, Backend, BackendSet
from vllm_sr.router.cache import embedding as cache_embedding
from vllm_sr.router.cache.answer import AnswerRecorder, replay_sse
from vllm_sr.router.plugins import shapers
from vllm_sr.router.plugins.fast_response import H_FAST, fast_body
from vllm_sr.router.plugins.response_cache import CachePlan, ResponseCache, build_store
from vllm_sr.router.reasoning import apply_reasoning, reasoning_enabled
from vllm_sr.router.request_view import RequestView
from vllm_sr.router.route import AuthzOptions, Exchange, Router, RouteResult, RouterStats

if TYPE_CHECKING:
    from vllm_sr.config.schema import GlobalSection

log = logging.getLogger("vllm_sr.router.chat")

H_DECISION = "x-vsr-selected-decision"
H_MODEL = "x-vsr-selected-model"
H_CONFIDENCE = "x-vsr-selected-confidence"
H_ALGORITHM = "x-vsr-selected-algorithm"
H_REASONING = "x-vsr-selected-reasoning"
H_SIGNALS = "x-vsr-matched-signals"
H_FALLBACK = "x-vsr-routing-fallback"
H_DEBUG = "x-vsr-debug"
H_RECIPE = "x-vsr-selected-recipe"
H_CACHE_HIT = "x-vsr-cache-hit"
H_CACHE_SIMILARITY = "x-vsr-cache-similarity"
H_RESPONSE_PATH = "x-vsr-response-path"
TIMEOUT_KEY = "x-request-timeout-ms"  # the caller's deadline, as the frontend reads it
NO_PLUGINS = DecisionPlugins()
# Rule-leaf type -> the debug header's family word (upstream's names).
DEBUG_FAMILY = {
    "keyword": "keywords",
    "embedding": "embeddings",
    "domain": "domains",
    "fact_check": "fact-check",
    "user_feedback": "user-feedback",
    "reask": "reask",
    "preference": "preference",
    "language": "language",
    "context": "context",
    "structure": "structure",
    "complexity": "complexity",
    "modality": "modality",
    "authz": "authz",
    "jailbreak": "jailbreak",
    "pii": "pii",
    "kb": "kb",
    "conversation": "conversation",
    "event": "event",
    "projection": "projections",
}


class ModelNotAvailable(InvalidRequest):
    """A chat naming a model that is neither an auto name nor a configured model: upstream
    answers 400 ``model "X" is not available`` (an ``invalid_request_error``)."""

    code = "model_not_found"


def error_response(exc: VllmSrError) -> Response:
    """The server's JSON error answer, with Retry-After in whole seconds when retrying helps."""
    response = httpserver.error_response(exc)
    if isinstance(exc, Overloaded | Unavailable):
        retry = getattr(exc, "retry_after_s", None) or exc.details.get("retry_after_s") or 1.0
        response.headers["Retry-After"] = str(max(1, math.ceil(float(retry))))
    if isinstance(exc, ModelNotAvailable):
        doc = json.loads(response.body)
        doc["error"]["type"] = "invalid_request_error"
        response.body = json.dumps(doc).encode()
    return response


def parse_chat(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest(
            f"model: expected a model name (a string), got {model!r}; see GET /v1/models"
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages: expected a non-empty list of messages")
    return body


def is_debug(headers: dict[str, str]) -> bool:
    return headers.get(H_DEBUG, "").strip().lower() == "true"


def answer_headers(result: RouteResult, *, debug: bool = False) -> dict[str, str]:
    headers = {H_MODEL: result.model, H_SIGNALS: ",".join(result.matched_signals)}
    if result.decision is not None:
        headers[H_DECISION] = result.decision
        headers[H_CONFIDENCE] = f"{result.confidence or 0.0:.4f}"
    if result.routed:
        headers[H_ALGORITHM] = result.method
        headers[H_RECIPE] = result.recipe
    if result.fallback is not None:
        headers[H_FALLBACK] = result.fallback
    if debug:
        families: dict[str, list[str]] = {}
        for sig in result.matched_signals:
            kind, _, name = sig.partition(":")
            if kind in DEBUG_FAMILY:
                families.setdefault(DEBUG_FAMILY[kind], []).append(name)
        for family, names in families.items():
            headers[f"x-vsr-matched-{family}"] = ",".join(names)
        headers[H_REASONING] = "on" if reasoning_enabled(result.model_ref) else "off"
    return headers


class EngineMode(NotFound):
    code = "engine_mode"


class ChatRouter:
    """Router mode's HTTP face for one config generation."""

    def __init__(
        self,
        router: Router,
        auto_model_names: list[str],
        recipes: Mapping[str, Router] | None = None,
        entrypoints: Mapping[str, str] | None = None,
        *,
        cache: ResponseCache | None = None,
        authz: AuthzOptions | None = None,
    ) -> None:
        self.router = router  # the default recipe's
        self.recipes: dict[str, Router] = {DEFAULT_RECIPE: router, **(recipes or {})}
        self.entrypoints = dict(entrypoints or {})  # entrypoint model name -> recipe
        self.backends = router.backends
        self.auto_model_names = list(auto_model_names)
        self.model_names = [m.name for m in router.providers.models]
        self.provider_models = {m.name: m for m in router.providers.models}
        self.cache = cache
        self.authz = authz or AuthzOptions()
        # (recipe, decision) -> the decision and its plugins
        self.decisions = {
            (name, d.name): d for name, r in self.recipes.items() for d in r.routing.decisions
        }
        self.plugins = {key: decision_plugins(d.plugins) for key, d in self.decisions.items()}

    @property
    def stats(self) -> RouterStats:
        return self.router.stats

    def routes(self) -> dict[str, dict[str, Handler]]:
        return {
            "/v1/chat/completions": {"POST": self.handle_chat},
            "/v1/models": {"GET": self.handle_models},
            "/api/v1/eval": {"POST": self.handle_eval},
        }

    async def handle_chat(self, request: Request) -> Response | StreamResponse:
        """Upstream's order: route; ``fast_response``; cache lookup; reasoning,
        ``system_prompt``, ``request_params``, ``header_mutation`` on the request to the
        backend (with fallback before the first byte); cache write."""
        try:
            if request.error is not None:
                raise request.error
            deadline = self._deadline(request)
            body = parse_chat(request.body)
            view = RequestView.from_chat(body, request.headers)
            query = cache_embedding.watch(self.router.decision_deployment, view.text)
            result = await self.resolve(body, view)
            plugins = self.plugins_of(result)
            debug = is_debug(request.headers)
            stream = body.get("stream") is True
            if plugins.fast_response is not None:
                return self.fast_answer(result, plugins.fast_response.message, stream)
            plan = self.cache_plan(result, plugins, body, request.headers, query)
            if plan is not None and self.cache is not None:
                hit = await self.cache.lookup(plan)
                if hit is not None:
                    return self.cache_answer(result, hit, stream, debug)
            recorder = AnswerRecorder() if plan is not None else None
            answer, answered_by = await self.forward(
                body, result, plugins, request, debug, deadline, recorder
            )
            # (an answer from a fallback model is not filed under the chosen model)
            chosen_answered = answered_by == result.model
            if plan is not None and recorder is not None and self.cache and chosen_answered:
                await self.cache.write(plan, recorder.document())
            return answer
        except VllmSrError as exc:
            return error_response(exc)

    def _deadline(self, request: Request) -> float | None:
        raw = request.headers.get(TIMEOUT_KEY)
        if raw is None:
            return None
        try:
            ms = float(raw)
        except ValueError:
            ms = -1.0
        if not ms > 0 or not math.isfinite(ms):
            raise InvalidRequest(
                f"header X-Request-Timeout-Ms must be a positive number of milliseconds, "
                f"got {raw!r}"
            )
        return self.backends.clock.monotonic() + ms / 1000.0

    def plugins_of(self, result: RouteResult) -> DecisionPlugins:
        """The matched decision's plugins (none for a named model or no decision)."""
        if not result.routed or result.decision is None:
            return NO_PLUGINS
        return self.plugins.get((result.recipe, result.decision), NO_PLUGINS)

    async def forward(
        self,
        body: dict[str, Any],
        result: RouteResult,
        plugins: DecisionPlugins,
        request: Request,
        debug: bool,
        deadline: float | None,
        recorder: AnswerRecorder | None,
    ) -> tuple[Response | StreamResponse, str]:
        """The chat to its model's backend, falling back before the first byte
        (vllm_sr/router/fallback.py). -> (the answer, the model that answered)."""
        order = fallback.candidates(result, self.router.default_model, self.backends.healthy)
        failed: list[tuple[str, str]] = []
        last: AttemptFailed | None = None
        set_headers, drop_headers = (
            shapers.header_changes(plugins.header_mutation)
            if plugins.header_mutation is not None
            else ({}, [])
        )
        clock = self.backends.clock
        for i, (model, ref) in enumerate(order):
            remaining = None if deadline is None else deadline - clock.monotonic()
            if remaining is not None and remaining <= 0 and last is not None:
                break
            attempt = result if i == 0 else dataclasses.replace(result, model=model, model_ref=ref)
            backend = self.backends.pick(model)
            outgoing = self.outgoing_body(body, attempt, backend, plugins)
            headers = answer_headers(attempt, debug=debug)
            if failed:
                headers[fallback.H_BACKEND_FALLBACK] = fallback.failure_header(failed)
            try:
                answer = await self.backends.proxy(
                    backend,
                    outgoing,
                    request,
                    headers,
                    upstream_model=getattr(ref, "lora_name", None),
                    early_failure=i < len(order) - 1,
                    first_byte_timeout_s=remaining,
                    tap=recorder if i == 0 else None,
                    extra_headers=set_headers,
                    drop_headers=drop_headers,
                )
                return answer, model
            except AttemptFailed as exc:
                log.info(
                    "model %s failed before its first byte (%s); trying the next", model, exc.reason
                )
                failed.append((model, exc.reason))
                self.stats.backend_fallbacks[(model, exc.reason)] += 1
                last = exc
        assert last is not None
        if last.answer is not None:
            last.answer.headers[fallback.H_BACKEND_FALLBACK] = fallback.failure_header(failed)
            return last.answer, failed[-1][0]
        err = error_response(last.error or Unavailable("no backend answered"))
        err.headers[fallback.H_BACKEND_FALLBACK] = fallback.failure_header(failed)
        return err, failed[-1][0]

    def outgoing_body(
        self,
        body: dict[str, Any],
        result: RouteResult,
        backend: Backend,
        plugins: DecisionPlugins = NO_PLUGINS,
    ) -> dict[str, Any]:
        """Upstream's reasoning fields for an auto-routed chat whose decision matched (a
        decision without modelRefs turns reasoning off on the default model), then the
        decision's ``system_prompt`` and ``request_params``; a named model, or a chat no
        decision matched, goes as the caller wrote it."""
        if result.decision is None:
            return body
        out = apply_reasoning(
            body,
            result.model_ref,
            self.provider_models[result.model],
            self.router.providers.defaults,
            backend.ref,
            decision_refs=result.decision_refs,
        )
        if plugins.system_prompt is not None:
            out = shapers.apply_system_prompt(out, plugins.system_prompt)
        if plugins.request_params is not None:
            out = shapers.apply_request_params(out, plugins.request_params)
        return out

    def cache_plan(
        self,
        result: RouteResult,
        plugins: DecisionPlugins,
        body: dict[str, Any],
        headers: Mapping[str, str],
        query: cache_embedding.QueryEmbedding,
    ) -> CachePlan | None:
        conf = plugins.response_cache
        if self.cache is None or conf is None or not conf.enabled or result.decision is None:
            return None
        if result.fallback is not None:
            return None  # routing could not decide: not the decision's answer
        return self.cache.plan(
            conf,
            body=body,
            headers=headers,
            recipe=result.recipe,
            decision=self.decisions[(result.recipe, result.decision)],
            selected_model=result.model,
            user_id_header=self.authz.user_id_header,
            user_groups_header=self.authz.user_groups_header,
            embedding=query,
        )

    def cache_answer(self, result: RouteResult, hit: Any, stream: bool, debug: bool) -> Response:
        headers = {
            H_CACHE_HIT: "true",
            H_DECISION: result.decision or "",
            H_RECIPE: result.recipe,
            H_MODEL: result.model,
            H_RESPONSE_PATH: "cache",
        }
        if debug:
            headers[H_CACHE_SIMILARITY] = f"{hit.similarity:.4f}"
        if stream:
            return Response(replay_sse(hit.doc), 200, "text/event-stream", headers)
        return Response(json.dumps(hit.doc, ensure_ascii=False).encode(), 200, headers=headers)

    def fast_answer(self, result: RouteResult, message: str, stream: bool) -> Response:
        raw, content_type = fast_body(message, stream=stream)
        headers = {
            H_FAST: "true",
            H_DECISION: result.decision or "",
            H_RECIPE: result.recipe,
            H_ALGORITHM: "fast_response",
            H_RESPONSE_PATH: "fast_response",
        }
        return Response(raw, 200, content_type, headers)

    def recipe_of(self, model: str) -> str | None:
        """The recipe a request ``model`` selects: ``default`` for an auto name, an entrypoint's
        recipe for its names; None for a concrete model."""
        if model in self.auto_model_names:
            return DEFAULT_RECIPE
        return self.entrypoints.get(model)

    async def resolve(self, body: dict[str, Any], view: RequestView) -> RouteResult:
        model = body["model"]
        recipe = self.recipe_of(model)
        if recipe is not None:
            return await self.recipes[recipe].route(view)
        if model in self.backends.models:
            self.stats.direct[model] += 1
            return RouteResult(model, routed=False)
        raise ModelNotAvailable(
            f"model {json.dumps(model)} is not available; accepted: an auto name "
            f"({', '.join(self.auto_model_names)}) or a model ({', '.join(self.model_names)})",
            model=model,
        )

    async def handle_eval(self, request: Request) -> Response:
        """Upstream's routing preview; its own error document (code, message, timestamp)."""
        try:
            if request.error is not None:
                raise route_eval.EvalError("INVALID_INPUT", request.error.message)
            payload = route_eval.parse_payload(request.body)
            model = payload.get("model") or self.auto_model_names[0]
            recipe = self.recipe_of(model) if isinstance(model, str) else None
            if recipe is None:
                raise route_eval.EvalError(
                    "INVALID_ROUTING_MODEL",
                    f"model {json.dumps(model)} is not an auto model name or entrypoint; "
                    f"accepted: {', '.join([*self.auto_model_names, *self.entrypoints])}",
                )
            want_trace = "trace=true" in request.query.split("&") or bool(
                (payload.get("options") or {}).get("trace")
            )
            doc = await route_eval.evaluate(
                self.recipes[recipe], payload, model=model, recipe=recipe, want_trace=want_trace
            )
            return Response(json.dumps(doc).encode())
        except route_eval.EvalError as exc:
            return Response(route_eval.error_body(exc), status=exc.http_status)
        except VllmSrError as exc:
            err = route_eval.EvalError("INVALID_INPUT", exc.message)
            if exc.http_status >= 500:
                err = route_eval.EvalError("CLASSIFICATION_ERROR", exc.message)
                err.http_status = 500
            return Response(route_eval.error_body(err), status=err.http_status)

    def models_data(self) -> list[dict[str, Any]]:
        """The /v1/models entries of Router mode: the auto names, then the models."""
        data: list[dict[str, Any]] = [
            {"id": name, "object": "model", "owned_by": "vllm-sr", "kind": "auto"}
            for name in self.auto_model_names
        ]
        for m in self.router.providers.models:
            states = [b.health.state for b in self.backends.models[m.name]]
            data.append(
                {
                    "id": m.name,
                    "object": "model",
                    "owned_by": "vllm-sr",
                    "kind": "backend",
                    "provider_model_id": m.backend_model,
                    "state": "healthy" if "healthy" in states else states[0],
                    "default": m.name == self.router.default_model,
                }
            )
        return data

    async def handle_models(self, request: Request) -> Response:
        return Response(json.dumps({"object": "list", "data": self.models_data()}).encode())

    def inventory(self) -> dict[str, Any]:
        """For the inventory document (key "router"): backends, decision counters and the
        response cache's."""
        doc: dict[str, Any] = {"backends": self.backends.inventory(), "stats": self.stats.to_json()}
        if self.cache is not None:
            usage = self.cache.store.usage()
            doc["cache"] = {
                "store": self.cache.store.kind,
                "entries": None if usage is None else usage[0],
                "bytes": None if usage is None else usage[1],
                **self.cache.stats.to_json(),
            }
        return doc


def build_chat_router(
    providers: Providers,
    routing: Routing,
    *,
    exchange: Exchange,
    decision_deployment: str,
    auto_model_names: list[str],
    backends: BackendSet | None = None,
    stats: RouterStats | None = None,
    signal_timeout_ms: float | None = None,
    authz: AuthzOptions | None = None,
    recipes: Mapping[str, Routing] | None = None,
    entrypoints: Mapping[str, str] | None = None,
    global_: GlobalSection | None = None,
    cache: ResponseCache | bool | None = True,
) -> ChatRouter:
    """The Router-mode handlers for one config generation. Pass the previous generation's
    ``stats`` to keep the counters across a reload; ``backends`` is started by the caller
    (``await backends.start()``) and closed when the generation is replaced. ``cache``: a
    response cache to keep (a reload that keeps the store), True to build one from
    ``global.stores.response_cache``, None/False for none."""
    backends = backends if backends is not None else BackendSet(providers)
    stats = stats if stats is not None else RouterStats()
    raw_exchange = exchange
    exchange = cache_embedding.tapping(exchange)  # the semantic cache reuses routing's embedding
    if cache is True:
        store, ttl = build_store(global_)
        cache = (
            ResponseCache(
                store, exchange=raw_exchange, default_ttl_s=ttl, signal_timeout_ms=signal_timeout_ms
            )
            if store is not None
            else None
        )
    elif cache is False:
        cache = None

    def router_for(recipe: str, recipe_routing: Routing) -> Router:
        return Router(
            providers,
            recipe_routing,
            exchange=exchange,
            backends=backends,
            decision_deployment=decision_deployment,
            signal_timeout_ms=signal_timeout_ms,
            stats=stats,
            authz=authz,
            global_=global_,
            recipe=recipe,
        )

    others = {
        name: router_for(name, r) for name, r in (recipes or {}).items() if name != DEFAULT_RECIPE
    }
    return ChatRouter(
        router_for(DEFAULT_RECIPE, routing),
        auto_model_names,
        others,
        entrypoints,
        cache=cache,
        authz=authz,
    )


async def engine_mode_chat(request: Request) -> Response:
    """``/v1/chat/completions`` in Engine mode (-e): a typed 404 that says so."""
    return error_response(
        EngineMode(
            "chat completions are not served: the service runs in Engine mode (serve -e); "
            "accepted: the native surfaces /v1/embeddings, /v1/classify, /v1/bundle, or "
            "restart without -e for Router mode"
        )
    )
