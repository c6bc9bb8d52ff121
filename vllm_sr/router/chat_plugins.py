"""The matched decision's plugins as stages of a chat (vllm_sr/router/pipeline.py runs them in
upstream's order; :func:`on_request` before the backend, :func:`on_answer` after it):
``fast_response``; a looper decision; the response cache's lookup and write (the write under
the decision's retention directive, set on the run: vllm_sr/router/retention.py); ``tools`` with
``tool_selection``, then ``masking`` (vllm_sr/router/plugins/masking.py), before the backend;
``router_replay``'s record of the answer (none where the recipe's v0.4 ``data_policy.replay``
is false: ``decision_plugins`` turns the plugin off). ``shadow_dispatch``'s copy is submitted
by the backend stage once the primary answer started (vllm_sr/router/pipeline.py). What shapes
each backend attempt's body (reasoning, ``system_prompt``, ``request_params``,
``header_mutation``) is vllm_sr/router/outgoing.py. Each stage is a function over the chat's
:class:`~vllm_sr.router.pipeline.ChatRun` and records its effect in ``run.effects``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from vllm_sr.config.routing_plugins import DecisionPlugins
from vllm_sr.httpserver import Response, StreamResponse
from vllm_sr.jsontypes import JsonObject
from vllm_sr.router import retention
from vllm_sr.router.answers import H_ALGORITHM, H_DECISION, H_MODEL, H_RECIPE
from vllm_sr.router.cache.answer import AnswerRecorder, replay_sse
from vllm_sr.router.looper.dispatch import LooperDecisions, run_looper
from vllm_sr.router.outgoing import NO_PLUGINS
from vllm_sr.router.plugins import shapers
from vllm_sr.router.plugins.fast_response import H_FAST, fast_body
from vllm_sr.router.plugins.masking import apply_masking
from vllm_sr.router.plugins.replay import H_REPLAY_ID, ReplayTap, effective
from vllm_sr.router.plugins.tool_selection import apply_tool_selection
from vllm_sr.router.replay.session import session_fields
from vllm_sr.router.route import RouteResult

if TYPE_CHECKING:
    from vllm_sr.config.routing import Retention
    from vllm_sr.router.chat import ChatRouter
    from vllm_sr.router.pipeline import ChatRun

H_CACHE_HIT = "x-vsr-cache-hit"
H_CACHE_SIMILARITY = "x-vsr-cache-similarity"
H_RESPONSE_PATH = "x-vsr-response-path"

__all__ = [
    "H_CACHE_HIT",
    "H_CACHE_SIMILARITY",
    "H_RESPONSE_PATH",
    "NO_PLUGINS",
    "Replay",
    "on_answer",
    "on_request",
]


async def on_request(chat: ChatRouter, run: ChatRun) -> Response | JsonObject:
    """The request's plugins in upstream's order (steps 5-6): the decision's plugins and its
    replay are set on the run; then ``fast_response``; a looper decision (vllm_sr/router/looper:
    its calls go through ``forward`` themselves); the cache lookup; ``tools`` /
    ``tool_selection`` and ``masking`` (:func:`backend_body`). -> an answer that ends the chat
    here, or the body for the backend. Raises MaskingFailed (503) when masking's detector
    fails: nothing unmasked goes out."""
    result = run.result
    assert result is not None  # routed before the plugins run
    run.plugins = plugins_of(chat, result)
    run.retention = retention_of(chat, result)
    run.replay = Replay(chat, run)
    fast = fast_response(run)
    if fast is not None:
        run.path = "fast_response"
        return fast
    loopers = chat.loopers.get(result.recipe)
    looping = loopers.settings(result) if loopers is not None else None
    workers = looper_workers(chat, run, loopers) if looping is not None else None
    if loopers is not None and looping is not None and workers is not None:
        # never cached; replayed once
        body = await backend_body(chat, run)
        final, model = await run_looper(
            chat,
            loopers,
            looping,
            result,
            workers,
            run.plugins,
            body,
            run.request,
            run.deadline,
            run.debug,
            chat.stats,
        )
        run.path, run.answered_by = "looper", model
        run.effects.append("looper")
        return final
    if run.plugins.response_cache is not None:  # (none: no coroutine to run)
        cached = await cache_lookup(chat, run)
        if cached is not None:
            run.path, run.answered_by = "cache", result.model
            return cached
    return await backend_body(chat, run)


async def on_answer(
    chat: ChatRouter, run: ChatRun, answer: Response | StreamResponse
) -> Response | StreamResponse:
    """The answer's plugins (step 8): the cache write of the chosen model's own answer (one
    from a fallback model is not filed under the chosen model), then the replay record."""
    result = run.result
    assert result is not None
    if run.path == "upstream" and run.recorder is not None and run.answered_by == result.model:
        await cache_write(chat, run, run.recorder)
    if run.replay is None or run.replay.conf is None:  # nothing to record: no coroutine
        return answer
    return await run.replay.done(answer, run)


def looper_workers(
    chat: ChatRouter, run: ChatRun, loopers: LooperDecisions | None
) -> list[str] | None:
    """The models the matched looper decision runs over, as the recipe's router admits
    candidates for this chat (health and ``candidate_requirements``); None: no looper."""
    router, result = run.router, run.result
    if loopers is None or router is None or run.view is None or result is None:
        return None
    usable = router.candidates.admit(router.candidates.needs(run.view), chat.backends.healthy)
    return loopers.workers(result, usable)


def plugins_of(chat: ChatRouter, result: RouteResult) -> DecisionPlugins:
    """The matched decision's plugins (none for a named model or no decision)."""
    if not result.routed or result.decision is None:
        return NO_PLUGINS
    return chat.plugins.get((result.recipe, result.decision), NO_PLUGINS)


