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
language, metadata, authz, pii) in this process with no exchange, and the model-backed ones
(embeddings, domains, complexity, reask, preference, jailbreak, kb, user_feedback,
fact_check) as one bundle per deployment. Then, as upstream orders them: partitions,
complexity composers, projections. A chat evaluates only the signals its decisions reference
(and what those read); ``/api/v1/eval`` evaluates every declared one (:meth:`Router.evaluate`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_sr.config.routing import Providers, Routing, effective_algorithm
from vllm_sr.config.routing_kbs import knowledge_bases
from vllm_sr.errors import VllmSrError
from vllm_sr.plan import AuthzOptions  # a plan record (config -> router); named here too
from vllm_sr.pool.exchange import RoutingExchange
from vllm_sr.router.backends import BackendSet
from vllm_sr.router.deployment_questions import BUNDLE_PATH, DeploymentQuestions
from vllm_sr.router.deterministic import DeterministicSignals
from vllm_sr.router.learning.settings import LearningSettings
from vllm_sr.router.questions import QuestionPlan, declared_keys
from vllm_sr.router.request_view import RequestView
from vllm_sr.router.rules import Match, SignalKey, rank, static_order
from vllm_sr.router.selection.candidates import CandidateFilter
from vllm_sr.router.selection.decide import DecisionSelection, LiveFacts
from vllm_sr.router.signals import SignalResult
from vllm_sr.router.signals_embedded import apply_composers
from vllm_sr.router.signals_projections import apply_partitions, apply_projections
from vllm_sr.router.signals_safety import apply_hazards
from vllm_sr.router.unknown import FAILED, Unknown, unknown_of

if TYPE_CHECKING:
    from vllm_sr.config.schema import GlobalSection

log = logging.getLogger("vllm_sr.router")

Exchange = RoutingExchange  # (deployment, path, body, timeout_ms) -> (status, body)
NO_DECISION = "(default)"  # the decision label of a request no decision matched


@dataclass(frozen=True)
class RouteResult:
    model: str
    decision: str | None = None
    confidence: float | None = None
    matched_signals: tuple[str, ...] = ()  # "type:name", sorted
    fallback: str | None = None  # why default_model was used, when routing could not decide
    method: str = "default"  # x-vsr-selected-algorithm: single, static, latency_aware, ...
    model_ref: Any = None  # the decision's modelRef that was chosen (reasoning reads it)
    context_tokens: int | None = None  # x-vsr-context-token-count (debug), when context ran
    routed: bool = True  # False: the caller named a model (no signals, no decision)
    decision_refs: tuple[Any, ...] = ()  # the decision's modelRefs (the reasoning effort lookup)
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
        }


