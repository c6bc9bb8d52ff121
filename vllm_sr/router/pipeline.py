"""One request through Router mode: :class:`ChatRun`, the per-request object, and the stages
over it in upstream's fixed order (docs/internals.md "A routed chat"; upstream's
``processor_req_body.go``):

1. :func:`parse`: the body, the request view, the caller's deadline and debug flag;
2. :func:`recipe_stage`: the request's ``model`` -> a recipe (auto name, entrypoint) or a
   concrete model (no signals, decisions or plugins; 400 when it names neither);
3. :func:`signals_stage`, :func:`decision_stage`, :func:`query_stage` (the text's
   embedding, routing's own answer when it has one), :func:`selection_stage` (the recipe's
   ``Router``: every signal's value, confidence or error; the matched decisions and the
   winner; the model); then :func:`learning_stage` (Router Learning may move the chat);
4. the decision's plugins (vllm_sr/router/chat_plugins.py): ``fast_response``; a looper
   decision (vllm_sr/router/looper); the response cache's lookup; ``tools`` and
   ``tool_selection``; ``masking``;
5. the backend (vllm_sr/router/fallback.py :func:`~vllm_sr.router.fallback.forward`, which
   shapes each attempt's body: reasoning, ``system_prompt``, ``request_params``,
   ``header_mutation``); once the primary answer started, ``shadow_dispatch``'s copy is
   queued (vllm_sr/router/plugins/shadow.py, never waited for); then the cache write (under
   the winner's retention directive: vllm_sr/router/retention.py) and the replay record.

Chat completions and the Responses API (which hands its translated body here) run
:func:`run_chat`; ``/api/v1/eval`` and ``/api/v1/routing/preview`` run :func:`run_eval`: the
same signal and decision stages over every declared signal, without authz, stopping before
the model is picked for real and before the backend (vllm_sr/router/eval.py answers from the
run). Each module is entered from here, top down: none of them calls back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm_sr import wire
from vllm_sr.config.recipes import DEFAULT_RECIPE
from vllm_sr.config.routing_plugins import DecisionPlugins
from vllm_sr.errors import VllmSrError
from vllm_sr.httpserver import Request, Response, StreamResponse, error_response
from vllm_sr.jsontypes import JsonObject
from vllm_sr.router import chat_plugins, retention
from vllm_sr.router.answers import ModelNotAvailable, is_debug, parse_chat
from vllm_sr.router.backend_proxy import StreamRewrite
from vllm_sr.router.cache.answer import AnswerRecorder
from vllm_sr.router.cache.embedding import QueryEmbedding
from vllm_sr.router.fallback import Attempt, Sending, forward
from vllm_sr.router.outgoing import NO_PLUGINS
from vllm_sr.router.request_view import RequestView
from vllm_sr.router.route import Router, RouteResult, SignalRun
from vllm_sr.router.rules import Match, Ranking

if TYPE_CHECKING:
    from vllm_sr.config.routing import Retention
    from vllm_sr.router.chat import ChatRouter
    from vllm_sr.router.chat_plugins import Replay
    from vllm_sr.router.learning.runtime import Turn
    from vllm_sr.router.plugins.response_cache import CachePlan


@dataclass(eq=False)
class ChatRun:
    """Everything one request has become, stage by stage (None: that stage has not run, or
    does not apply: a concrete model has no signals, an eval no backend)."""

    request: Request
    started: float  # the backends' clock when the request came in
    rewrite: StreamRewrite | None = None  # turns a streamed answer into another (Responses)
    body: JsonObject = field(default_factory=dict)
    view: RequestView | None = None
    deadline: float | None = None  # the caller's (X-Request-Timeout-Ms), a clock time
    debug: bool = False
    stream: bool = False
    recipe: str | None = None  # None: the request named a concrete model
    router: Router | None = None  # the recipe's
    # every signal's value, confidence or error (``SignalResult.unknown``) and timings
    signals: SignalRun | None = None
    matches: list[Match] = field(default_factory=list)  # matched decisions, the winner first
    ranking: Ranking | None = None  # eval's: every decision, on_unknown policies applied
    result: RouteResult | None = None  # the selection (decision, model, modelRef, why)
    learning: Turn | None = None  # Router Learning's turn, when it touched the chat
    query: QueryEmbedding | None = None  # the text's embedding (cache, tool_selection)
    plugins: DecisionPlugins = NO_PLUGINS
    retention: Retention | None = None  # the winner's retention directive (router/retention.py)
    effects: list[str] = field(default_factory=list)  # the plugins' effects, in order
    cache_plan: CachePlan | None = None
    recorder: AnswerRecorder | None = None  # the chosen model's answer, for the cache
    replay: Replay | None = None
    attempts: list[Attempt] = field(default_factory=list)  # the backend attempts, in order
    failed: list[tuple[str, str]] = field(default_factory=list)  # models fallen back from
    answered_by: str | None = None
    path: str = ""  # how it was answered: fast_response, looper, cache, upstream, error

    @property
    def winner(self) -> Match | None:
        return self.matches[0] if self.matches else None

    def routed(self) -> RouteResult:
        """The selection (raises when the routing stages have not run)."""
        if self.result is None:
            raise RuntimeError("the chat has not been routed")
        return self.result


# -- the stages ----------------------------------------------------------------------------


def parse(run: ChatRun, now: float) -> None:
    """The chat body (400 on a bad one), its view, the caller's deadline, debug and stream."""
    request = run.request
    if request.error is not None:
        raise request.error
    ms = wire.deadline_ms(request.headers.get(wire.DEADLINE_KEY))
    run.deadline = None if ms is None else now + ms / 1000.0
    run.body = parse_chat(request.body)
    run.view = RequestView.from_chat(run.body, request.headers)
    run.debug = is_debug(request.headers)
    run.stream = run.body.get("stream") is True