def retention_of(chat: ChatRouter, result: RouteResult) -> Retention | None:
    """The matched decision's retention directive (none for a named model or no decision)."""
    if not result.routed or result.decision is None:
        return None
    decision = chat.decisions.get((result.recipe, result.decision))
    return retention.directive(decision.emits) if decision is not None else None


def fast_response(run: ChatRun) -> Response | None:
    """``fast_response``: the decision's canned answer (whole or as SSE), no backend."""
    plugin = run.plugins.fast_response
    if plugin is None:
        return None
    result = run.result
    assert result is not None  # routed before the plugins run
    raw, content_type = fast_body(plugin.message, stream=run.stream)
    run.effects.append("fast_response")
    headers = {
        H_FAST: "true",
        H_DECISION: result.decision or "",
        H_RECIPE: result.recipe,
        H_ALGORITHM: "fast_response",
        H_RESPONSE_PATH: "fast_response",
    }
    return Response(raw, 200, content_type, headers)


async def cache_lookup(chat: ChatRouter, run: ChatRun) -> Response | None:
    """The response cache (exact, then semantic): the stored answer on a hit; on a miss the
    plan stays on the run for the write after the backend answered."""
    conf = run.plugins.response_cache
    result = run.result
    assert result is not None  # routed before the plugins run
    if chat.cache is None or conf is None or not conf.enabled or result.decision is None:
        return None
    if result.fallback is not None:
        return None  # routing could not decide: not the decision's answer
    assert run.query is not None
    plan = chat.cache.plan(
        conf,
        body=run.body,
        headers=run.request.headers,
        recipe=result.recipe,
        decision=chat.decisions[(result.recipe, result.decision)],
        selected_model=result.model,
        user_id_header=chat.authz.user_id_header,
        user_groups_header=chat.authz.user_groups_header,
        embedding=run.query,
        retention=run.retention,
    )
    run.cache_plan = plan
    if plan is None:
        return None
    hit = await chat.cache.lookup(plan)
    if hit is None:
        run.effects.append("cache:miss")
        return None
    run.effects.append(f"cache:{hit.tier}")
    headers = {
        H_CACHE_HIT: "true",
        H_DECISION: result.decision,
        H_RECIPE: result.recipe,
        H_MODEL: result.model,
        H_RESPONSE_PATH: "cache",
    }
    if run.debug:
        headers[H_CACHE_SIMILARITY] = f"{hit.similarity:.4f}"
    if run.stream:
        return Response(replay_sse(hit.doc), 200, "text/event-stream", headers)
    return Response(json.dumps(hit.doc, ensure_ascii=False).encode(), 200, headers=headers)


