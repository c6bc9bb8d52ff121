"""The deterministic signal families, evaluated in the frontend with no worker exchange:
``context``, ``structure``, ``conversation``, ``language``, ``metadata`` and ``authz`` (from
``role_bindings``), with upstream's fields, defaults, values and confidences
(``pkg/classification/classifier_signal_*.go``, ``context_classifier.go``,
``language_classifier.go``, ``authz_classifier.go``).

Results are keyed ``(type, name)`` like every other signal (``("authz", ROLE)`` for role
bindings) and carry what a rule leaf reads (see :class:`~vllm_sr.router.signals.SignalResult`):

- context: matched when min_tokens <= count <= max_tokens (the request's estimated count, see
  ``context_estimate``); confidence 1.0; no value (upstream records none).
- structure: see ``structure``; every rule records its value and confidence.
- conversation: the counted value (``exists``: 0/1) for every evaluated rule; matched per the
  predicate (``count`` with no predicate always matches); confidence 1.0 / 0.
- language: one detection (lingua, every language it knows) of the sampled text; below the
  floor (the smallest non-zero rule threshold, else 0.3), empty or undetected text is ``en`` at
  0.5. At most one rule matches: the first named like the code whose threshold (if any) the
  confidence reaches. Confidence 1.0; no value.
- metadata: equals / in / exists on the request's metadata; matched confidence 1.0; no value.
- input_modality (v0.4): matched (confidence 1.0) when a user message carries a content
  part of the rule's modality (``ConversationFacts.input_modalities``); no value.
- authz: a binding grants its role when a User subject equals the user-id header or a Group
  subject is among the comma-separated groups header. An empty user id with bindings configured
  raises :class:`AuthzRequired` (HTTP 403) unless ``fail_open``; eval skips authz.

Only the families some wanted key names are evaluated (``wanted=None``: all, as eval does);
conversation and metadata evaluate only the wanted rules, the others their whole family.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.config.signal_families import (
    ContextSignal,
    ConversationSignal,
    InputModalitySignal,
    LanguageSignal,
)
from vllm_sr.config.signal_metadata import MetadataSignal, RoleBinding
from vllm_sr.errors import VllmSrError
from vllm_sr.router.request_view import ConversationFacts, RequestView
from vllm_sr.router.signals import SignalResult
from vllm_sr.router.structure import StructureRule, text_units

if TYPE_CHECKING:
    from vllm_sr.config.routing import Signals

SignalKey = tuple[str, str]
FAMILIES = (
    "context",
    "structure",
    "conversation",
    "language",
    "metadata",
    "input_modality",
    "authz",
)
DEFAULT_USER_ID_HEADER = "x-authz-user-id"
DEFAULT_USER_GROUPS_HEADER = "x-authz-user-groups"
DEFAULT_LANGUAGE_THRESHOLD = 0.3
FALLBACK_LANGUAGE = ("en", 0.5)
HIT = SignalResult(True, 1.0)
MISS = SignalResult(False, 0.0)


class AuthzRequired(VllmSrError):
    """Role bindings are configured, but the request carries no user identity."""

    code = "authz_required"
    http_status = 403


@dataclass(frozen=True)
class FamilyMetric:
    """Upstream's eval ``metrics`` entry for one family."""

    execution_time_ms: float
    confidence: float


@dataclass
class DeterministicReport:
    results: dict[SignalKey, SignalResult] = field(default_factory=dict)
    metrics: dict[str, FamilyMetric] = field(default_factory=dict)
    context_tokens: int | None = None  # the context family's count, when it ran
    language: tuple[str, float] | None = None  # detected (code, confidence), when it ran


# -- language detection ---------------------------------------------------------------------

_detector: Any = None
_detector_lock = threading.Lock()


def language_detector(*, preload: bool = False) -> Any:
    """The process's lingua detector over every language, built on first use. Without
    ``preload`` its models load lazily, per script, on the detections that need them.

    Loading holds the GIL (lingua's Rust code does not release it): about 1 GB and 10-20 s
    for every language, during which no other Python thread runs. So ``vllm-sr serve``
    preloads the models before its event loop starts when the config has a language rule
    (:func:`preload_language_models`); otherwise a first detection would stall the loop."""
    global _detector
    with _detector_lock:
        if _detector is None:
            from lingua import LanguageDetectorBuilder

            builder = LanguageDetectorBuilder.from_all_languages()
            if preload:
                builder = builder.with_preloaded_language_models()
            _detector = builder.build()
        return _detector


def preload_language_models() -> None:
    """Load every language model now (see :func:`language_detector`)."""
    language_detector(preload=True)


