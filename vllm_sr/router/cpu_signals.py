"""The CPU-bound signals of one request, as one step: the signal registry's ``cpu_step``
families (keywords, the deterministic families but authz: context, structure, conversation,
language, metadata; and PII), each evaluated by the evaluator ``families`` binds to it, and
the reading of the deployments' routing bundle answers (decoding the embeddings, scoring the
prototype banks, domains and heads: ``deployment_questions.read_answer``). The same function
(:func:`cpu_report`) runs on the frontend's event loop or in a signal process
(``signal_proc_main``), so the two give identical results by construction; the signal
process receives a :class:`CpuSignalSpec` (a generation's signals, pickled once), each
deployment's :class:`~vllm_sr.router.deployment_questions.DeploymentQuestions` once its
cached embeddings are in (pickled once), and per request its :class:`ViewFields` (what these
families read of the view, no headers or body) and the answers' bytes as they came.

Authz stays on the loop: it reads the identity headers and may refuse the chat (403), and it
costs a dict lookup. The model-backed families go to the workers as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.router.deployment_questions import AnswerRead, DeploymentQuestions, read_answer
from vllm_sr.router.derived_signals import DerivedSignals
from vllm_sr.router.deterministic import wanted_names
from vllm_sr.router.families import STEP_BUILDERS, STEP_FAMILIES
from vllm_sr.router.family_step import Names, SignalKey, StepFamily, run_steps
from vllm_sr.router.request_view import ConversationFacts, RequestView
from vllm_sr.router.signals import SignalResult

if TYPE_CHECKING:
    from vllm_sr.config.routing_signals import Signals


@dataclass
class CpuReport:
    """What the step gives back: results, per-family timings and confidences, and the
    context count (the ``x-vsr-context-token-count`` header)."""

    results: dict[SignalKey, SignalResult] = field(default_factory=dict)
    timings_ms: dict[str, float] = field(default_factory=dict)
    family_confidence: dict[str, float] = field(default_factory=dict)
    context_tokens: int | None = None
    reads: tuple[AnswerRead, ...] = ()  # the deployments' answers read, in the order given
    # ``results`` is every result of the chat (the ``known`` ones given, the families', the
    # answers'; each read's own ``results`` then empty) with the derived steps applied
    finished: bool = False


@dataclass(frozen=True)
class CpuSignalSpec:
    """One generation's CPU-bound signals, as the signal process rebuilds them: the routing
    signals and the referenced keys (a chat evaluates what its decisions use)."""

    signals: Signals
    referenced: frozenset[SignalKey]
    derived: DerivedSignals | None = None  # the plan's steps once every result is in


@dataclass(frozen=True)
class ViewFields:
    """What the CPU-bound families read of a :class:`RequestView` (sent to a signal process)."""

    text: str
    current_user_text: str
    prior_user_texts: tuple[str, ...]
    non_user_texts: tuple[str, ...]
    context_text: str
    context_floor: int
    facts: ConversationFacts
    metadata: tuple[tuple[str, str], ...]
    has_assistant_reply: bool = False  # (the reask and feedback families read it)

    @staticmethod
    def of(view: RequestView) -> ViewFields:
        return ViewFields(
            view.text,
            view.current_user_text,
            view.prior_user_texts,
            view.non_user_texts,
            view.context_text,
            view.context_floor,
            view.facts,
            tuple(view.metadata.items()),
            view.has_assistant_reply,
        )

    def view(self) -> RequestView:
        return RequestView(
            text=self.text,
            current_user_text=self.current_user_text,
            prior_user_texts=self.prior_user_texts,
            non_user_texts=self.non_user_texts,
            context_text=self.context_text,
            context_floor=self.context_floor,
            has_assistant_reply=self.has_assistant_reply,
            facts=self.facts,
            metadata=dict(self.metadata),
        )

    def size(self) -> int:
        """Characters of text these families read (the hand-off threshold compares it)."""
        return len(self.text) + len(self.context_text)


class CpuSignals:
    """The evaluators of one spec: the registry's ``cpu_step`` families a generation
    references, each built by its bound builder (``families.STEP_BUILDERS``) once per
    generation, in each process that runs them."""

    def __init__(self, steps: list[tuple[StepFamily, Names]], clock: Clock = SYSTEM_CLOCK) -> None:
        self.steps = steps
        self.clock = clock

    @staticmethod
    def build(signals: Signals, referenced: Iterable[SignalKey]) -> CpuSignals:
        """The referenced families' evaluators (a router and a signal process alike)."""
        by_family = wanted_names(set(referenced))
        steps: list[tuple[StepFamily, Names]] = []
        for name in STEP_FAMILIES:
            if name not in by_family:
                continue
            step = STEP_BUILDERS[name](signals)
            if step is not None:
                steps.append((step, by_family[name]))
        return CpuSignals(steps)

    @staticmethod
    def from_spec(spec: CpuSignalSpec) -> CpuSignals:
        """What a signal process builds (a router builds the same from its own plan)."""
        return CpuSignals.build(spec.signals, spec.referenced)

    @property
    def any(self) -> bool:
        """Something for this step to do."""
        return bool(self.steps)

    @property
    def heavy(self) -> bool:
        """Language or pii: hundreds of microseconds on the loop even for a short text."""
        return any(step.heavy for step, _ in self.steps)

    def unloaded(self) -> list[StepFamily]:
        """Families whose models are not in memory yet (loading takes seconds: not on the
        loop)."""
        return [step for step, _ in self.steps if not step.loaded]

    def keys(self) -> set[SignalKey]:
        """Every key this step can produce (what a failed hand-off leaves without a result)."""
        keys: set[SignalKey] = set()
        for step, names in self.steps:
            keys |= step.keys(names)
        return keys


def cpu_report(
    signals: CpuSignals,
    view: RequestView,
    answers: Sequence[tuple[DeploymentQuestions, bytes]] = (),
    finish: tuple[dict[SignalKey, SignalResult], DerivedSignals] | None = None,
) -> CpuReport:
    """The step itself, the same on the loop and in a signal process: the families, then
    each deployment's ``answers`` read (a read that fails leaves its signals unknown). With
    ``finish`` (the chat's results known before the step, and its plan's derived steps) the
    report is the chat's whole results, derived steps applied."""
    report = run_steps(signals.steps, view, signals.clock)
    reads = tuple(read_answer(q, body, view) for q, body in answers)
    results = report.results
    timings = report.timings_ms
    if finish is not None:
        known, derived = finish
        results = {**known, **results}
        for read in reads:
            results.update(read.results)
        reads = tuple(AnswerRead({}, read.unknown, read.read_ms) for read in reads)
        ms = derived.apply(results)
        if ms is not None:
            timings["projection"] = ms
    return CpuReport(
        results=results,
        timings_ms=timings,
        family_confidence={kind: m.confidence for kind, m in report.metrics.items()},
        context_tokens=report.context_tokens,
        reads=reads,
        finished=finish is not None,
    )
