"""``POST /v1/chat/completions`` and ``GET /v1/models`` of Router mode (``vllm_sr.httpserver``
handlers).

The flow: ``model`` is an auto name -> route (signals, decision, model); a providers model
name -> that model's backend, no signals; anything else -> 404 ``model_not_found`` naming the
known models. The chosen model's backend gets the body with only ``model`` rewritten; its
answer comes back as it is (SSE streamed through). Answer headers say what was chosen:

- ``x-vsr-selected-model``: the providers model name;
- ``x-vsr-selected-decision``: the decision (absent when none matched or the model was named);
- ``x-vsr-matched-signals``: the matched signals as ``type:name``, comma-separated;
- ``x-vsr-routing-fallback``: present when the default model was used because routing could
  not decide (``signals:<error code>``: the signals' deployment was down, full, slow or
  answered badly; ``models_unhealthy``: the decision's models have no healthy backend).

Errors are ``{"error": {"code", "message", "retryable"}}``, which OpenAI clients read.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from vllm_sr import httpserver
from vllm_sr.config.routing import Providers, Routing
from vllm_sr.errors import (
    InvalidRequest,
    ModelNotFound,
    NotFound,
    Overloaded,
    Unavailable,
    VllmSrError,
)
from vllm_sr.httpserver import Handler, Request, Response, StreamResponse
from vllm_sr.router.backends import BackendSet
from vllm_sr.router.questions import request_text
from vllm_sr.router.route import Exchange, Router, RouteResult, RouterStats

log = logging.getLogger("vllm_sr.router.chat")

H_DECISION = "x-vsr-selected-decision"
H_MODEL = "x-vsr-selected-model"
H_SIGNALS = "x-vsr-matched-signals"
H_FALLBACK = "x-vsr-routing-fallback"


def error_response(exc: VllmSrError) -> Response:
    """The server's JSON error answer, with Retry-After in whole seconds when retrying helps."""
    response = httpserver.error_response(exc)
    if isinstance(exc, Overloaded | Unavailable):
        retry = getattr(exc, "retry_after_s", None) or exc.details.get("retry_after_s") or 1.0
        response.headers["Retry-After"] = str(max(1, math.ceil(float(retry))))
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


def answer_headers(result: RouteResult) -> dict[str, str]:
    headers = {H_MODEL: result.model, H_SIGNALS: ",".join(result.matched_signals)}
    if result.decision is not None:
        headers[H_DECISION] = result.decision
    if result.fallback is not None:
        headers[H_FALLBACK] = result.fallback
    return headers


class EngineMode(NotFound):
    code = "engine_mode"


class ChatRouter:
    """Router mode's HTTP face for one config generation."""

    def __init__(self, router: Router, auto_model_names: list[str]) -> None:
        self.router = router
        self.backends = router.backends
        self.auto_model_names = list(auto_model_names)
        self.model_names = [m.name for m in router.providers.models]

    @property
    def stats(self) -> RouterStats:
        return self.router.stats

    def routes(self) -> dict[str, dict[str, Handler]]:
        return {
            "/v1/chat/completions": {"POST": self.handle_chat},
            "/v1/models": {"GET": self.handle_models},
        }

    async def handle_chat(self, request: Request) -> Response | StreamResponse:
        try:
            if request.error is not None:
                raise request.error
            body = parse_chat(request.body)
            result = await self.resolve(body)
            backend = self.backends.pick(result.model)
            return await self.backends.proxy(backend, body, request, answer_headers(result))
        except VllmSrError as exc:
            return error_response(exc)

    async def resolve(self, body: dict[str, Any]) -> RouteResult:
        model = body["model"]
        if model in self.auto_model_names:
            return await self.router.route(request_text(body.get("messages")))
        if model in self.backends.models:
            self.stats.direct[model] += 1
            return RouteResult(model)
        raise ModelNotFound(
            f"model {model!r} is not known; accepted: an auto name "
            f"({', '.join(self.auto_model_names)}) or a model "
            f"({', '.join(self.model_names)})",
            model=model,
        )

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
        """For the inventory document (key "router"): backends and decision counters."""
        return {"backends": self.backends.inventory(), "stats": self.stats.to_json()}


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
) -> ChatRouter:
    """The Router-mode handlers for one config generation. Pass the previous generation's
    ``stats`` to keep the counters across a reload; ``backends`` is started by the caller
    (``await backends.start()``) and closed when the generation is replaced."""
    router = Router(
        providers,
        routing,
        exchange=exchange,
        backends=backends if backends is not None else BackendSet(providers),
        decision_deployment=decision_deployment,
        signal_timeout_ms=signal_timeout_ms,
        stats=stats,
    )
    return ChatRouter(router, auto_model_names)


async def engine_mode_chat(request: Request) -> Response:
    """``/v1/chat/completions`` in Engine mode (-e): a typed 404 that says so."""
    return error_response(
        EngineMode(
            "chat completions are not served: the service runs in Engine mode (serve -e); "
            "accepted: the native surfaces /v1/embeddings, /v1/classify, /v1/bundle, or "
            "restart without -e for Router mode"
        )
    )
