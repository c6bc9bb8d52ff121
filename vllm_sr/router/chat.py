"""``POST /v1/chat/completions``, ``GET /v1/models`` and ``POST /api/v1/eval`` (also served as
``/api/v1/routing/preview``) of Router mode (``vllm_sr.httpserver`` handlers).

The flow: ``model`` is an auto name -> route (signals, decision, model); a providers model
name -> that model's backend, no signals; anything else -> 400 ``model "X" is not available``
(upstream's status and message). The chosen model's backend gets the body with ``model``
rewritten and, for a matched decision, upstream's reasoning fields (vllm_sr/router/reasoning.py)
and the decision's plugins (vllm_sr/router/chat_plugins.py: fast_response, response cache,
tools, tool_selection, masking, router_replay; vllm_sr/router/outgoing.py: system_prompt,
request_params, header_mutation; shadow_dispatch's copy, queued by the backend stage once the
answer started: vllm_sr/router/plugins/shadow.py), with the backend fallback before the first byte
(vllm_sr/router/fallback.py); its answer comes back as it is (SSE streamed through). The
stages run in vllm_sr/router/pipeline.py, over one ``ChatRun`` per request. Answer headers,
as upstream names them (the plugins add ``x-vsr-cache-hit``, ``x-vsr-fast-response``,
``x-vsr-replay-id`` and ours ``x-vsr-backend-fallback``):

- ``x-vsr-selected-model``: the providers model name;
- ``x-vsr-selected-decision`` and ``x-vsr-selected-confidence`` (``%.4f``): the decision, when
  one matched;
- ``x-vsr-selected-algorithm``: ``single`` / ``static`` (a decision picked the model) or
  ``default`` (no decision: ``default_model``);
- with ``x-vsr-debug: true`` on the request: ``x-vsr-matched-<family>`` per signal family that
  matched (``x-vsr-matched-keywords``, ``-context``, ...) and ``x-vsr-selected-reasoning``;

- with ``x-vsr-debug: true`` and Router Learning on (vllm_sr/router/learning, which may move a
  routed chat to another model before the plugins run): ``x-vsr-learning-{methods,actions,
  scopes,reasons}`` and ``x-vsr-session-phase``;

and ours (upstream has nothing like them):

- ``x-vsr-matched-signals``: every matched signal as ``type:name``, comma-separated;
- ``x-vsr-unknown-signals``: the signals that could not be evaluated on this chat (their
  deployment was full, down, slow or answered badly: vllm_sr/router/unknown.py), as
  ``type:name``, comma-separated; they matched no rule, every other signal was evaluated;
- ``x-vsr-routing-fallback``: present when the default model was used because routing could
  not decide (``signals:<reason>``: no decision matched while some signals were unknown;
  ``models_unhealthy``: the decision's models have no healthy backend).

Errors are ``{"error": {"code", "message", "retryable"}}``, which OpenAI clients read.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from vllm_sr.config.recipes import DEFAULT_RECIPE
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_plugins import decision_plugins, replay_allowed
from vllm_sr.config.routing_providers import Providers
from vllm_sr.errors import EngineMode, VllmSrError
from vllm_sr.httpserver import Handler, Request, Response, StreamResponse
from vllm_sr.jsontypes import JsonObject
from vllm_sr.router import eval as route_eval
from vllm_sr.router import pipeline
from vllm_sr.router import preview as route_preview
from vllm_sr.router.answers import (
    H_ALGORITHM,
    H_CONFIDENCE,
    H_DEBUG,
    H_DECISION,
    H_FALLBACK,
    H_MODEL,
    H_REASONING,
    H_RECIPE,
    H_SIGNALS,
    H_UNKNOWN,
    ModelNotAvailable,
    answer_headers,
    error_response,
    is_debug,
    parse_chat,
)
from vllm_sr.router.backend_proxy import StreamRewrite
from vllm_sr.router.backends import BackendSet
from vllm_sr.router.fallback import Upstream
from vllm_sr.router.learning.runtime import RouterLearning
from vllm_sr.router.learning.settings import LearningSettings
from vllm_sr.router.learning.state import LearningState
from vllm_sr.router.looper.dispatch import LooperDecisions
from vllm_sr.router.pipeline import ChatRun
from vllm_sr.router.plugins.replay import ReplayLog
from vllm_sr.router.plugins.response_cache import ResponseCache, build_store
from vllm_sr.router.plugins.shadow import ShadowDispatcher
from vllm_sr.router.plugins.tool_selection import ToolEmbeddings
from vllm_sr.router.preview_identity import check_expected
from vllm_sr.router.preview_limits import PreviewGate
from vllm_sr.router.route import AuthzOptions, Exchange, Router, RouterStats
from vllm_sr.router.selection.decide import selection_inventory

__all__ = [
    "H_ALGORITHM",
    "H_CONFIDENCE",
    "H_DEBUG",
    "H_DECISION",
    "H_FALLBACK",
    "H_MODEL",
    "H_REASONING",
    "H_RECIPE",
    "H_SIGNALS",
    "H_UNKNOWN",
    "ChatRouter",
    "ModelNotAvailable",
    "answer_headers",
    "build_chat_router",
    "engine_mode_chat",
    "error_response",
    "is_debug",
    "parse_chat",
]

if TYPE_CHECKING:
    from vllm_sr.config.router_replay import RouterReplay
    from vllm_sr.config.schema import GlobalSection
    from vllm_sr.router.signal_dispatch import SignalDispatch

log = logging.getLogger("vllm_sr.router.chat")

DEFAULT_EVAL_MODEL = "vllm-sr/auto"  # upstream's eval reads an empty model as this alias


class ChatRouter:
    """Router mode for one config generation: its recipes' routers, the decisions' plugins,
    the backends; the HTTP handlers that run a request's stages (vllm_sr/router/pipeline.py)."""

    def __init__(
        self,
        router: Router,
        auto_model_names: list[str],
        recipes: Mapping[str, Router] | None = None,
        entrypoints: Mapping[str, str] | None = None,
        *,
        cache: ResponseCache | None = None,
        authz: AuthzOptions | None = None,
        replay: ReplayLog | None = None,
        tool_embeddings: ToolEmbeddings | None = None,
        learning: RouterLearning | None = None,
        global_: GlobalSection | None = None,
    ) -> None:
        self.router = router  # the default recipe's
        self.recipes: dict[str, Router] = {DEFAULT_RECIPE: router, **(recipes or {})}
        self.entrypoints = dict(entrypoints or {})  # entrypoint model name -> recipe
        self.backends = router.backends
        self.stats: RouterStats = router.stats
        self.upstream = Upstream(router.backends, router.providers, router.stats)
        self.auto_model_names = list(auto_model_names)
        self.model_names = [m.name for m in router.providers.models]
        self.provider_models = {m.name: m for m in router.providers.models}
        self.cache = cache
        self.authz = authz or AuthzOptions()
        self.replay = replay if replay is not None else ReplayLog()
        self.replay_enabled = False
        self.config_hash: str | None = None  # the served config's (router/preview_identity.py)
        self.preview_gate = PreviewGate.of(global_)
        self.tool_embeddings = tool_embeddings
        self.learning = learning if learning is not None else RouterLearning(LearningSettings())
        # (recipe, decision) -> the decision and its plugins
        self.decisions = {
            (name, d.name): d for name, r in self.recipes.items() for d in r.routing.decisions
        }
        # (a recipe's v0.4 data_policy.replay: false turns its decisions' router_replay off)
        self.plugins = {
            (r, n): decision_plugins(d.plugins, replay_allowed(self.recipes[r].routing))
            for (r, n), d in self.decisions.items()
        }
        # recipe -> the decisions whose looper vllm-sr runs (vllm_sr/router/looper); recipes
        # with none are left out, so their chats never enter the looper
        self.loopers = {
            name: loopers
            for name, r in self.recipes.items()
            if (loopers := LooperDecisions(r.routing, global_, r.providers)).looping
        }
        # shadow_dispatch's copies; their counters are the router's stats, kept on reload
        self.shadow = ShadowDispatcher(self.backends, router.stats.shadow)

    def routes(self) -> dict[str, dict[str, Handler]]:
        return {
            "/v1/chat/completions": {"POST": self.handle_chat},
            "/v1/models": {"GET": self.handle_models},
            "/api/v1/eval": {"POST": self.handle_eval},
            route_preview.PREVIEW_PATH: {"POST": self.handle_eval},
        }

    async def handle_chat(
        self, request: Request, rewrite: StreamRewrite | None = None
    ) -> Response | StreamResponse:
        """A chat completion through every stage (vllm_sr/router/pipeline.py); ``rewrite``
        turns a streamed backend answer into another as it goes out (the Responses API,
        vllm_sr/router/responses, which translates the other answers itself). Counted in
        flight for the signal processes' dispatch (a hand-off pays only when other chats are
        in the router: ``SignalDispatch.takes``)."""
        run = ChatRun(request, self.backends.clock.monotonic(), rewrite)
        dispatch = self.router.signal_step.dispatch
        if dispatch is None:
            return await pipeline.run_chat(self, run)
        with dispatch.in_flight():
            return await pipeline.run_chat(self, run)

    def default_eval_model(self) -> str:
        """What an eval without ``model`` asks for: upstream's ``vllm-sr/auto``, or, when the
        config's aliases leave it out, the first alias (none: ``vllm-sr/auto``, refused)."""
        if DEFAULT_EVAL_MODEL in self.auto_model_names or not self.auto_model_names:
            return DEFAULT_EVAL_MODEL
        return self.auto_model_names[0]

    async def handle_eval(self, request: Request) -> Response:
        """Upstream's routing preview on both its paths: ``/api/v1/eval`` (3d48f8c9's body)
        and ``/api/v1/routing/preview`` (v0.4's strict envelope, vllm_sr/router/preview.py);
        one answer; its own error document (code, message, timestamp)."""
        try:
            if request.error is not None:
                raise route_eval.EvalError("INVALID_INPUT", request.error.message)
            strict = request.path == route_preview.PREVIEW_PATH
            check_expected(request.headers, self.config_hash)
            if strict:
                payload = route_preview.parse_body(request.body)
                route_preview.parse_preview(payload)
            else:
                payload = route_eval.parse_payload(request.body)
            model = payload.get("model") or self.default_eval_model()
            recipe = pipeline.recipe_of(self, model) if isinstance(model, str) else None
            if recipe is None or not isinstance(model, str):
                raise route_eval.EvalError(
                    "INVALID_ROUTING_MODEL",
                    f"model {json.dumps(model)} is not an auto model name or entrypoint; "
                    f"accepted: {', '.join([*self.auto_model_names, *self.entrypoints])}",
                )
            options = payload.get("options") or {}
            if not isinstance(options, dict):
                raise route_eval.EvalError(
                    "INVALID_INPUT",
                    f"field options: got {json.dumps(options)}; accepted: an object "
                    '(e.g. {"trace": true})',
                )
            want_trace = "trace=true" in request.query.split("&") or bool(options.get("trace"))
            doc = await self.preview_gate.run(
                self.evaluate(
                    payload, model=model, recipe=recipe, want_trace=want_trace, request=request
                )
            )
            doc["config_hash"] = self.config_hash
            status = 503 if "decision_error" in doc else 200  # v0.4 on_unknown: fail_request
            return Response(json.dumps(doc).encode(), status=status)
        except route_eval.EvalError as exc:
            return Response(route_eval.error_body(exc), status=exc.http_status)
        except VllmSrError as exc:
            err = route_eval.EvalError("INVALID_INPUT", exc.message)
            if exc.http_status >= 500:
                err = route_eval.EvalError("CLASSIFICATION_ERROR", exc.message)
                err.http_status = 500
            return Response(route_eval.error_body(err), status=err.http_status)

    async def evaluate(
        self,
        payload: JsonObject,
        *,
        model: str,
        recipe: str,
        want_trace: bool,
        request: Request | None = None,
    ) -> JsonObject:
        """The eval document of ``payload`` (an eval body, already checked): the eval's
        stages over the recipe (vllm_sr/router/pipeline.py ``run_eval``), then the document
        (vllm_sr/router/eval.py)."""
        request = request or Request("POST", "/api/v1/eval", "", {}, b"")
        run = ChatRun(request, self.backends.clock.monotonic())
        await pipeline.run_eval(self, run, payload, recipe)
        return route_eval.document(run, model=model, want_trace=want_trace)

    def models_data(self) -> list[JsonObject]:
        """The /v1/models entries of Router mode: the auto names, then the models."""
        data: list[JsonObject] = [
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

    def inventory(self) -> JsonObject:
        """For the inventory document (key "router"): backends, decision counters, what the
        selectors observe per model, the response cache's and (when on) Router Learning's."""
        doc: JsonObject = {"backends": self.backends.inventory(), "stats": self.stats.to_json()}
        doc["selection"] = selection_inventory(self.backends)
        if self.cache is not None:
            usage = self.cache.store.usage()
            doc["cache"] = {
                "store": self.cache.store.kind,
                "entries": None if usage is None else usage[0],
                "bytes": None if usage is None else usage[1],
                **self.cache.stats.to_json(),
            }
        if self.learning.enabled:
            doc["learning"] = self.learning.inventory()
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
    replay: ReplayLog | None = None,
    learning_state: LearningState | None = None,
    signal_dispatch: SignalDispatch | None = None,
) -> ChatRouter:
    """The Router-mode handlers for one config generation. Pass the previous generation's
    ``stats``, ``replay`` and ``learning_state`` to keep the counters, replay records and
    Router Learning's conversations and experience across a reload; ``signal_dispatch``:
    the signal processes the CPU-bound signals go to (None: they run on the loop). (No
    ``replay``: one for
    ``global.services.router_replay``, started on its first use);
    ``backends`` is started by the caller (``await backends.start()``) and closed when the
    generation is replaced. ``cache``: a
    response cache to keep (a reload that keeps the store), True to build one from
    ``global.stores.response_cache``, None/False for none."""
    backends = backends if backends is not None else BackendSet(providers)
    stats = stats if stats is not None else RouterStats()
    if cache is True:
        store, ttl = build_store(global_)
        cache = (
            ResponseCache(
                store, exchange=exchange, default_ttl_s=ttl, signal_timeout_ms=signal_timeout_ms
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
            signal_dispatch=signal_dispatch,
        )

    others = {
        name: router_for(name, r) for name, r in (recipes or {}).items() if name != DEFAULT_RECIPE
    }
    if replay is None:
        replay = ReplayLog.from_config(_replay_conf(global_))
    chat = ChatRouter(
        router_for(DEFAULT_RECIPE, routing),
        auto_model_names,
        others,
        entrypoints,
        cache=cache,
        authz=authz,
        replay=replay,
        tool_embeddings=ToolEmbeddings(decision_deployment, exchange, signal_timeout_ms),
        learning=RouterLearning(
            LearningSettings.from_config(global_.router.learning if global_ else None),
            learning_state,
            global_.router.learning.state_store if global_ else None,
        ),
        global_=global_,
    )
    conf = _replay_conf(global_)
    chat.replay_enabled = bool(conf is not None and conf.enabled)
    return chat


def _replay_conf(global_: GlobalSection | None) -> RouterReplay | None:
    """``global.services.router_replay`` (None without a global section)."""
    return global_.services.router_replay if global_ is not None else None


async def engine_mode_chat(request: Request) -> Response:
    """``/v1/chat/completions`` in Engine mode (-e): a typed 404 that says so."""
    return error_response(EngineMode.at(request.path))
