"""The decision plugins and the backend fallback around a routed chat (the part of
``ChatRouter.handle_chat`` after routing), kept apart from chat.py's HTTP surface: upstream's
order is ``fast_response``, cache lookup, then reasoning, ``system_prompt``,
``request_params`` and ``header_mutation`` on the request to the backend (with fallback before
the first byte, vllm_sr/router/fallback.py), then the cache write."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from vllm_sr import wire
from vllm_sr.config.routing_plugins import DecisionPlugins
from vllm_sr.errors import Unavailable
from vllm_sr.httpserver import Request, Response, StreamResponse
from vllm_sr.router import fallback
from vllm_sr.router.answers import (
    H_ALGORITHM,
    H_DECISION,
    H_MODEL,
    H_RECIPE,
    answer_headers,
    error_response,
)
from vllm_sr.router.backend import Backend
from vllm_sr.router.backend_proxy import AttemptFailed, StreamRewrite
from vllm_sr.router.backends import BackendSet
from vllm_sr.router.cache import embedding as cache_embedding
from vllm_sr.router.cache.answer import AnswerRecorder, replay_sse
from vllm_sr.router.plugins import shapers
from vllm_sr.router.plugins.fast_response import H_FAST, fast_body
from vllm_sr.router.plugins.replay import H_REPLAY_ID, ReplayLog, ReplayTap, TeeTap, effective
from vllm_sr.router.plugins.response_cache import CachePlan, ResponseCache
from vllm_sr.router.plugins.tool_selection import ToolEmbeddings, apply_tool_selection
from vllm_sr.router.reasoning import apply_reasoning
from vllm_sr.router.replay.session import session_fields
from vllm_sr.router.route import AuthzOptions, Router, RouteResult, RouterStats

if TYPE_CHECKING:
    from vllm_sr.config.routing import Decision, ProviderModel


H_CACHE_HIT = "x-vsr-cache-hit"
H_CACHE_SIMILARITY = "x-vsr-cache-similarity"
H_RESPONSE_PATH = "x-vsr-response-path"
NO_PLUGINS = DecisionPlugins()


class ChatPlugins:
    """Mixed into ChatRouter, which sets these."""

    router: Router
    backends: BackendSet
    provider_models: dict[str, ProviderModel]
    plugins: dict[tuple[str, str], DecisionPlugins]
    decisions: dict[tuple[str, str], Decision]
    cache: ResponseCache | None
    authz: AuthzOptions
    replay: ReplayLog
    replay_enabled: bool  # global.services.router_replay.enabled: each decision's default
    tool_embeddings: ToolEmbeddings | None

    @property
    def stats(self) -> RouterStats:
        return self.router.stats

    def _deadline(self, request: Request) -> float | None:
        ms = wire.deadline_ms(request.headers.get(wire.DEADLINE_KEY))
        return None if ms is None else self.backends.clock.monotonic() + ms / 1000.0

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
        replay: Replay,
        rewrite: StreamRewrite | None = None,
        learning_headers: Mapping[str, str] | None = None,
    ) -> tuple[Response | StreamResponse, str, list[tuple[str, str]]]:
        """The chat to its model's backend, retried on the model's other backends and then
        falling back to other models before the first byte (vllm_sr/router/fallback.py);
        ``rewrite`` turns a streamed answer into another (the Responses API's events).
        -> (the answer, the model that answered, the models that failed with their reasons)."""
        order = fallback.candidates(result, self.router.default_model, self.backends.healthy)
        attempts = fallback.Attempts(order, self.backends, deadline)
        set_headers, drop_headers = (
            shapers.header_changes(plugins.header_mutation)
            if plugins.header_mutation is not None
            else ({}, [])
        )
        while (step := attempts.next()) is not None:
            i, model, ref, backend = step
            attempt = result if i == 0 else dataclasses.replace(result, model=model, model_ref=ref)
            outgoing = self.outgoing_body(body, attempt, backend, plugins)
            headers = answer_headers(attempt, debug=debug)
            headers.update(replay.headers)
            headers.update(learning_headers or {})
            headers.update(attempts.headers())
            try:
                answer = await self.backends.proxy(
                    backend,
                    outgoing,
                    request,
                    headers,
                    upstream_model=getattr(ref, "lora_name", None),
                    early_failure=attempts.more_after(backend),
                    first_byte_timeout_s=attempts.remaining(),
                    tap=TeeTap(recorder if i == 0 else None, replay.tap),
                    extra_headers=set_headers,
                    drop_headers=drop_headers,
                    rewrite=rewrite,
                )
                return answer, model, attempts.failed
            except AttemptFailed as exc:
                if attempts.record(backend, exc) == "fallback":
                    self.stats.backend_fallbacks[(model, exc.reason)] += 1
        last = attempts.last
        assert last is not None
        if not attempts.fell_back_from_last:
            # the last model's own failure: its answer, as without retries
            if last.answer is None:
                raise last.error or Unavailable("no backend answered")
            return last.answer, attempts.model, attempts.failed
        answer = last.answer or error_response(last.error or Unavailable("no backend answered"))
        answer.headers.update(attempts.headers())
        return answer, attempts.failed[-1][0], attempts.failed

    async def select_tools(
        self,
        body: dict[str, Any],
        plugins: DecisionPlugins,
        query: cache_embedding.QueryEmbedding,
    ) -> dict[str, Any]:
        """``tool_selection`` (filter mode) after the ``tools`` policy; the body as it was
        when the decision has none."""
        if plugins.tool_selection is None or self.tool_embeddings is None:
            return body
        shaped = shapers.apply_tools(body, plugins.tools) if plugins.tools is not None else body
        return await apply_tool_selection(
            shaped, plugins.tool_selection, query, self.tool_embeddings
        )

    def outgoing_body(
        self,
        body: dict[str, Any],
        result: RouteResult,
        backend: Backend,
        plugins: DecisionPlugins = NO_PLUGINS,
    ) -> dict[str, Any]:
        """For an auto-routed chat whose decision matched: the decision's ``tools`` policy,
        upstream's reasoning fields (a decision without modelRefs turns reasoning off on the
        default model), then its ``system_prompt`` and ``request_params``; a named model, or
        a chat no decision matched, goes as the caller wrote it."""
        if result.decision is None:
            return body
        if plugins.tools is not None:
            body = shapers.apply_tools(body, plugins.tools)
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


class Replay:
    """One chat's router_replay work: on when the matched decision's plugin is enabled; the
    id goes out as ``x-vsr-replay-id``; :meth:`done` records the answer and returns it."""

    def __init__(
        self,
        chat: ChatPlugins,
        plugins: DecisionPlugins,
        result: RouteResult,
        body: Mapping[str, Any],
        raw: bytes,
        started: float,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.chat, self.result, self.raw, self.started = chat, result, raw, started
        self.stream = body.get("stream") is True
        self.original_model = body.get("model") if isinstance(body.get("model"), str) else None
        routed = result.routed and result.decision is not None
        self.conf = effective(plugins.router_replay, chat.replay_enabled) if routed else None
        self.id = chat.replay.new_id() if self.conf is not None else None
        self.headers = {H_REPLAY_ID: self.id} if self.id is not None else {}
        self.tap = ReplayTap(self.conf.max_body_bytes) if self.conf is not None else None
        self.session = session_fields(body, headers or {}) if self.conf is not None else {}

    async def done(
        self,
        answer: Response | StreamResponse,
        path: str,
        answered_by: str | None,
        failed: list[tuple[str, str]] | None = None,
    ) -> Response | StreamResponse:
        if self.conf is None or self.id is None or self.result.decision is None:
            return answer
        answer.headers.update(self.headers)  # a streamed answer carried it already
        tap = self.tap
        tapped = tap if path == "upstream" and tap is not None and tap.status is not None else None
        await self.chat.replay.record(
            self.conf,
            replay_id=self.id,
            decision=self.result.decision,
            recipe=self.result.recipe,
            original_model=self.original_model,
            selected_model=self.result.model,
            answered_by=answered_by,
            matched_signals=self.result.matched_signals,
            body=self.raw,
            stream=self.stream,
            status=answer.status,
            latency_ms=(self.chat.backends.clock.monotonic() - self.started) * 1000.0,
            path=path,
            response=tapped,
            fallbacks=failed,
            response_body=answer.body if isinstance(answer, Response) else None,
            session=self.session,
        )
        return answer
