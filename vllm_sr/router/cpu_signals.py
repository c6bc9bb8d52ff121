"""The CPU-bound signals of one request, as one step: keywords, the deterministic families but
authz (context, structure, conversation, language, metadata) and PII. The same function
(:func:`cpu_report`) runs on the frontend's event loop or in a signal process
(``signal_proc_main``), so the two give identical results by construction; the signal
process receives a :class:`CpuSignalSpec` (a generation's signals, pickled once) and the
request's :class:`ViewFields` (what these families read of the view, no headers or body).

Authz stays on the loop: it reads the identity headers and may refuse the chat (403), and it
costs a dict lookup. The model-backed families go to the workers as before.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm_sr.router.deterministic import DeterministicSignals
from vllm_sr.router.request_view import ConversationFacts, RequestView
from vllm_sr.router.signals import KeywordMatcher, SignalResult, keyword_matcher
from vllm_sr.router.signals_pii import PiiSignals

if TYPE_CHECKING:
    from vllm_sr.config.routing import Signals

SignalKey = tuple[str, str]
# The families this step evaluates (the deterministic ones but authz, keywords, pii).
CPU_FAMILIES = (
    "keyword",
    "context",
    "structure",
    "conversation",
    "language",
    "metadata",
    "input_modality",
    "pii",
)


@dataclass
class CpuReport:
    """What the step gives back: results, per-family timings and confidences, and the
    context count (the ``x-vsr-context-token-count`` header)."""

    results: dict[SignalKey, SignalResult] = field(default_factory=dict)
    timings_ms: dict[str, float] = field(default_factory=dict)
    family_confidence: dict[str, float] = field(default_factory=dict)
    context_tokens: int | None = None


@dataclass(frozen=True)
class CpuSignalSpec:
    """One generation's CPU-bound signals, as the signal process rebuilds them: the routing
    signals and the referenced keys (a chat evaluates what its decisions use)."""

    signals: Signals
    referenced: frozenset[SignalKey]


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
        )

    def view(self) -> RequestView:
        return RequestView(
            text=self.text,
            current_user_text=self.current_user_text,
            prior_user_texts=self.prior_user_texts,
            non_user_texts=self.non_user_texts,
            context_text=self.context_text,
            context_floor=self.context_floor,
            facts=self.facts,
            metadata=dict(self.metadata),
        )

    def size(self) -> int:
        """Characters of text these families read (the hand-off threshold compares it)."""
        return len(self.text) + len(self.context_text)


class CpuSignals:
    """The evaluators of one spec: built once per generation, in each process that runs them."""

    def __init__(
        self,
        deterministic: DeterministicSignals,
        keywords: dict[str, KeywordMatcher],
        pii: PiiSignals,
        referenced: set[SignalKey] | frozenset[SignalKey],
    ) -> None:
        self.deterministic = deterministic
        self.keywords = keywords
        self.pii = pii
        self.referenced = set(referenced)
        self.wanted = {k for k in self.referenced if k[0] != "authz"}

    @staticmethod
    def from_spec(spec: CpuSignalSpec) -> CpuSignals:
        """What a signal process builds (a router builds the same from its own plan)."""
        sigs = spec.signals
        wanted = spec.referenced
        keywords = {
            s.name: keyword_matcher(s) for s in sigs.keywords if ("keyword", s.name) in wanted
        }
        pii = PiiSignals(
            [p for p in sigs.pii if ("pii", p.name) in spec.referenced and not p.deployment]
        )
        return CpuSignals(DeterministicSignals(sigs), keywords, pii, spec.referenced)

    @property
    def any(self) -> bool:
        """Something for this step to do."""
        return bool(self.keywords or self.pii.rules or self.wanted_deterministic())

    @property
    def heavy(self) -> bool:
        """Language or pii: hundreds of microseconds on the loop even for a short text."""
        return bool(self.pii.rules) or (
            bool(self.deterministic.language) and any(t == "language" for t, _ in self.wanted)
        )

    def wanted_deterministic(self) -> bool:
        det = self.deterministic
        kinds = {t for t, _ in self.wanted}
        return bool(
            ("context" in kinds and det.context)
            or ("structure" in kinds and det.structure)
            or ("conversation" in kinds and det.conversation)
            or ("language" in kinds and det.language)
            or ("metadata" in kinds and det.metadata)
            or ("input_modality" in kinds and det.input_modality)
        )

    def keys(self) -> set[SignalKey]:
        """Every key this step can produce (what a failed hand-off leaves without a result)."""
        keys = {("keyword", n) for n in self.keywords}
        keys |= {("pii", r.name) for r in self.pii.rules}
        kinds = {t for t, _ in self.wanted}
        keys |= {k for k in self.deterministic.configured() if k[0] in kinds and k[0] != "authz"}
        return keys


def cpu_report(signals: CpuSignals, view: RequestView) -> CpuReport:
    """The step itself, the same on the loop and in a signal process."""
    out = CpuReport()
    if signals.keywords:
        started = time.perf_counter()
        for name, matcher in signals.keywords.items():
            out.results[("keyword", name)] = matcher.score(view.text)
        out.timings_ms["keyword"] = (time.perf_counter() - started) * 1000.0
    report = signals.deterministic.report(view, signals.wanted, authz=False)
    for kind, metric in report.metrics.items():
        out.timings_ms[kind] = metric.execution_time_ms
        out.family_confidence[kind] = metric.confidence
    out.results.update(report.results)
    out.context_tokens = report.context_tokens
    if signals.pii.rules:
        started = time.perf_counter()
        out.results.update(signals.pii.results(view))
        out.timings_ms["pii"] = (time.perf_counter() - started) * 1000.0
    return out
