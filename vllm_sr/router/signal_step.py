"""Where a chat's CPU-bound step runs: the deterministic families but authz, keywords and pii
(``CpuSignals``), and the reading of the deployments' routing bundle answers. On the event
loop, or in a signal process (``signal_dispatch``; docs/router.md "Signal processes") when
one is ready and the dispatch takes the chat. The step then returns the results the router
merges into the chat's ``SignalRun``; a process given every answer also runs the derived
steps (``derived_signals``), so the chat's results come back whole.

A router has one :class:`SignalStep`, which keeps per question plan (one per config
generation, and eval's) its evaluators, its derived steps and what a signal process holds of
them: the plan's ``CpuSignalSpec`` and each deployment's ``DeploymentQuestions``, pickled once
(at publish: :meth:`SignalStep.publish`) under ids the processes know them by.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_sr.router.cpu_signals import (
    CpuReport,
    CpuSignals,
    CpuSignalSpec,
    ViewFields,
    cpu_report,
)
from vllm_sr.router.deployment_questions import DeploymentQuestions, read_answer
from vllm_sr.router.derived_signals import DerivedSignals
from vllm_sr.router.rules import SignalKey
from vllm_sr.router.signal_dispatch import SignalDispatch, SignalJob, SignalProcessFailed, Spec
from vllm_sr.router.signals import SignalResult
from vllm_sr.router.unknown import FAILED, TIMEOUT, UNAVAILABLE, Unknown

if TYPE_CHECKING:
    from vllm_sr.config.routing import Routing
    from vllm_sr.router.questions import QuestionPlan
    from vllm_sr.router.request_view import RequestView
    from vllm_sr.router.route import SignalRun

log = logging.getLogger("vllm_sr.router")

_SPEC_IDS = itertools.count(1)  # a plan's CPU signals and its deployments' questions, as
# signal processes know them (one counter: the ids of both kinds never meet)

# A signal process's failure (SignalProcessFailed.reason) -> the unknown reason of its signals.
_UNKNOWN_OF_PROCESS = {"died": UNAVAILABLE, "timeout": TIMEOUT, "error": FAILED}


@dataclass(frozen=True)
class Answer:
    """A deployment's 200 answer to its routing bundle, not read yet."""

    q: DeploymentQuestions
    body: bytes
    exchange_ms: float


class SignalStep:
    """One router's CPU-bound step, per question plan; ``dispatch``: the signal processes
    (None: the step always runs on the loop; serve's supervisor sets it)."""

    def __init__(self, routing: Routing, dispatch: SignalDispatch | None = None) -> None:
        self.routing = routing
        self.dispatch = dispatch
        # per plan (by id): its evaluators, and its spec's id and pickle
        self._cpu: dict[int, tuple[CpuSignals, int, bytes | None]] = {}
        # per deployment's questions (by id): what a signal process holds of them
        self._questions: dict[int, Spec | None] = {}
        self._derived: dict[int, DerivedSignals] = {}

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

    def publish(self, plan: QuestionPlan) -> None:
        """With signal processes, pickle what they hold of ``plan`` now (at publish, once
        its deployments' embeddings are cached), not on a chat."""
        if self.dispatch is None:
            return
        self.cpu_signals(plan)
        self.spec(plan)
        for q in plan.deployments.values():
            self.questions_spec(q)

    def spec(self, plan: QuestionPlan) -> Spec:
        """The plan's CPU-bound signals and derived steps as a signal process rebuilds them."""
        cpu, spec_id, spec_bytes = self._cpu[id(plan)]
        if spec_bytes is None:
            spec = CpuSignalSpec(
                self.routing.signals, frozenset(plan.referenced), self.derived(plan)
            )
            spec_bytes = pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL)
            self._cpu[id(plan)] = (cpu, spec_id, spec_bytes)
        return Spec("config", spec_id, spec_bytes)

    def questions_spec(self, q: DeploymentQuestions) -> Spec | None:
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

    async def run(
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
        dispatch = self.dispatch
        if dispatch is None:
            return None
        handed = []
        if answers and dispatch.has_room():
            handed = [(a, s) for a in answers if (s := self.questions_spec(a.q)) is not None]
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
        assert self.dispatch is not None
        spec = self.spec(plan)
        job = SignalJob(
            spec.id,
            ViewFields.of(view),
            tuple((q_spec.id, a.body) for a, q_spec in handed),
            (*(q_spec for _, q_spec in handed), spec),
            run.results if len(handed) == len(answers) else None,
        )
        return await self.dispatch.run(job)


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