async def cache_write(chat: ChatRouter, run: ChatRun, recorder: AnswerRecorder) -> None:
    """The chosen model's answer into the cache under the lookup's plan."""
    if chat.cache is not None and run.cache_plan is not None:
        await chat.cache.write(run.cache_plan, recorder.document())
        run.effects.append("cache:write")


async def backend_body(chat: ChatRouter, run: ChatRun) -> JsonObject:
    """The body the backend (or a looper's calls) gets: :func:`select_tools`, then
    ``masking``'s placeholders for the detected PII (the run's own body stays as the caller
    wrote it: the cache key and the replay record read it)."""
    body = await select_tools(chat, run) if run.plugins.tool_selection is not None else run.body
    masking = run.plugins.masking
    if masking is None or not masking.enabled:
        return body
    masked = await apply_masking(body, masking)
    run.effects.append("masking")
    return masked


async def select_tools(chat: ChatRouter, run: ChatRun) -> JsonObject:
    """``tool_selection`` (filter mode) after the ``tools`` policy; the body as it was when
    the decision has none."""
    plugins = run.plugins
    if plugins.tool_selection is None or chat.tool_embeddings is None:
        return run.body
    assert run.query is not None
    shaped = shapers.apply_tools(run.body, plugins.tools) if plugins.tools is not None else run.body
    run.effects.append("tool_selection")
    out: JsonObject = await apply_tool_selection(
        shaped, plugins.tool_selection, run.query, chat.tool_embeddings
    )
    return out


class Replay:
    """One chat's router_replay work: on when the matched decision's plugin is enabled; the
    id goes out as ``x-vsr-replay-id``; :meth:`done` records the answer and returns it."""

    def __init__(self, chat: ChatRouter, run: ChatRun) -> None:
        result = run.result
        assert result is not None  # routed before the plugins run
        self.log, self.clock = chat.replay, chat.backends.clock
        routed = result.routed and result.decision is not None
        self.conf = effective(run.plugins.router_replay, chat.replay_enabled) if routed else None
        self.id = chat.replay.new_id() if self.conf is not None else None
        self.headers = {H_REPLAY_ID: self.id} if self.id is not None else {}
        self.tap = ReplayTap(self.conf.max_body_bytes) if self.conf is not None else None
        self.session = (
            session_fields(run.body, run.request.headers) if self.conf is not None else {}
        )

    async def done(
        self, answer: Response | StreamResponse, run: ChatRun
    ) -> Response | StreamResponse:
        result = run.result
        assert result is not None  # routed before the plugins run
        if self.conf is None or self.id is None or result.decision is None:
            return answer
        answer.headers.update(self.headers)  # a streamed answer carried it already
        run.effects.append("router_replay")
        tap = self.tap
        upstream = run.path == "upstream" and tap is not None and tap.status is not None
        model = run.body.get("model")
        await self.log.record(
            self.conf,
            replay_id=self.id,
            decision=result.decision,
            recipe=result.recipe,
            original_model=model if isinstance(model, str) else None,
            selected_model=result.model,
            answered_by=run.answered_by,
            matched_signals=result.matched_signals,
            body=run.request.body,
            stream=run.stream,
            status=answer.status,
            latency_ms=(self.clock.monotonic() - run.started) * 1000.0,
            path=run.path,
            response=tap if upstream else None,
            fallbacks=run.failed if run.path == "upstream" else None,
            response_body=answer.body if isinstance(answer, Response) else None,
            session=self.session,
        )
        return answer