def model_scores_by_decision(routing: Routing) -> dict[str, dict[str, float]]:
    """Static's input: a domain named like a decision scores that decision's models."""
    out: dict[str, dict[str, float]] = {}
    for dom in routing.signals.domains:
        scores = getattr(dom, "model_scores", None) or []
        if scores:
            out[dom.name] = {s.model: float(s.score) for s in scores}
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
    ) -> None:
        self.providers = providers
        self.routing = routing
        self.exchange = exchange
        self.backends = backends
        self.signal_timeout_ms = signal_timeout_ms
        self.decision_deployment = decision_deployment
        self.kbs = _kbs_of(global_)
        self.modules = getattr(getattr(global_, "model_catalog", None), "modules", None)
        self.plan = QuestionPlan(routing, decision_deployment, kbs=self.kbs, modules=self.modules)
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
        # latency_aware / multi_factor decisions' selectors (vllm_sr/router/selection)
        self.selection = DecisionSelection(
            routing, LiveFacts(backends.observations, backends, providers, routing)
        )
        self.candidates = CandidateFilter.of(routing)  # v0.4 candidate_requirements
        self.stats = stats if stats is not None else RouterStats()
        # Router Learning's settings (eval's preview says when learning may change the model)
        router_cfg = getattr(global_, "router", None)
        self.learning = LearningSettings.from_config(getattr(router_cfg, "learning", None))
        self._eval_plan: QuestionPlan | None = None

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
        return out

    async def signals(
        self, view: RequestView, plan: QuestionPlan, *, authz: bool = True
    ) -> SignalRun:
        """The plan's signals on the request: deterministic ones here, model-backed ones as
        one exchange per deployment. Authz refusals (403) raise."""
        run = SignalRun()
        started = time.perf_counter()
        run.results.update(plan.keyword_results(view.text))
        if plan.keywords:
            run.timings_ms["keyword"] = (time.perf_counter() - started) * 1000.0
        report = self.deterministic.report(view, plan.referenced, authz=authz)
        for kind, metric in report.metrics.items():
            run.timings_ms[kind] = metric.execution_time_ms
            run.family_confidence[kind] = metric.confidence
        run.results.update(report.results)
        run.context_tokens = report.context_tokens
        if plan.pii.rules:
            if not plan.pii.detector.loaded:  # seconds of imports: not on the event loop
                await asyncio.to_thread(plan.pii.detector.load)
            started = time.perf_counter()
            run.results.update(plan.pii.results(view))
            run.timings_ms["pii"] = (time.perf_counter() - started) * 1000.0
        if plan.deployments and view.text.strip():
            await self._ask_all(plan, view, run)
        started = time.perf_counter()
        apply_partitions(self.routing, run.results)
        apply_composers(self.routing.signals, run.results)
        apply_hazards(self.routing.signals.safety, run.results)
        if apply_projections(self.routing, run.results):
            run.timings_ms["projection"] = (time.perf_counter() - started) * 1000.0
        return run

    def winner(self, run: SignalRun) -> list[Match]:
        return rank(self.routing.decisions, run.results, self.routing.strategy)

    async def route(self, view: RequestView) -> RouteResult:
        """Signals on the request, the decision, its model. Unknown signals do not match;
        when no decision matched and some signal was unknown, the default model is a
        fallback (``signals:<reason>``, the first unknown signal's)."""
        run = await self.signals(view, self.plan)
        unknown = run.unknown()
        matches = self.winner(run)
        best = matches[0] if matches else None
        decision = best.decision if best else None
        choice = self.selection.choose(
            decision,
            self.default_model,
            self.candidates.admit(view, self.backends.healthy),
            self.model_scores.get(decision.name) if decision is not None else None,
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

    def static_pick(self, decision: Any) -> Any:
        """Static's modelRef for a decision (no health check: eval previews the choice)."""
        refs = static_order(decision, self.model_scores.get(decision.name))
        return refs[0] if refs else None

    async def _ask_all(self, plan: QuestionPlan, view: RequestView, run: SignalRun) -> None:
        """One exchange per deployment, concurrently; their results go into ``run``. A
        deployment whose exchange failed leaves only its own signals unknown."""
        questions = list(plan.deployments.values())
        answers = await asyncio.gather(
            *(self._ask(q, view) for q in questions), return_exceptions=True
        )
        for q, answer in zip(questions, answers, strict=True):
            if isinstance(answer, BaseException):
                if isinstance(answer, asyncio.CancelledError):
                    raise answer
                why = _unknown_of_error(q.deployment, answer)
                run.results.update(
                    (key, SignalResult.unknown_because(why)) for key in q.signal_keys()
                )
                continue
            results, elapsed_ms = answer
            for kind in q.kinds():
                run.timings_ms[kind] = elapsed_ms
            run.results.update(results)

    async def _ask(
        self, q: DeploymentQuestions, view: RequestView
    ) -> tuple[dict[SignalKey, SignalResult], float]:
        """The deployment's signal results and the milliseconds its exchange took; raises
        when it failed (a non-200 answer: :class:`SignalAnswerStatus`)."""
        started = time.perf_counter()
        status, body = await self.exchange(
            q.deployment, BUNDLE_PATH, q.bundle(view.text, view), self.signal_timeout_ms
        )
        if status != 200:
            raise SignalAnswerStatus(status, q.deployment)
        return q.read(body, view=view), (time.perf_counter() - started) * 1000.0


class SignalAnswerStatus(VllmSrError):
    """A deployment answered the routing bundle with a status other than 200."""

    retryable = True

    def __init__(self, status: int, deployment: str) -> None:
        super().__init__(f"deployment {deployment!r} answered the routing bundle with {status}")
        self.code = f"http_{status}"


def _unknown_of_error(deployment: str, exc: BaseException) -> Unknown:
    """The unknown state of a deployment's signals after its exchange raised ``exc``."""
    if isinstance(exc, VllmSrError):
        log.info("routing on %s failed: %s", deployment, exc.message)
        return unknown_of(exc.code, exc.message)
    log.error("routing on %s failed", deployment, exc_info=exc)
    return Unknown(FAILED, f"internal_error: {type(exc).__name__}: {exc}")


def _kbs_of(global_: Any) -> list[Any]:
    """``global.model_catalog.kbs`` and upstream's default knowledge bases (the kb signal's
    example sets)."""
    catalog = getattr(global_, "model_catalog", None)
    return list(knowledge_bases(getattr(catalog, "kbs", None)))