def recipe_of(chat: ChatRouter, model: str) -> str | None:
    """The recipe a request ``model`` selects: ``default`` for an auto name, an entrypoint's
    recipe for its names; None for a concrete model."""
    if model in chat.auto_model_names:
        return DEFAULT_RECIPE
    return chat.entrypoints.get(model)


def recipe_stage(chat: ChatRouter, run: ChatRun) -> None:
    """Upstream's step 3: an auto name or entrypoint -> its recipe's router; a configured
    model -> that model, unrouted; anything else -> 400 ``model "X" is not available``."""
    model = run.body.get("model")
    assert isinstance(model, str)  # parse() checked it
    run.recipe = recipe_of(chat, model)
    if run.recipe is not None:
        run.router = chat.recipes[run.recipe]
        return
    if model in chat.backends.models:
        chat.stats.direct[model] += 1
        run.result = RouteResult(model, routed=False)
        return
    raise ModelNotAvailable(
        f"model {json.dumps(model)} is not available; accepted: an auto name "
        f"({', '.join(chat.auto_model_names)}) or a model ({', '.join(chat.model_names)})",
        model=model,
    )


async def signals_stage(run: ChatRun, *, every: bool = False) -> None:
    """The recipe's signals on the view: those its decisions reference, or (``every``, the
    eval) every declared one without authz. A signal that could not be evaluated carries its
    error; an authz refusal raises (403)."""
    router, view = run.router, run.view
    assert router is not None and view is not None
    plan = router.eval_plan if every else router.plan
    run.signals = await router.signals(view, plan, authz=not every)


def decision_stage(run: ChatRun) -> None:
    """Every decision's rules over the signals: the matched ones, the winner first."""
    assert run.router is not None and run.signals is not None
    run.matches = run.router.winner(run.signals)


def eval_decision_stage(run: ChatRun) -> None:
    """Eval's decision stage: every decision with v0.4's on_unknown policies applied, never
    raising (an unresolved decision is reported: upstream answers 503 with the document)."""
    assert run.router is not None and run.signals is not None
    run.ranking = run.router.ranking(run.signals)
    run.matches = [] if run.ranking.unresolved else run.ranking.matches


async def selection_stage(run: ChatRun) -> None:
    """The winner's model (static or its selector, among healthy modelRefs; a selector reads
    the chat's text, headers, start and query embedding), or the default model saying why;
    counted in the router's stats."""
    assert run.router is not None and run.signals is not None and run.view is not None
    request = run.router.selection_request(run.view, run.started, run.query)
    run.result = await run.router.choose(run.signals, run.matches, request)


