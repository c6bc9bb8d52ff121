"""The shape of a CPU-step family's evaluator (``cpu_step`` in ``vllm_sr.config.signal_registry``),
and the report the step fills. ``vllm_sr/router/families.py`` binds each such family to the
builder of its :class:`StepFamily`; :class:`~vllm_sr.router.cpu_signals.CpuSignals` builds the
referenced ones once per config generation and :func:`run_steps` evaluates them on a request,
on the event loop or in a signal process alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from vllm_sr.clock import Clock

if TYPE_CHECKING:
    from vllm_sr.config.routing_signals import Signals
    from vllm_sr.router.request_view import RequestView
    from vllm_sr.router.signals import SignalResult

SignalKey = tuple[str, str]
Names = frozenset[str]


@dataclass(frozen=True)
class FamilyMetric:
    """Upstream's eval ``metrics`` entry for one family."""

    execution_time_ms: float
    confidence: float


@dataclass
class StepReport:
    """What evaluating families gives: results, upstream's per-family metrics (only for the
    families that state their confidence; eval takes the best matched result's for the
    others), per-family timings, and what the context and language families found."""

    results: dict[SignalKey, SignalResult] = field(default_factory=dict)
    metrics: dict[str, FamilyMetric] = field(default_factory=dict)
    timings_ms: dict[str, float] = field(default_factory=dict)
    context_tokens: int | None = None  # the context family's count, when it ran
    language: tuple[str, float] | None = None  # detected (code, confidence), when it ran


class StepFamily(Protocol):
    """One family's rules of a config generation, built once, evaluated per request."""

    @property
    def family(self) -> str:
        """The family's name (its registry row)."""
        ...

    @property
    def heavy(self) -> bool:
        """Hundreds of microseconds on the loop even for a short text (language, pii)."""
        ...

    @property
    def loaded(self) -> bool:
        """Its models are in memory (else :meth:`load` takes seconds: not on the loop)."""
        ...

    def load(self) -> None: ...

    def keys(self, names: Names | None) -> set[SignalKey]:
        """The keys :meth:`evaluate` gives for these wanted names (None: every rule)."""
        ...

    def evaluate(self, view: RequestView, names: Names | None, out: StepReport) -> float | None:
        """Put the wanted rules' results in ``out``; the family's eval confidence, or None
        where upstream reports the best matched result's."""
        ...


StepBuilder = Callable[["Signals"], "StepFamily | None"]
"""A family's evaluator from the generation's signals; None when it declares no rule."""


def run_steps(
    steps: Iterable[tuple[StepFamily, Names | None]], view: RequestView, clock: Clock
) -> StepReport:
    """Each family on the request, timed on ``clock`` (its eval metric when it states one)."""
    out = StepReport()
    for step, names in steps:
        start = clock.monotonic()
        confidence = step.evaluate(view, names, out)
        elapsed_ms = (clock.monotonic() - start) * 1000.0
        out.timings_ms[step.family] = elapsed_ms
        if confidence is not None:
            out.metrics[step.family] = FamilyMetric(elapsed_ms, confidence)
    return out
