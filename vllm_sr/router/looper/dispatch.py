"""Running a looper decision inside a chat: the decisions whose looper vllm-sr runs, and the
internal calls through the chat path's own ``forward`` (vllm_sr/router/fallback.py: the
model's backends, retries, outlier ejection, then the chat's fallback to the default model),
never through the response cache nor the replay log. Upstream sends them to
``global.integrations.looper.endpoint`` (its own proxy); vllm-sr is that proxy,
so the endpoint only switches loopers on."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from vllm_sr.config.routing_looper import ConfidenceSettings
from vllm_sr.config.routing_support import looper_endpoint_of, looper_would_run
from vllm_sr.errors import Unavailable
from vllm_sr.httpserver import Response
from vllm_sr.router.answers import answer_headers
from vllm_sr.router.fallback import Sending, forward
from vllm_sr.router.looper.confidence import ordered, parse_size
from vllm_sr.router.looper.runner import LoopResult, run_confidence

if TYPE_CHECKING:
    from vllm_sr.config.routing import Providers, Routing
    from vllm_sr.config.routing_plugins import DecisionPlugins
    from vllm_sr.httpserver import Request
    from vllm_sr.router.chat import ChatRouter
    from vllm_sr.router.route import RouteResult, RouterStats


class LooperDecisions:
    """Per config generation: the decisions whose looper vllm-sr runs (a looper endpoint is
    set and upstream would run it), with their settings, and the modelCards' sizes and the
    providers' prices the escalation orders read."""

    def __init__(self, routing: Routing, global_: Any, providers: Providers) -> None:
        endpoint = looper_endpoint_of(global_)
        self.confidence = {
            d.name: ConfidenceSettings.from_block(d.algorithm.confidence)
            for d in routing.decisions
            if d.algorithm is not None
            and d.algorithm.type == "confidence"
            and looper_would_run(d, endpoint)
        }
        self.sizes = {c.name: parse_size(c.param_size) for c in routing.model_cards}
        self.prices = {
            m.name: m.pricing.prompt_per_1m
            for m in providers.models
            if m.pricing is not None and m.pricing.configured
        }

    def settings(self, result: RouteResult) -> ConfidenceSettings | None:
        if not result.routed or result.decision is None:
            return None
        return self.confidence.get(result.decision)


async def run_looper(
    chat: ChatRouter,
    loopers: LooperDecisions,
    settings: ConfidenceSettings,
    result: RouteResult,
    plugins: DecisionPlugins,
    body: dict[str, Any],
    request: Request,
    deadline: float | None,
    debug: bool,
    stats: RouterStats,
) -> tuple[Response, str]:
    """The confidence loop over the decision's modelRefs -> (the final answer, whole or as
    SSE as the caller asked, with the ``x-vsr-looper-*`` headers; the model that gave it)."""
    refs = {r.model: r for r in result.decision_refs}
    models = ordered(list(refs), settings, loopers.sizes.get, loopers.prices.get)

    async def call(model: str, inner: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        ref = refs.get(model)
        attempt = dataclasses.replace(
            result, model=model, model_ref=ref, decision_refs=(ref,) if ref else ()
        )
        sent = await forward(
            chat.upstream, inner, attempt, plugins, request, Sending(debug, deadline)
        )
        answer, answered_by = sent.answer, sent.answered_by
        stats.looper_calls[("confidence", answered_by)] += 1
        if not isinstance(answer, Response) or answer.status >= 400:
            status = getattr(answer, "status", "?")
            raise Unavailable(f"looper call to model {model!r} answered {status}", model=model)
        try:
            return answered_by, json.loads(answer.body)
        except ValueError as exc:
            raise Unavailable(f"looper call to model {model!r}: not JSON: {exc}") from None

    try:
        loop: LoopResult = await run_confidence(
            call, models, body, settings, chat.backends.clock.monotonic, deadline
        )
    except Exception:
        stats.looper_runs[("confidence", "error")] += 1
        raise
    stats.looper_runs[("confidence", "ok")] += 1
    stats.looper_iterations["confidence"] += loop.iterations
    assert loop.model is not None
    headers = answer_headers(dataclasses.replace(result, model=loop.model), debug=debug)
    headers.update(loop.headers())
    if body.get("stream") is True:
        return Response(loop.final_sse(), 200, "text/event-stream", headers), loop.model
    raw = json.dumps(loop.final_body(), ensure_ascii=False).encode()
    return Response(raw, 200, "application/json", headers), loop.model