def query_stage(chat: ChatRouter, run: ChatRun) -> None:
    """The text's embedding for the cache and tool_selection: the decision deployment's
    routing answer when signals asked it (no exchange), else one exchange when first read."""
    deployment = chat.router.decision_deployment
    answer = run.signals.answers.get(deployment) if run.signals is not None else None
    text = run.view.text if run.view is not None else ""
    run.query = QueryEmbedding(deployment, text, answer=answer)


async def learning_stage(chat: ChatRouter, run: ChatRun) -> None:
    """Router Learning may move a routed chat to another model before the plugins run."""
    result = run.routed()
    if not chat.learning.enabled:  # the usual config: no coroutine to run
        return
    turn = await chat.learning.apply(
        run.router or chat.router, result, run.body, run.request.headers
    )
    if turn is not None:
        run.learning, run.result = turn, turn.result


async def backend_stage(
    chat: ChatRouter, run: ChatRun, body: JsonObject
) -> Response | StreamResponse:
    """``body`` to the chosen model through :func:`~vllm_sr.router.fallback.forward` (the
    chosen model's answer is recorded for the cache when it has a plan); once its answer
    started, the decision's ``shadow_dispatch`` copy of ``body`` is queued (the caller's
    answer never waits for it); Router Learning observes the outcome."""
    result, replay = run.routed(), run.replay
    run.recorder = AnswerRecorder() if run.cache_plan is not None else None
    headers = dict(replay.headers) if replay is not None else {}
    if run.learning is not None and run.debug:
        headers.update(run.learning.headers())
    if run.debug:
        headers.update(retention.debug_headers(run.retention))
    sent = chat.backends.clock.monotonic()
    done = await forward(
        chat.upstream,
        body,
        result,
        run.plugins,
        run.request,
        Sending(
            debug=run.debug,
            deadline=run.deadline,
            chosen_tap=run.recorder,
            tap=replay.tap if replay is not None else None,
            headers=headers,
            rewrite=run.rewrite,
            effects=run.effects,
        ),
    )
    run.attempts, run.failed, run.answered_by = done.attempts, done.failed, done.answered_by
    run.path = "upstream"
    latency = chat.backends.clock.monotonic() - sent
    chat.shadow.submit(result.recipe, result.decision, run.plugins, body)
    if run.learning is not None:  # (no turn: nothing to observe, no coroutine to run)
        status = done.answer.status
        await chat.learning.observe(run.learning, done.answered_by, status, done.failed, latency)
    return done.answer


# -- the sequences -------------------------------------------------------------------------


async def run_chat(chat: ChatRouter, run: ChatRun) -> Response | StreamResponse:
    """A chat completion, every stage in order; the answer (an error as an answer too)."""
    try:
        parse(run, run.started)
        recipe_stage(chat, run)
        if run.router is not None:
            await signals_stage(run)
            decision_stage(run)
            query_stage(chat, run)  # before selection: router_dc reads it
            await selection_stage(run)
    except VllmSrError as exc:
        return error_response(exc)
    if run.query is None:
        query_stage(chat, run)
    await learning_stage(chat, run)
    answer: Response | StreamResponse
    try:
        # the request's plugins: an answer of their own, or the body for the backend
        got = await chat_plugins.on_request(chat, run)
        answer = (
            got
            if isinstance(got, (Response, StreamResponse))
            else (await backend_stage(chat, run, got))
        )
    except VllmSrError as exc:
        answer, run.path, run.answered_by = error_response(exc), "error", None
    return await chat_plugins.on_answer(chat, run, answer)


async def run_eval(chat: ChatRouter, run: ChatRun, payload: JsonObject, recipe: str) -> None:
    """The eval's stages: its view of ``payload`` (an eval body, already checked), every
    declared signal of ``recipe`` (no authz), every decision; no selection for real and no
    backend."""
    run.view = RequestView.from_eval(payload)
    run.recipe, run.router = recipe, chat.recipes[recipe]
    await signals_stage(run, every=True)
    eval_decision_stage(run)