def detect_language(text: str, floor: float) -> tuple[str, float]:
    """(ISO 639-1 code, confidence); ``en`` at 0.5 for empty, undetected or below-``floor``
    text (``floor`` <= 0 means 0.3)."""
    minimum = floor if floor > 0 else DEFAULT_LANGUAGE_THRESHOLD
    if not text.strip():
        return FALLBACK_LANGUAGE
    # One pass: lingua's detect_language_of is the top confidence value unless the top two tie
    # (then none), and compute_language_confidence re-derives that same value.
    values = language_detector().compute_language_confidence_values(text)
    if not values or (len(values) > 1 and values[1].value == values[0].value):
        return FALLBACK_LANGUAGE
    code = values[0].language.iso_code_639_1.name.lower()
    confidence = float(values[0].value)
    if not code or confidence < minimum:
        return FALLBACK_LANGUAGE
    return code, confidence


def language_floor(rules: Iterable[LanguageSignal]) -> float:
    """The smallest non-zero threshold (0 when none is set)."""
    set_ = [r.threshold for r in rules if r.threshold > 0]
    return min(set_) if set_ else 0.0


# -- the evaluator --------------------------------------------------------------------------


def parse_groups(value: str) -> list[str]:
    return [g.strip() for g in value.split(",") if g.strip()]


def conversation_count(sig: ConversationSignal, facts: ConversationFacts) -> int:
    src = sig.feature.source
    if src.type == "message":
        by_role = {
            "user": facts.user_messages,
            "assistant": facts.assistant_messages,
            "system": facts.system_messages,
            "developer": int(facts.has_developer_message),
            "tool": facts.tool_messages,
        }
        if src.role is None:
            return sum(by_role.values())
        if src.role == "non_user":
            return sum(by_role.values()) - facts.user_messages
        return by_role[src.role]
    if src.type == "tool_definition":
        return facts.tool_definitions
    if src.type == "assistant_tool_call":
        return facts.assistant_tool_calls
    if src.type == "assistant_tool_cycle":
        return facts.tool_results
    if src.type == "active_tool_loop":
        return int(facts.active_tool_loop)
    if src.type == "tool_choice_required":
        return int(facts.tool_choice_required)
    if src.type == "tool_choice_none":
        return int(facts.tool_choice_none)
    if src.type == "flow_tool_state":
        return 0  # upstream's Router-owned Flow state: vllm-sr runs no Flow
    return facts.image_parts  # image_content


def conversation_result(sig: ConversationSignal, facts: ConversationFacts) -> SignalResult:
    raw = conversation_count(sig, facts)
    if sig.feature.type == "exists":
        value = 1.0 if raw > 0 else 0.0
        matched = value > 0
    else:
        value = float(raw)
        matched = sig.predicate is None or sig.predicate.holds(value)
    return SignalResult(matched, 1.0 if matched else 0.0, value)


