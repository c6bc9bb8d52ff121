"""One config generation's router: signals -> decision -> model, without HTTP.

The deployments are reached only through the injected ``exchange(deployment, path, body,
timeout_ms) -> (status, body)`` (the frontend's wiring sends it through the deployment's
``ReplicaPool`` with kind "routing", so routing load is admitted and counted like native
load). A routing failure (an exchange that raises, a non-200 answer, a malformed answer) never
fails the chat: it routes to ``default_model`` and says why (``RouteResult.fallback``).

Signals run in two kinds: the deterministic ones (keywords, context, structure, conversation,
language, metadata, authz, pii) with no exchange (authz on the loop; the others as one
CPU-bound step, ``cpu_signals``, on the loop or in a signal process: ``signal_dispatch``,
docs/router.md "Signal processes"), and the model-backed ones
(embeddings, domains, complexity, reask, preference, jailbreak, kb, user_feedback,
fact_check) as one bundle per deployment. Then, as upstream orders them: partitions,
complexity composers, projections. A chat evaluates only the signals its decisions reference
(and what those read); ``/api/v1/eval`` evaluates every declared one (:meth:`Router.evaluate`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
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
from vllm_sr.router.cpu_signals import CpuSignals, CpuSignalSpec, ViewFields, cpu_report
from vllm_sr.router.deployment_questions import BUNDLE_PATH, DeploymentQuestions
from vllm_sr.router.deterministic import DeterministicSignals
from vllm_sr.router.learning.settings import LearningSettings
from vllm_sr.router.questions import QuestionPlan, declared_keys
from vllm_sr.router.request_view import RequestView
from vllm_sr.router.rules import Match, SignalKey, choose_model, rank, static_order
from vllm_sr.router.signal_dispatch import SignalDispatch, SignalProcessFailed
from vllm_sr.router.signals import SignalResult
from vllm_sr.router.signals_embedded import apply_composers
from vllm_sr.router.signals_projections import apply_partitions, apply_projections

if TYPE_CHECKING:
    from vllm_sr.config.schema import GlobalSection

log = logging.getLogger("vllm_sr.router")

Exchange = RoutingExchange  # (deployment, path, body, timeout_ms) -> (status, body)
NO_DECISION = "(default)"  # the decision label of a request no decision matched
_SPEC_IDS = itertools.count(1)  # a plan's CPU signals, as signal processes know them


@dataclass(frozen=True)
class RouteResult:
    model: str
    decision: str | None = None
    confidence: float | None = None
    matched_signals: tuple[str, ...] = ()  # "type:name", sorted
    fallback: str | None = None  # why default_model was used, when routing could not decide
    method: str = "default"  # upstream's x-vsr-selected-algorithm: single, static, default
    model_ref: Any = None  # the decision's modelRef that was chosen (reasoning reads it)
    context_tokens: int | None = None  # x-vsr-context-token-count (debug), when context ran
    routed: bool = True  # False: the caller named a model (no signals, no decision)
    decision_refs: tuple[Any, ...] = ()  # the decision's modelRefs (the reasoning effort lookup)
    recipe: str = "default"  # the recipe that routed it (x-vsr-selected-recipe)


@dataclass
class SignalRun:
    """Every signal result of one request, with failures and per-family timings."""

    results: dict[SignalKey, SignalResult] = field(default_factory=dict)
    errors: dict[SignalKey, str] = field(default_factory=dict)
    timings_ms: dict[str, float] = field(default_factory=dict)
    # Upstream's per-family eval confidence where the family defines its own (language: the
    # detection's); other families report their best matched confidence.
    family_confidence: dict[str, float] = field(default_factory=dict)
    failure: str | None = None  # a deployment's exchange failed: the chat falls back
    context_tokens: int | None = None  # the context family's count, when it ran

    def matched(self) -> tuple[str, ...]:
        return tuple(sorted(f"{t}:{n}" for (t, n), r in self.results.items() if r.matched))


@dataclass
class RouterStats:
    """Counters for /metrics: decisions by (decision, model), matched signals, fallbacks."""

    decisions: Counter[tuple[str, str]] = field(default_factory=Counter)
    signals: Counter[str] = field(default_factory=Counter)
    fallbacks: Counter[str] = field(default_factory=Counter)
    direct: Counter[str] = field(default_factory=Counter)  # chats naming a model directly
    # (model, reason): a model that failed before its first byte (router/fallback.py)
    backend_fallbacks: Counter[tuple[str, str]] = field(default_factory=Counter)
    # (family, reason): signals a signal process could not answer (they did not match)
    signal_failures: Counter[tuple[str, str]] = field(default_factory=Counter)

    def record(self, result: RouteResult) -> None:
        self.decisions[(result.decision or NO_DECISION, result.model)] += 1
        for sig in result.matched_signals:
            self.signals[sig] += 1
        if result.fallback is not None:
            self.fallbacks[result.fallback] += 1

    def to_json(self) -> dict[str, object]:
        return {
            "decisions": [
                {"decision": d, "model": m, "count": n}
                for (d, m), n in sorted(self.decisions.items())
            ],
            "signals": dict(sorted(self.signals.items())),
            "fallbacks": dict(sorted(self.fallbacks.items())),
            "direct": dict(sorted(self.direct.items())),
            "backend_fallbacks": [
                {"model": m, "reason": r, "count": n}
                for (m, r), n in sorted(self.backend_fallbacks.items())
            ],
            "signal_failures": [
                {"family": f, "reason": r, "count": n}
                for (f, r), n in sorted(self.signal_failures.items())
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
        signal_dispatch: SignalDispatch | None = None,
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
        self.stats = stats if stats is not None else RouterStats()
        # Router Learning's settings (eval's preview says when learning may change the model)
        router_cfg = getattr(global_, "router", None)
        self.learning = LearningSettings.from_config(getattr(router_cfg, "learning", None))
        self._eval_plan: QuestionPlan | None = None
        # The CPU-bound signals go to the signal processes when there are some (serve's
        # supervisor owns them); per plan: its evaluators, and its spec's id and pickle.
        self.signal_dispatch = signal_dispatch
        self._cpu: dict[int, tuple[CpuSignals, int, bytes | None]] = {}

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
        """The plan's signals on the request: deterministic ones here or in a signal process,
        model-backed ones as one exchange per deployment. Authz refusals (403) raise."""
        run = SignalRun()
        authz_keys = {k for k in plan.referenced if k[0] == "authz"}
        if authz and authz_keys:  # first: it may refuse the chat (403), and it is a lookup
            report = self.deterministic.report(view, authz_keys, authz=True)
            for kind, metric in report.metrics.items():
                run.timings_ms[kind] = metric.execution_time_ms
                run.family_confidence[kind] = metric.confidence
            run.results.update(report.results)
        cpu = self.cpu_signals(plan)
        if cpu.any:
            await self._cpu_step(plan, cpu, view, run)
        if plan.deployments and view.text.strip():
            started = time.perf_counter()
            run.failure = await self._ask_all(plan, view, run.results)
            elapsed = (time.perf_counter() - started) * 1000.0
            for q in plan.deployments.values():
                for kind in q.kinds():
                    run.timings_ms[kind] = elapsed
                    if run.failure is not None:
                        for key in q.signal_keys():
                            run.errors[key] = run.failure
        started = time.perf_counter()
        apply_partitions(self.routing, run.results)
        apply_composers(self.routing.signals, run.results)
        if apply_projections(self.routing, run.results):
            run.timings_ms["projection"] = (time.perf_counter() - started) * 1000.0
        return run

    def cpu_signals(self, plan: QuestionPlan) -> CpuSignals:
        """The plan's CPU-bound signals (keywords, the deterministic families but authz, pii)."""
        got = self._cpu.get(id(plan))
        if got is None:
            cpu = CpuSignals(self.deterministic, plan.keywords, plan.pii, plan.referenced)
            got = self._cpu[id(plan)] = (cpu, next(_SPEC_IDS), None)
        return got[0]

    def _spec(self, plan: QuestionPlan) -> tuple[int, bytes]:
        cpu, spec_id, spec_bytes = self._cpu[id(plan)]
        if spec_bytes is None:
            spec = CpuSignalSpec(self.routing.signals, frozenset(plan.referenced))
            spec_bytes = pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL)
            self._cpu[id(plan)] = (cpu, spec_id, spec_bytes)
        return spec_id, spec_bytes

    async def _cpu_step(
        self, plan: QuestionPlan, cpu: CpuSignals, view: RequestView, run: SignalRun
    ) -> None:
        """The CPU-bound signals: in a signal process when one is ready and the chat's text
        is past the dispatch's threshold, else here on the loop."""
        dispatch = self.signal_dispatch
        size = len(view.text) + len(view.context_text)
        if dispatch is not None and dispatch.takes(size, cpu.heavy):
            spec_id, spec_bytes = self._spec(plan)
            try:
                report = await dispatch.run(spec_id, spec_bytes, ViewFields.of(view))
            except SignalProcessFailed as exc:
                signals_lost(run, cpu.keys(), exc, self.stats)
                return
        else:
            if cpu.pii.rules and not cpu.pii.detector.loaded:  # seconds: not on the loop
                await asyncio.to_thread(cpu.pii.detector.load)
            report = cpu_report(cpu, view)
        run.results.update(report.results)
        run.timings_ms.update(report.timings_ms)
        run.family_confidence.update(report.family_confidence)
        run.context_tokens = report.context_tokens

    def winner(self, run: SignalRun) -> list[Match]:
        return rank(self.routing.decisions, run.results, self.routing.strategy, run.errors)

    async def route(self, view: RequestView) -> RouteResult:
        """Signals on the request, the decision, its model."""
        run = await self.signals(view, self.plan)
        if run.failure is not None:
            result = RouteResult(
                self.default_model, fallback=f"signals:{run.failure}", recipe=self.recipe
            )
            self.stats.record(result)
            return result
        matches = self.winner(run)
        best = matches[0] if matches else None
        decision = best.decision if best else None
        choice = choose_model(
            decision,
            self.default_model,
            self.backends.healthy,
            self.model_scores.get(decision.name) if decision is not None else None,
        )
        result = RouteResult(
            choice.model,
            decision.name if decision is not None else None,
            best.confidence if best else None,
            run.matched(),
            choice.fallback,
            choice.method,
            choice.ref,
            decision_refs=tuple(decision.model_refs or ()) if decision is not None else (),
            recipe=self.recipe,
            context_tokens=run.context_tokens,
        )
        self.stats.record(result)
        return result

    def static_pick(self, decision: Any) -> Any:
        """Static's modelRef for a decision (no health check: eval previews the choice)."""
        refs = static_order(decision, self.model_scores.get(decision.name))
        return refs[0] if refs else None

    async def _ask_all(
        self, plan: QuestionPlan, view: RequestView, results: dict[SignalKey, SignalResult]
    ) -> str | None:
        """One exchange per deployment, concurrently; their results go into ``results``.
        -> None, or the first failure's reason code."""
        questions = list(plan.deployments.values())
        answers = await asyncio.gather(
            *(self._ask(q, view) for q in questions), return_exceptions=True
        )
        for q, answer in zip(questions, answers, strict=True):
            if isinstance(answer, VllmSrError):
                log.info("routing on %s failed: %s", q.deployment, answer.message)
                return answer.code
            if isinstance(answer, str):
                return answer
            if isinstance(answer, BaseException):
                if isinstance(answer, asyncio.CancelledError):
                    raise answer
                log.error("routing on %s failed", q.deployment, exc_info=answer)
                return "internal_error"
            results.update(answer)
        return None

    async def _ask(
        self, q: DeploymentQuestions, view: RequestView
    ) -> dict[SignalKey, SignalResult] | str:
        status, body = await self.exchange(
            q.deployment, BUNDLE_PATH, q.bundle(view.text, view), self.signal_timeout_ms
        )
        if status != 200:
            return f"http_{status}"
        return q.read(body, view=view)


def signals_lost(
    run: SignalRun, keys: set[SignalKey], exc: SignalProcessFailed, stats: RouterStats
) -> None:
    """A signal process could not answer: its signals do not match, counted by family and
    reason (``vllm_sr_router_signal_failures``), and the chat routes on. The one place that
    decides it: with per-signal "unknown" states it records ``run.errors`` instead."""
    log.warning("signals %s not evaluated: %s", sorted({k for k, _ in keys}), exc.message)
    for key in keys:
        run.results[key] = SignalResult.miss()
    for family in sorted({k for k, _ in keys}):
        stats.signal_failures[(family, exc.reason)] += 1


def _kbs_of(global_: Any) -> list[Any]:
    """``global.model_catalog.kbs`` and upstream's default knowledge bases (the kb signal's
    example sets)."""
    catalog = getattr(global_, "model_catalog", None)
    return list(knowledge_bases(getattr(catalog, "kbs", None)))
