"""One config generation's router: signals -> decision -> model, without HTTP.

The deployments are reached only through the injected ``exchange(deployment, path, body,
timeout_ms) -> (status, body)`` (the frontend's wiring sends it through the deployment's
``ReplicaPool`` with kind "routing", so routing load is admitted and counted like native
load). A routing failure (an exchange that raises, a non-200 answer, a malformed answer) never
fails the chat: the signals that deployment answers are unknown on this request
(vllm_sr/router/unknown.py) and every other signal and decision is evaluated as usual, as
upstream evaluates signals one by one. Only when no decision matched and some signal was
unknown does the chat go to ``default_model`` saying why (``RouteResult.fallback``:
``signals:<reason>``).

Signals run in two kinds: the deterministic ones (keywords, context, structure, conversation,
language, metadata, authz, pii) with no exchange (authz on the loop; the others as one
CPU-bound step, on the loop or in a signal process: vllm_sr/router/signal_step.py,
docs/router.md "Signal processes"), and the model-backed ones
(embeddings, domains, complexity, reask, preference, jailbreak, kb, user_feedback,
fact_check) as one bundle per deployment. Then, as upstream orders them: embedding soft
matching, partitions, complexity composers, embedding top_k, projections. A chat evaluates
only the signals its decisions reference (and what those read); ``/api/v1/eval`` evaluates
every declared one (:meth:`Router.evaluate`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm_sr.config.routing import Decision, ModelRef, Routing
from vllm_sr.config.routing_kbs import KnowledgeBase, knowledge_bases
from vllm_sr.config.routing_providers import Providers
from vllm_sr.config.routing_support import effective_algorithm
from vllm_sr.errors import VllmSrError
from vllm_sr.plan import AuthzOptions  # a plan record (config -> router); named here too
from vllm_sr.pool.exchange import RoutingExchange
from vllm_sr.router.backends import BackendSet
from vllm_sr.router.decision_index import index_of
from vllm_sr.router.deployment_questions import BUNDLE_PATH, DeploymentQuestions
from vllm_sr.router.deterministic import DeterministicSignals
from vllm_sr.router.embedding_matching import EmbeddingMatching
from vllm_sr.router.learning.settings import LearningSettings
from vllm_sr.router.questions import QuestionPlan, declared_keys
from vllm_sr.router.request_view import RequestView
from vllm_sr.router.rules import Match, Ranking, SignalKey, rank, rank_all, static_order
from vllm_sr.router.selection.candidates import CandidateFilter
from vllm_sr.router.selection.decide import SelectionRequest, for_router
from vllm_sr.router.signal_dispatch import SignalDispatch
from vllm_sr.router.signal_step import Answer, SignalStep
from vllm_sr.router.signals import SignalResult
from vllm_sr.router.unknown import (
    DecisionUnresolved,
    Unknown,
    unknown_of_error,
)

if TYPE_CHECKING:
    from vllm_sr.config.schema import GlobalSection
    from vllm_sr.router.cache.embedding import QueryEmbedding

log = logging.getLogger("vllm_sr.router")

Exchange = RoutingExchange  # (deployment, path, body, timeout_ms) -> (status, body)
NO_DECISION = "(default)"  # the decision label of a request no decision matched


@dataclass(slots=True)  # one per chat: not frozen (a frozen __init__ sets each field by a call)
class RouteResult:
    model: str
    decision: str | None = None
    confidence: float | None = None
    matched_signals: tuple[str, ...] = ()  # "type:name", sorted
    fallback: str | None = None  # why default_model was used, when routing could not decide
    method: str = "default"  # x-vsr-selected-algorithm: single, static, latency_aware, ...
    model_ref: ModelRef | None = None  # the decision's chosen modelRef (reasoning reads it)
    context_tokens: int | None = None  # x-vsr-context-token-count (debug), when context ran
    routed: bool = True  # False: the caller named a model (no signals, no decision)
    decision_refs: tuple[ModelRef, ...] = ()  # the decision's modelRefs (reasoning effort)
    recipe: str = "default"  # the recipe that routed it (x-vsr-selected-recipe)
    # ("type:name", why) of each signal that was unknown on this request, sorted
    unknown: tuple[tuple[str, Unknown], ...] = ()

    @property
    def unknown_signals(self) -> tuple[str, ...]:
        """The unknown signals as ``type:name`` (x-vsr-unknown-signals)."""
        return tuple(name for name, _ in self.unknown)


@dataclass
class SignalRun:
    """Every signal result of one request (an unknown one carries why: ``result.unknown``)
    and per-family timings."""

    results: dict[SignalKey, SignalResult] = field(default_factory=dict)
    timings_ms: dict[str, float] = field(default_factory=dict)
    # Upstream's per-family eval confidence where the family defines its own (language: the
    # detection's); other families report their best matched confidence.
    family_confidence: dict[str, float] = field(default_factory=dict)
    context_tokens: int | None = None  # the context family's count, when it ran
    # each deployment's routing bundle answer (the cache and tool_selection reuse the
    # decision deployment's query embedding from it: vllm_sr/router/cache/embedding.py)
    answers: dict[str, bytes] = field(default_factory=dict)

    def matched(self) -> tuple[str, ...]:
        return tuple(sorted(f"{t}:{n}" for (t, n), r in self.results.items() if r.matched))

    def unknown(self) -> dict[SignalKey, Unknown]:
        """The signals that could not be evaluated on this request, and why."""
        out = {k: r.unknown for k, r in self.results.items() if r.unknown is not None}
        return dict(sorted(out.items())) if len(out) > 1 else out


@dataclass
class RouterStats:
    """Counters for /metrics: decisions by (decision, model), matched signals, fallbacks,
    unknown signals by (family, reason)."""

    decisions: Counter[tuple[str, str]] = field(default_factory=Counter)
    signals: Counter[str] = field(default_factory=Counter)
    fallbacks: Counter[str] = field(default_factory=Counter)
    unknown: Counter[tuple[str, str]] = field(default_factory=Counter)
    direct: Counter[str] = field(default_factory=Counter)  # chats naming a model directly
    # (model, reason): a model that failed before its first byte (router/fallback.py)
    backend_fallbacks: Counter[tuple[str, str]] = field(default_factory=Counter)
    # loopers (vllm_sr/router/looper): (algorithm, ok|error) runs, (algorithm, model) internal
    # calls, iterations per algorithm
    looper_runs: Counter[tuple[str, str]] = field(default_factory=Counter)
    looper_calls: Counter[tuple[str, str]] = field(default_factory=Counter)
    looper_iterations: Counter[str] = field(default_factory=Counter)
    # (decision, model, outcome): shadow_dispatch's copies (router/plugins/shadow.py)
    shadow: Counter[tuple[str, str, str]] = field(default_factory=Counter)

    def record(self, result: RouteResult) -> None:
        self.decisions[(result.decision or NO_DECISION, result.model)] += 1
        for sig in result.matched_signals:
            self.signals[sig] += 1
        if result.fallback is not None:
            self.fallbacks[result.fallback] += 1
        for sig, why in result.unknown:
            self.unknown[(sig.partition(":")[0], why.reason)] += 1

    def to_json(self) -> dict[str, object]:
        return {
            "decisions": [
                {"decision": d, "model": m, "count": n}
                for (d, m), n in sorted(self.decisions.items())
            ],
            "signals": dict(sorted(self.signals.items())),
            "fallbacks": dict(sorted(self.fallbacks.items())),
            "unknown_signals": [
                {"family": f, "reason": r, "count": n} for (f, r), n in sorted(self.unknown.items())
            ],
            "direct": dict(sorted(self.direct.items())),
            "backend_fallbacks": [
                {"model": m, "reason": r, "count": n}
                for (m, r), n in sorted(self.backend_fallbacks.items())
            ],
            "looper_runs": [
                {"algorithm": a, "outcome": o, "count": n}
                for (a, o), n in sorted(self.looper_runs.items())
            ],
            "looper_calls": [
                {"algorithm": a, "model": m, "count": n}
                for (a, m), n in sorted(self.looper_calls.items())
            ],
        }


def model_scores_by_decision(routing: Routing) -> dict[str, dict[str, float]]:
    """Static's input: a domain named like a decision scores that decision's models."""
    out: dict[str, dict[str, float]] = {}
    for dom in routing.signals.domains:
        if dom.model_scores:
            out[dom.name] = {s.model: float(s.score) for s in dom.model_scores}
    return out


class Router:
    def __init__(
        self,
        providers: Providers,
        routing: Routing,
        *,
        exchange: Exchange,
        backends: BackendSet,
        decision_deployment: str,
        signal_timeout_ms: float | None = None,
        stats: RouterStats | None = None,
        authz: AuthzOptions | None = None,
        global_: GlobalSection | None = None,
        recipe: str = "default",
        signal_dispatch: SignalDispatch | None = None,
    ) -> None:
        self.providers = providers
        self.routing = routing
        self.exchange = exchange
        self.backends = backends
        self.signal_timeout_ms = signal_timeout_ms
        self.decision_deployment = decision_deployment
        self.kbs = _kbs_of(global_)
        self.modules = global_.model_catalog.modules if global_ is not None else None
        self.embedding = EmbeddingMatching.of(global_)  # embedding_config's scoring and top_k
        self.plan = QuestionPlan(
            routing,
            decision_deployment,
            kbs=self.kbs,
            modules=self.modules,
            embedding=self.embedding,
        )
        authz = authz or AuthzOptions()
        self.deterministic = DeterministicSignals(
            routing.signals,
            user_id_header=authz.user_id_header,
            user_groups_header=authz.user_groups_header,
            fail_open=authz.fail_open,
        )
        self.model_scores = model_scores_by_decision(routing)
        self.recipe = recipe
        # (algorithm, eval selection status) per decision: static, or a looper run as static.
        self.algorithms = {d.name: effective_algorithm(d, global_) for d in routing.decisions}
        # selector decisions' selectors (vllm_sr/router/selection)
        self.selection = for_router(
            routing,
            providers,
            backends,
            getattr(getattr(global_, "router", None), "model_selection", None),
            decision_deployment,
            exchange,
            signal_timeout_ms,
        )
        self.candidates = CandidateFilter.of(routing)  # v0.4 candidate_requirements
        self.stats = stats if stats is not None else RouterStats()
        # Router Learning's settings (eval's preview says when learning may change the model)
        self.learning = LearningSettings.from_config(
            global_.router.learning if global_ is not None else None
        )
        self._eval_plan: QuestionPlan | None = None
        # The CPU-bound step, on the loop or in the signal processes when there are some
        # (serve's supervisor owns them: ``signal_step.dispatch``).
        self.signal_step = SignalStep(routing, signal_dispatch)

    @property
    def default_model(self) -> str:
        return self.providers.defaults.default_model

    @property
    def eval_plan(self) -> QuestionPlan:
        """Every declared signal (eval runs them all); its embeddings cache fills on first use."""
        if self._eval_plan is None:
            self._eval_plan = QuestionPlan(
                self.routing,
                self.decision_deployment,
                wanted=declared_keys(self.routing),
                kbs=self.kbs,
                modules=self.modules,
                embedding=self.embedding,
            )
        return self._eval_plan

    async def warm(self) -> dict[str, str | None]:
        """Ask each deployment once for what the router and the workers cache (candidate
        embeddings, domain centroids). -> per deployment, None or why it failed (a failed warm
        is retried by the first request, which then carries the candidates itself)."""
        out: dict[str, str | None] = {}
        if any(not p.deployment for p in self.routing.signals.pii):  # presidio, off the loop
            await asyncio.to_thread(self.plan.pii.detector.load)
        for dep, q in self.plan.deployments.items():
            body = q.warm_bundle()
            if body is None:
                out[dep] = None
                continue
            try:
                status, answer = await self.exchange(dep, BUNDLE_PATH, body, self.signal_timeout_ms)
                if status != 200:
                    out[dep] = f"http_{status}"
                    continue
                q.read(answer, warm=True)
                out[dep] = None
            except VllmSrError as exc:
                out[dep] = exc.code
        self.signal_step.publish(self.plan)
        return out

    async def signals(
        self, view: RequestView, plan: QuestionPlan, *, authz: bool = True
    ) -> SignalRun:
        """The plan's signals on the request: one exchange per deployment for the model-backed
        ones, then the CPU-bound step (the deterministic families and reading those answers)
        here or in a signal process, then the derived steps (``derived_signals``; in the
        process too when it had every answer). Authz refusals (403) raise."""
        run = SignalRun()
        authz_keys = plan.authz_keys
        if authz and authz_keys:  # first: it may refuse the chat (403), and it is a lookup
            report = self.deterministic.report(view, authz_keys, authz=True)
            for kind, metric in report.metrics.items():
                run.timings_ms[kind] = metric.execution_time_ms
                run.family_confidence[kind] = metric.confidence
            run.results.update(report.results)
        step = self.signal_step
        cpu = step.cpu_signals(plan)
        answers: list[Answer] = []
        if plan.deployments and view.text.strip():
            answers = await self._ask_all(plan, view, run)
        finished = False
        if cpu.any or answers:
            finished = await step.run(plan, cpu, view, answers, run)
        if not finished:
            ms = step.derived(plan).apply(run.results)
            if ms is not None:
                run.timings_ms["projection"] = ms
        return run

    def winner(self, run: SignalRun) -> list[Match]:
        """The matching decisions, best first; raises DecisionUnresolved when a decision's
        ``on_unknown: fail_request`` applied (the chat's unknown signals are still counted)."""
        try:
            decisions = self.routing.decisions
            return rank(decisions, run.results, self.routing.strategy, index_of(decisions))
        except DecisionUnresolved:
            for (kind, _), why in run.unknown().items():
                self.stats.unknown[(kind, why.reason)] += 1
            raise

    def ranking(self, run: SignalRun) -> Ranking:
        """:meth:`winner` with the on_unknown policies applied, without raising (eval)."""
        decisions = self.routing.decisions
        return rank_all(decisions, run.results, self.routing.strategy, index_of(decisions))

    async def route(self, view: RequestView) -> RouteResult:
        """Signals on the request, the decision, its model (the chat's stages,
        vllm_sr/router/pipeline.py, run these three one by one)."""
        started = self.backends.clock.monotonic()
        run = await self.signals(view, self.plan)
        return await self.choose(run, self.winner(run), self.selection_request(view, started))

    def selection_request(
        self, view: RequestView, started: float, query: QueryEmbedding | None = None
    ) -> SelectionRequest:
        """What the selection reads of the chat: its text, headers, start, query embedding,
        and what it needs of a candidate (v0.4 ``candidate_requirements``; None: none)."""
        return SelectionRequest(
            view.text, view.headers, started, query, self.candidates.needs(view)
        )

    async def choose(
        self, run: SignalRun, matches: list[Match], request: SelectionRequest
    ) -> RouteResult:
        """The winner's model (``matches``: the matched decisions, the winner first; its
        selector reads ``request``), counted in the stats. Unknown signals do not match; when
        no decision matched and some signal was unknown, the default model is a fallback
        (``signals:<reason>``, the first unknown signal's)."""
        unknown = run.unknown()
        best = matches[0] if matches else None
        decision = best.decision if best else None
        choice = await self.selection.choose(
            decision,
            self.default_model,
            self.candidates.admit(request.needs, self.backends.healthy),
            self.model_scores.get(decision.name) if decision is not None else None,
            request,
        )
        fallback = choice.fallback
        if decision is None and unknown:
            fallback = f"signals:{next(iter(unknown.values())).reason}"
        result = RouteResult(
            choice.model,
            decision.name if decision is not None else None,
            best.confidence if best else None,
            run.matched(),
            fallback,
            choice.method,
            choice.ref,
            decision_refs=tuple(decision.model_refs or ()) if decision is not None else (),
            recipe=self.recipe,
            context_tokens=run.context_tokens,
            unknown=tuple((f"{t}:{n}", why) for (t, n), why in unknown.items()),
        )
        self.stats.record(result)
        return result

    def static_pick(self, decision: Decision) -> ModelRef | None:
        """Static's modelRef for a decision (no health check: eval previews the choice)."""
        refs = static_order(decision, self.model_scores.get(decision.name))
        ref: ModelRef | None = refs[0] if refs else None
        return ref

    async def _ask_all(self, plan: QuestionPlan, view: RequestView, run: SignalRun) -> list[Answer]:
        """One exchange per deployment, concurrently: the answers to read. A deployment whose
        exchange failed leaves only its own signals unknown (in ``run``)."""
        questions = list(plan.deployments.values())
        answers: list[Answer | BaseException]
        if len(questions) == 1:  # one deployment (the usual case): no task to schedule
            try:
                answers = [await self._ask(questions[0], view)]
            except Exception as exc:  # as gather's return_exceptions keeps it
                answers = [exc]
        else:
            answers = await asyncio.gather(
                *(self._ask(q, view) for q in questions), return_exceptions=True
            )
        out: list[Answer] = []
        for q, answer in zip(questions, answers, strict=True):
            if isinstance(answer, BaseException):
                if isinstance(answer, asyncio.CancelledError):
                    raise answer
                why = unknown_of_error(q.deployment, answer)
                run.results.update(
                    (key, SignalResult.unknown_because(why)) for key in q.signal_keys()
                )
                continue
            out.append(answer)
        return out

    async def _ask(self, q: DeploymentQuestions, view: RequestView) -> Answer:
        """The deployment's answer to its bundle; raises when the exchange failed (a non-200
        answer: :class:`SignalAnswerStatus`)."""
        started = time.perf_counter()
        status, body = await self.exchange(
            q.deployment, BUNDLE_PATH, q.bundle(view.text, view), self.signal_timeout_ms
        )
        if status != 200:
            raise SignalAnswerStatus(status, q.deployment)
        return Answer(q, body, (time.perf_counter() - started) * 1000.0)


class SignalAnswerStatus(VllmSrError):
    """A deployment answered the routing bundle with a status other than 200."""

    retryable = True

    def __init__(self, status: int, deployment: str) -> None:
        super().__init__(f"deployment {deployment!r} answered the routing bundle with {status}")
        self.code = f"http_{status}"


def _kbs_of(global_: GlobalSection | None) -> list[KnowledgeBase]:
    """``global.model_catalog.kbs`` and upstream's default knowledge bases (the kb signal's
    example sets)."""
    return knowledge_bases(list(global_.model_catalog.kbs) if global_ is not None else None)