class DeterministicSignals:
    """One config generation's deterministic families (built once, evaluated per request)."""

    def __init__(
        self,
        signals: Signals,
        *,
        user_id_header: str = DEFAULT_USER_ID_HEADER,
        user_groups_header: str = DEFAULT_USER_GROUPS_HEADER,
        fail_open: bool = False,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.context: list[ContextSignal] = list(signals.context)
        self.structure = [StructureRule(s) for s in signals.structure]
        self.needs_units = any(r.needs_units for r in self.structure)
        self.conversation: list[ConversationSignal] = list(signals.conversation)
        self.language: list[LanguageSignal] = list(signals.language)
        self.metadata: list[MetadataSignal] = list(signals.metadata)
        self.input_modality: list[InputModalitySignal] = list(signals.input_modality)
        self.bindings: list[RoleBinding] = list(signals.role_bindings)
        self.user_id_header = user_id_header.lower()
        self.user_groups_header = user_groups_header.lower()
        self.fail_open = fail_open
        self.clock = clock
        self.language_floor = language_floor(self.language)
        self.roles = list(dict.fromkeys(b.role for b in self.bindings))
        self._bounds = [(c.name, c.min_count, c.max_count) for c in self.context]

    def configured(self) -> set[SignalKey]:
        """Every key these families can produce."""
        keys: set[SignalKey] = {("context", c.name) for c in self.context}
        keys |= {("structure", r.sig.name) for r in self.structure}
        keys |= {("conversation", c.name) for c in self.conversation}
        keys |= {("language", c.name) for c in self.language}
        keys |= {("metadata", c.name) for c in self.metadata}
        keys |= {("input_modality", c.name) for c in self.input_modality}
        keys |= {("authz", role) for role in self.roles}
        return keys

    def warm(self) -> None:
        """Load the language models now (when a language rule exists), not on a request."""
        if self.language:
            detect_language("warm up the language detector", 0.0)

    def evaluate(
        self, view: RequestView, wanted: set[SignalKey] | None = None, *, authz: bool = True
    ) -> dict[SignalKey, SignalResult]:
        return self.report(view, wanted, authz=authz).results

    def report(
        self, view: RequestView, wanted: set[SignalKey] | None = None, *, authz: bool = True
    ) -> DeterministicReport:
        """The results with upstream's per-family metrics (for eval)."""
        out = DeterministicReport()
        types = {t for t, _ in wanted} if wanted is not None else set(FAMILIES)
        names = {(t, n.lower()) for t, n in wanted} if wanted is not None else None

        def used(kind: str, name: str) -> bool:
            return names is None or (kind, name.lower()) in names

        if "context" in types and self.context:
            start = self.clock.monotonic()
            count = view.context_tokens()
            for name, low, high in self._bounds:
                out.results[("context", name)] = HIT if low <= count <= high else MISS
            out.context_tokens = count
            self._metric(out, "context", start, 1.0)
        if "structure" in types and self.structure:
            start = self.clock.monotonic()
            best = 0.0
            units = text_units(view.text) if self.needs_units else None
            for rule in self.structure:
                res = rule.result(view.text, view.current_user_text, units)
                out.results[("structure", rule.sig.name)] = res
                if res.matched:
                    best = max(best, res.confidence)
            self._metric(out, "structure", start, best)
        if "conversation" in types and self.conversation:
            start = self.clock.monotonic()
            any_hit = False
            for conv in self.conversation:
                if used("conversation", conv.name):
                    res = conversation_result(conv, view.facts)
                    out.results[("conversation", conv.name)] = res
                    any_hit = any_hit or res.matched
            self._metric(out, "conversation", start, 1.0 if any_hit else 0.0)
        if "language" in types and self.language:
            start = self.clock.monotonic()
            code, confidence = detect_language(view.sampled_text(), self.language_floor)
            out.language = (code, confidence)
            winner = next(
                (r for r in self.language if r.name == code),
                None,
            )
            for lang in self.language:
                hit = lang is winner and (lang.threshold <= 0 or confidence >= lang.threshold)
                out.results.setdefault(("language", lang.name), HIT if hit else MISS)
            self._metric(out, "language", start, confidence)
        if "metadata" in types and self.metadata:
            start = self.clock.monotonic()
            any_hit = False
            for meta in self.metadata:
                if used("metadata", meta.name):
                    hit = meta.predicate.holds(dict(view.metadata), meta.key)
                    out.results[("metadata", meta.name)] = HIT if hit else MISS
                    any_hit = any_hit or hit
            self._metric(out, "metadata", start, 1.0 if any_hit else 0.0)
        if "input_modality" in types and self.input_modality:
            start = self.clock.monotonic()
            present = view.facts.input_modalities
            for im in self.input_modality:
                out.results[("input_modality", im.name)] = HIT if im.modality in present else MISS
            self._metric(out, "input_modality", start, 1.0 if present else 0.0)
        if authz and "authz" in types and self.bindings:
            start = self.clock.monotonic()
            granted = self.granted_roles(view.headers)
            for role in self.roles:
                out.results[("authz", role)] = HIT if role in granted else MISS
            self._metric(out, "authz", start, 1.0)
        return out

    def granted_roles(self, headers: Any) -> list[str]:
        """The roles the identity headers grant (deduplicated, binding order). Raises
        AuthzRequired for an empty user id unless fail_open."""
        user = headers.get(self.user_id_header, "") or ""
        if user == "":
            if self.fail_open:
                return []
            raise AuthzRequired(
                f"role_bindings are configured but the request has no user identity: the "
                f"{self.user_id_header} header is empty or missing (set by your auth backend; "
                f"global.services.authz.identity.user_id_header names it)",
                header=self.user_id_header,
            )
        groups = set(parse_groups(headers.get(self.user_groups_header, "") or ""))
        roles: list[str] = []
        for binding in self.bindings:
            if binding.role in roles:
                continue
            for subject in binding.subjects:
                if (subject.kind == "User" and subject.name == user) or (
                    subject.kind == "Group" and subject.name in groups
                ):
                    roles.append(binding.role)
                    break
        return roles

    def _metric(self, out: DeterministicReport, family: str, start: float, conf: float) -> None:
        elapsed_ms = (self.clock.monotonic() - start) * 1000.0
        out.metrics[family] = FamilyMetric(elapsed_ms, conf)
