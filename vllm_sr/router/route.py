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
CPU-bound step, ``cpu_signals``, on the loop or in a signal process: ``signal_dispatch``,
docs/router.md "Signal processes"), and the model-backed ones
(embeddings, domains, complexity, reask, preference, jailbreak, kb, user_feedback,
fact_check) as one bundle per deployment. Then, as upstream orders them: embedding soft
matching, partitions, complexity composers, embedding top_k, projections. A chat evaluates
only the signals its decisions reference (and what those read); ``/api/v1/eval`` evaluates
every declared one (:meth:`Router.evaluate`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
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
from vllm_sr.router.cpu_signals import (
    CpuReport,
    CpuSignals,
    CpuSignalSpec,
    ViewFields,
    cpu_report,
)
from vllm_sr.router.decision_index import index_of
from vllm_sr.router.deployment_questions import BUNDLE_PATH, DeploymentQuestions, read_answer
from vllm_sr.router.derived_signals import DerivedSignals
from vllm_sr.router.deterministic import DeterministicSignals
from vllm_sr.router.embedding_matching import EmbeddingMatching
from vllm_sr.router.learning.settings import LearningSettings
from vllm_sr.router.questions import QuestionPlan, declared_keys
from vllm_sr.router.request_view import RequestView
from vllm_sr.router.rules import Match, Ranking, SignalKey, rank, rank_all, static_order
from vllm_sr.router.selection.candidates import CandidateFilter
from vllm_sr.router.selection.decide import SelectionRequest, for_router
from vllm_sr.router.signal_dispatch import SignalDispatch, SignalJob, SignalProcessFailed, Spec
from vllm_sr.router.signals import SignalResult
from vllm_sr.router.unknown import (
    FAILED,
    TIMEOUT,
    UNAVAILABLE,
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
_SPEC_IDS = itertools.count(1)  # a plan's CPU signals and its deployments' questions, as
# signal processes know them (one counter: the ids of both kinds never meet)


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
        # The CPU-bound signals go to the signal processes when there are some (serve's
        # supervisor owns them); per plan: its evaluators, and its spec's id and pickle.
        self.signal_dispatch = signal_dispatch
        self._cpu: dict[int, tuple[CpuSignals, int, bytes | None]] = {}
        # per deployment's questions (by id): what a signal process holds of them
        self._questions: dict[int, Spec | None] = {}
        self._derived: dict[int, DerivedSignals] = {}

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
        if self.signal_dispatch is not None:  # pickled now, at publish, not on a chat
            self.cpu_signals(self.plan)
            self._spec(self.plan)
            for q in self.plan.deployments.values():
                self._questions_spec(q)
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
        cpu = self.cpu_signals(plan)
        answers: list[Answer] = []
        if plan.deployments and view.text.strip():
            answers = await self._ask_all(plan, view, run)
        finished = False
        if cpu.any or answers:
            finished = await self._step(plan, cpu, view, answers, run)
        if not finished:
            ms = self.derived(plan).apply(run.results)
            if ms is not None:
                run.timings_ms["projection"] = ms
        return run

    def derived(self, plan: QuestionPlan) -> DerivedSignals:
        """The plan's steps once every result is in (one per plan)."""
        got = self._derived.get(id(plan))
        if got is None:
            got = self._derived[id(plan)] = DerivedSignals(
                self.routing, plan.embedding, plan.uses_embeddings
            )
        return got

    def cpu_signals(self, plan: QuestionPlan) -> CpuSignals:
        """The plan's CPU-bound signals (keywords, the deterministic families but authz, pii)."""
        got = self._cpu.get(id(plan))
        if got is None:
            cpu = CpuSignals.build(self.routing.signals, plan.referenced)
            got = self._cpu[id(plan)] = (cpu, next(_SPEC_IDS), None)
        return got[0]

    def _spec(self, plan: QuestionPlan) -> Spec:
        cpu, spec_id, spec_bytes = self._cpu[id(plan)]
        if spec_bytes is None:
            spec = CpuSignalSpec(
                self.routing.signals, frozenset(plan.referenced), self.derived(plan)
            )
            spec_bytes = pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL)
            self._cpu[id(plan)] = (cpu, spec_id, spec_bytes)
        return Spec("config", spec_id, spec_bytes)

    def _questions_spec(self, q: DeploymentQuestions) -> Spec | None:
        """A deployment's questions as a signal process holds them, once its embeddings are
        cached (pickled once; None before, or if they cannot be: read here then)."""
        if not q.cached:
            return None
        if id(q) in self._questions:
            return self._questions[id(q)]
        got: Spec | None = None
        try:
            body = pickle.dumps(q, protocol=pickle.HIGHEST_PROTOCOL)
            got = Spec("questions", next(_SPEC_IDS), body)
        except Exception as exc:  # a config object that does not pickle: read on the loop
            log.warning("deployment %s: answers read on the loop (%s)", q.deployment, exc)
        self._questions[id(q)] = got
        return got

    async def _step(
        self,
        plan: QuestionPlan,
        cpu: CpuSignals,
        view: RequestView,
        answers: list[Answer],
        run: SignalRun,
    ) -> bool:
        """The CPU-bound signals and the reading of the deployments' answers: in a signal
        process when one is ready and the dispatch takes the chat (its text's size, whether
        its step is heavy), else here on the loop. A process that fails leaves the CPU-bound
        signals unknown; the answers it was given are read here instead. -> whether the
        process also ran the derived steps (it had every answer: ``run.results`` is whole)."""
        taken = self._handed_off(cpu, view, answers)
        handed = taken or []
        report: CpuReport | None = None
        if taken is not None:
            try:
                report = await self._in_process(plan, view, answers, handed, run)
            except SignalProcessFailed as exc:
                if cpu.any:
                    signals_lost(run, cpu.keys(), exc)
                report = CpuReport()
                handed = []
        if report is None:
            for step in cpu.unloaded():  # seconds (presidio): not on the loop
                await asyncio.to_thread(step.load)
            report = cpu_report(cpu, view)
            handed = []
        if report.finished:
            run.results = report.results
        else:
            run.results.update(report.results)
        run.timings_ms.update(report.timings_ms)
        run.family_confidence.update(report.family_confidence)
        run.context_tokens = report.context_tokens
        reads = list(zip((a for a, _ in handed), report.reads, strict=True))
        reads += [
            (a, read_answer(a.q, a.body, view))
            for a in answers
            if all(a is not h for h, _ in handed)
        ]
        for a, read in reads:
            run.results.update(read.results)
            if read.unknown is None:
                run.answers[a.q.deployment] = a.body
            for kind in a.q.kinds():
                run.timings_ms[kind] = a.exchange_ms + read.read_ms
        return report.finished

    def _handed_off(
        self, cpu: CpuSignals, view: RequestView, answers: list[Answer]
    ) -> list[tuple[Answer, Spec]] | None:
        """Whether the step goes to a signal process (None: it stays here), with the answers
        a process reads: those whose deployment's embeddings are cached, while a process has
        room (``SignalDispatch.has_room``; else they are read here)."""
        dispatch = self.signal_dispatch
        if dispatch is None:
            return None
        handed = []
        if answers and dispatch.has_room():
            handed = [(a, s) for a in answers if (s := self._questions_spec(a.q)) is not None]
        if not (cpu.any or handed):
            return None
        heavy = cpu.heavy or any(a.q.heavy for a, _ in handed)
        return handed if dispatch.takes(len(view.text) + len(view.context_text), heavy) else None

    async def _in_process(
        self,
        plan: QuestionPlan,
        view: RequestView,
        answers: list[Answer],
        handed: list[tuple[Answer, Spec]],
        run: SignalRun,
    ) -> CpuReport:
        """The job to a process; with every answer in it, the process finishes the chat's
        results (it is given those known so far)."""
        assert self.signal_dispatch is not None
        spec = self._spec(plan)
        job = SignalJob(
            spec.id,
            ViewFields.of(view),
            tuple((q_spec.id, a.body) for a, q_spec in handed),
            (*(q_spec for _, q_spec in handed), spec),
            run.results if len(handed) == len(answers) else None,
        )
        return await self.signal_dispatch.run(job)

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


@dataclass(frozen=True)
class Answer:
    """A deployment's 200 answer to its routing bundle, not read yet."""

    q: DeploymentQuestions
    body: bytes
    exchange_ms: float


class SignalAnswerStatus(VllmSrError):
    """A deployment answered the routing bundle with a status other than 200."""

    retryable = True

    def __init__(self, status: int, deployment: str) -> None:
        super().__init__(f"deployment {deployment!r} answered the routing bundle with {status}")
        self.code = f"http_{status}"


# A signal process's failure (SignalProcessFailed.reason) -> the unknown reason of its signals.
_UNKNOWN_OF_PROCESS = {"died": UNAVAILABLE, "timeout": TIMEOUT, "error": FAILED}


def signals_lost(run: SignalRun, keys: set[SignalKey], exc: SignalProcessFailed) -> None:
    """A signal process could not answer: its signals are unknown on this chat, as a failed
    worker question leaves its own (vllm_sr/router/unknown.py): they do not match, eval lists
    them, the chat's ``x-vsr-unknown-signals`` names them and
    ``vllm_sr_router_unknown_signals_total`` counts them by family and reason."""
    log.warning("signals %s not evaluated: %s", sorted({k for k, _ in keys}), exc.message)
    why = Unknown(
        _UNKNOWN_OF_PROCESS.get(exc.reason, FAILED), f"signal_process_{exc.reason}: {exc.message}"
    )
    for key in keys:
        run.results[key] = SignalResult.unknown_because(why)


def _kbs_of(global_: GlobalSection | None) -> list[KnowledgeBase]:
    """``global.model_catalog.kbs`` and upstream's default knowledge bases (the kb signal's
    example sets)."""
    return knowledge_bases(list(global_.model_catalog.kbs) if global_ is not None else None)
