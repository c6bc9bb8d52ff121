"""Running a looper decision inside a chat: the decisions whose looper vllm-sr runs, and the
internal calls through the chat path's own ``forward`` (vllm_sr/router/fallback.py: the
model's backends, retries, outlier ejection, then the chat's fallback to the default model),
never through the response cache nor the replay log. Upstream sends them to
``global.integrations.looper.endpoint`` (its own proxy); vllm-sr is that proxy,
so the endpoint only switches loopers on.

A looper decision with no modelRefs (v0.4's built-in bundle leaves them to upstream's
``recipe builtin init``) runs over the provider models, in the providers' order, that are
healthy and meet ``routing.candidate_requirements`` for the chat (the filter the selection
applies to modelRefs: vllm_sr/router/selection/candidates.py); with fewer of them than its kind
needs (confidence, ratings: 2, the others 1) or than ``algorithm.minimum_candidates``, the chat
goes to the routed model (the default model) as a decision without a looper."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

from vllm_sr.config.looper_fanout_settings import (
    FusionSettings,
    RatingsSettings,
    RemomSettings,
    WorkflowsSettings,
)
from vllm_sr.config.routing_looper import ConfidenceSettings, least_workers, runs_unbound
from vllm_sr.config.routing_support import looper_endpoint_of, looper_would_run
from vllm_sr.errors import Unavailable
from vllm_sr.httpserver import Response
from vllm_sr.jsontypes import JsonObject
from vllm_sr.router.answers import answer_headers
from vllm_sr.router.fallback import Sending, forward
from vllm_sr.router.looper.confidence import ordered, parse_size, run_confidence
from vllm_sr.router.looper.fusion import run_fusion
from vllm_sr.router.looper.ratings import run_ratings
from vllm_sr.router.looper.remom import run_remom
from vllm_sr.router.looper.runner import LoopResult
from vllm_sr.router.looper.workflows import run_workflows

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from vllm_sr.config.routing import Routing
    from vllm_sr.config.routing_plugins import DecisionPlugins
    from vllm_sr.config.routing_providers import Providers
    from vllm_sr.config.schema import GlobalSection
    from vllm_sr.httpserver import Request
    from vllm_sr.router.chat import ChatRouter
    from vllm_sr.router.route import RouteResult, RouterStats

LooperSettings = (
    ConfidenceSettings | RatingsSettings | RemomSettings | FusionSettings | WorkflowsSettings
)
ALGORITHM_OF: dict[type, str] = {
    ConfidenceSettings: "confidence",
    RatingsSettings: "ratings",
    RemomSettings: "remom",
    FusionSettings: "fusion",
    WorkflowsSettings: "workflows",
}


class LooperDecisions:
    """Per config generation: the decisions whose looper vllm-sr runs (a looper endpoint is
    set and upstream would run it, or it has no modelRefs: :func:`runs_unbound`), with their
    settings, and the modelCards' sizes and the providers' prices the escalation orders
    read."""

    def __init__(
        self, routing: Routing, global_: GlobalSection | None, providers: Providers
    ) -> None:
        endpoint = looper_endpoint_of(global_)
        self.looping: dict[str, LooperSettings] = {}
        # an unbound decision -> the fewest admitted provider models it runs with
        self.unbound: dict[str, int] = {}
        self.models = [m.name for m in providers.models]  # the providers' order
        for d in routing.decisions:
            if d.algorithm is None:
                continue
            if runs_unbound(d, endpoint):
                self.unbound[d.name] = least_workers(d)
            elif not looper_would_run(d, endpoint):
                continue
            kind = d.algorithm.type
            block = getattr(d.algorithm, kind, None)
            if kind == "confidence":
                self.looping[d.name] = ConfidenceSettings.from_block(block)
            elif kind == "ratings":
                self.looping[d.name] = RatingsSettings.from_block(block)
            elif kind == "remom":
                self.looping[d.name] = RemomSettings.from_block(block)
            elif kind == "fusion":
                self.looping[d.name] = FusionSettings.from_block(block)
            elif kind == "workflows":
                self.looping[d.name] = WorkflowsSettings.from_block(block)
        self.sizes = {c.name: parse_size(c.param_size) for c in routing.model_cards}
        self.prices = {
            m.name: m.pricing.prompt_per_1m
            for m in providers.models
            if m.pricing is not None and m.pricing.configured
        }

    def settings(self, result: RouteResult) -> LooperSettings | None:
        if not result.routed or result.decision is None:
            return None
        return self.looping.get(result.decision)

    def workers(self, result: RouteResult, usable: Callable[[str], bool]) -> list[str] | None:
        """The models a looper decision runs over: its modelRefs' (in order; their health is
        the calls' own fallback; none for fusion with its own ``analysis_models``), or, for
        an unbound decision, the provider models ``usable`` admits (the chat's health and
        candidate requirements), in the providers' order; None when too few are admitted (no
        looper: the chat goes to the routed model)."""
        if result.decision not in self.unbound:
            return list(dict.fromkeys(r.model for r in result.decision_refs))
        admitted = [m for m in self.models if usable(m)]
        return admitted if len(admitted) >= self.unbound[result.decision] else None


async def run_looper(
    chat: ChatRouter,
    loopers: LooperDecisions,
    settings: LooperSettings,
    result: RouteResult,
    workers: Sequence[str],
    plugins: DecisionPlugins,
    body: JsonObject,
    request: Request,
    deadline: float | None,
    debug: bool,
    stats: RouterStats,
) -> tuple[Response, str]:
    """The decision's looper over ``workers`` (:meth:`LooperDecisions.workers`) -> (the final
    answer, whole or as SSE as the caller asked, with the ``x-vsr-looper-*`` headers; the
    model that gave it)."""
    refs = {r.model: r for r in result.decision_refs}
    algorithm = ALGORITHM_OF[type(settings)]

    async def call(model: str, inner: JsonObject) -> tuple[str, JsonObject]:
        ref = refs.get(model)
        attempt = dataclasses.replace(
            result, model=model, model_ref=ref, decision_refs=(ref,) if ref else ()
        )
        sent = await forward(
            chat.upstream, inner, attempt, plugins, request, Sending(debug, deadline)
        )
        answer, answered_by = sent.answer, sent.answered_by
        stats.looper_calls[(algorithm, answered_by)] += 1
        if not isinstance(answer, Response) or answer.status >= 400:
            status = getattr(answer, "status", "?")
            raise Unavailable(f"looper call to model {model!r} answered {status}", model=model)
        try:
            return answered_by, json.loads(answer.body)
        except ValueError as exc:
            raise Unavailable(f"looper call to model {model!r}: not JSON: {exc}") from None

    clock = chat.backends.clock.monotonic
    try:
        loop: LoopResult
        if isinstance(settings, ConfidenceSettings):
            models = ordered(list(workers), settings, loopers.sizes.get, loopers.prices.get)
            loop = await run_confidence(call, models, body, settings, clock, deadline)
        elif isinstance(settings, RatingsSettings):
            loop = await run_ratings(call, workers, body, settings, clock, deadline)
        elif isinstance(settings, RemomSettings):
            weighted = [(r.model, r.weight) for r in result.decision_refs]
            weighted = weighted or [(m, 0.0) for m in workers]  # unbound: unweighted
            loop = await run_remom(call, weighted, body, settings, clock, deadline)
        elif isinstance(settings, FusionSettings):
            loop = await run_fusion(call, workers, body, settings, clock, deadline)
        else:
            loop = await run_workflows(call, workers, body, settings, clock, deadline)
    except Exception:
        stats.looper_runs[(algorithm, "error")] += 1
        raise
    stats.looper_runs[(algorithm, "ok")] += 1
    stats.looper_iterations[algorithm] += loop.iterations
    assert loop.model is not None
    headers = answer_headers(dataclasses.replace(result, model=loop.model), debug=debug)
    headers.update(loop.headers())
    if body.get("stream") is True:
        return Response(loop.final_sse(), 200, "text/event-stream", headers), loop.model
    raw = json.dumps(loop.final_body(), ensure_ascii=False).encode()
    return Response(raw, 200, "application/json", headers), loop.model
