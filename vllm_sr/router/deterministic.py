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
- language: see ``language``.
- metadata: equals / in / exists on the request's metadata; matched confidence 1.0; no value.
- input_modality (v0.4): matched (confidence 1.0) when a user message carries a content
  part of the rule's modality (``ConversationFacts.input_modalities``); no value.
- authz: a binding grants its role when a User subject equals the user-id header or a Group
  subject is among the comma-separated groups header. An empty user id with bindings configured
  raises :class:`AuthzRequired` (HTTP 403) unless ``fail_open``; eval skips authz.

Each family but authz is a :class:`~vllm_sr.router.family_step.StepFamily` (the CPU step runs
them, ``cpu_signals``); :class:`DeterministicSignals` runs them all, and authz, on the loop.
Only the families some wanted key names are evaluated (``wanted=None``: all, as eval does);
conversation and metadata evaluate only the wanted rules, the others their whole family.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.config.signal_families import (
    ContextSignal,
    ConversationSignal,
    StructureSignal,
)
from vllm_sr.config.signal_metadata import MetadataSignal, RoleBinding
from vllm_sr.errors import VllmSrError
from vllm_sr.router.family_step import (
    FamilyMetric,
    Names,
    SignalKey,
    StepFamily,
    StepReport,
    run_steps,
)
from vllm_sr.router.input_modality import InputModalityFamily
from vllm_sr.router.language import LanguageFamily
from vllm_sr.router.request_view import ConversationFacts, RequestView
from vllm_sr.router.signals import MISS, SignalResult
from vllm_sr.router.structure import StructureRule, text_units

if TYPE_CHECKING:
    from vllm_sr.config.routing_signals import Signals

DEFAULT_USER_ID_HEADER = "x-authz-user-id"
DEFAULT_USER_GROUPS_HEADER = "x-authz-user-groups"
HIT = SignalResult(True, 1.0)


class AuthzRequired(VllmSrError):
    """Role bindings are configured, but the request carries no user identity."""

    code = "authz_required"
    http_status = 403


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


class ContextFamily:
    """Token-count bands: the whole family on every request that wants one."""

    family = "context"
    heavy = False
    loaded = True

    def __init__(self, rules: list[ContextSignal]) -> None:
        self._bounds = [(c.name, c.min_count, c.max_count) for c in rules]

    @staticmethod
    def build(signals: Signals) -> ContextFamily | None:
        return ContextFamily(list(signals.context)) if signals.context else None

    def load(self) -> None:
        pass

    def keys(self, names: Names | None) -> set[SignalKey]:
        return {("context", name) for name, _, _ in self._bounds}

    def evaluate(self, view: RequestView, names: Names | None, out: StepReport) -> float:
        count = view.context_tokens()
        for name, low, high in self._bounds:
            out.results[("context", name)] = HIT if low <= count <= high else MISS
        out.context_tokens = count
        return 1.0


class StructureFamily:
    """Pattern counts and densities: the whole family (upstream evaluates it whole)."""

    family = "structure"
    heavy = False
    loaded = True

    def __init__(self, rules: list[StructureSignal]) -> None:
        self.rules = [StructureRule(s) for s in rules]
        self.needs_units = any(r.needs_units for r in self.rules)

    @staticmethod
    def build(signals: Signals) -> StructureFamily | None:
        return StructureFamily(list(signals.structure)) if signals.structure else None

    def load(self) -> None:
        pass

    def keys(self, names: Names | None) -> set[SignalKey]:
        return {("structure", r.sig.name) for r in self.rules}

    def evaluate(self, view: RequestView, names: Names | None, out: StepReport) -> float:
        best = 0.0
        units = text_units(view.text) if self.needs_units else None
        for rule in self.rules:
            res = rule.result(view.text, view.current_user_text, units)
            out.results[("structure", rule.sig.name)] = res
            if res.matched:
                best = max(best, res.confidence)
        return best


class ConversationFamily:
    """The conversation's shape: only the wanted rules."""

    family = "conversation"
    heavy = False
    loaded = True

    def __init__(self, rules: list[ConversationSignal]) -> None:
        self.rules = rules

    @staticmethod
    def build(signals: Signals) -> ConversationFamily | None:
        return ConversationFamily(list(signals.conversation)) if signals.conversation else None

    def load(self) -> None:
        pass

    def keys(self, names: Names | None) -> set[SignalKey]:
        wanted = lowered(names)
        return {("conversation", c.name) for c in self.rules if used(wanted, c.name)}

    def evaluate(self, view: RequestView, names: Names | None, out: StepReport) -> float:
        any_hit = False
        wanted = lowered(names)
        for conv in self.rules:
            if used(wanted, conv.name):
                res = conversation_result(conv, view.facts)
                out.results[("conversation", conv.name)] = res
                any_hit = any_hit or res.matched
        return 1.0 if any_hit else 0.0


class MetadataFamily:
    """equals / in / exists on the request's metadata: only the wanted rules."""

    family = "metadata"
    heavy = False
    loaded = True

    def __init__(self, rules: list[MetadataSignal]) -> None:
        self.rules = rules

    @staticmethod
    def build(signals: Signals) -> MetadataFamily | None:
        return MetadataFamily(list(signals.metadata)) if signals.metadata else None

    def load(self) -> None:
        pass

    def keys(self, names: Names | None) -> set[SignalKey]:
        wanted = lowered(names)
        return {("metadata", m.name) for m in self.rules if used(wanted, m.name)}

    def evaluate(self, view: RequestView, names: Names | None, out: StepReport) -> float:
        any_hit = False
        metadata = dict(view.metadata)
        wanted = lowered(names)
        for meta in self.rules:
            if used(wanted, meta.name):
                hit = meta.predicate.holds(metadata, meta.key)
                out.results[("metadata", meta.name)] = HIT if hit else MISS
                any_hit = any_hit or hit
        return 1.0 if any_hit else 0.0


def lowered(names: Names | None) -> Names | None:
    return frozenset(n.lower() for n in names) if names is not None else None


def used(wanted: Names | None, name: str) -> bool:
    """A rule is wanted (``wanted``: :func:`lowered` names; upstream's usage compares them
    case-insensitively)."""
    return wanted is None or name.lower() in wanted


# The deterministic families this module evaluates, in evaluation order (authz, on the loop,
# is :class:`DeterministicSignals`' own).
STEP_FAMILIES = (
    ContextFamily,
    StructureFamily,
    ConversationFamily,
    LanguageFamily,
    MetadataFamily,
    InputModalityFamily,
)
FAMILIES = (*(f.family for f in STEP_FAMILIES), "authz")


class DeterministicSignals:
    """One config generation's deterministic families (built once, evaluated per request):
    the step families above, and authz."""

    def __init__(
        self,
        signals: Signals,
        *,
        user_id_header: str = DEFAULT_USER_ID_HEADER,
        user_groups_header: str = DEFAULT_USER_GROUPS_HEADER,
        fail_open: bool = False,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        built = (f.build(signals) for f in STEP_FAMILIES)
        self.steps: list[StepFamily] = [s for s in built if s is not None]
        self.bindings: list[RoleBinding] = list(signals.role_bindings)
        self.user_id_header = user_id_header.lower()
        self.user_groups_header = user_groups_header.lower()
        self.fail_open = fail_open
        self.clock = clock
        self.roles = list(dict.fromkeys(b.role for b in self.bindings))

    @property
    def language(self) -> bool:
        """A language rule is declared (its detector is worth warming)."""
        return any(s.family == "language" for s in self.steps)

    def configured(self) -> set[SignalKey]:
        """Every key these families can produce."""
        keys: set[SignalKey] = {("authz", role) for role in self.roles}
        for step in self.steps:
            keys |= step.keys(None)
        return keys

    def warm(self) -> None:
        """Load the language models now (when a language rule exists), not on a request."""
        for step in self.steps:
            if step.family == "language":
                step.load()

    def evaluate(
        self, view: RequestView, wanted: set[SignalKey] | None = None, *, authz: bool = True
    ) -> dict[SignalKey, SignalResult]:
        return self.report(view, wanted, authz=authz).results

    def report(
        self,
        view: RequestView,
        wanted: set[SignalKey] | frozenset[SignalKey] | None = None,
        *,
        authz: bool = True,
    ) -> StepReport:
        """The results with upstream's per-family metrics (for eval)."""
        by_family = wanted_names(wanted)
        steps = [
            (s, by_family.get(s.family) if wanted is not None else None)
            for s in self.steps
            if wanted is None or s.family in by_family
        ]
        out = run_steps(steps, view, self.clock)
        if authz and self.bindings and (wanted is None or "authz" in by_family):
            start = self.clock.monotonic()
            granted = self.granted_roles(view.headers)
            for role in self.roles:
                out.results[("authz", role)] = HIT if role in granted else MISS
            elapsed_ms = (self.clock.monotonic() - start) * 1000.0
            out.metrics["authz"] = FamilyMetric(elapsed_ms, 1.0)
            out.timings_ms["authz"] = elapsed_ms
        return out

    def granted_roles(self, headers: Mapping[str, str]) -> list[str]:
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


def wanted_names(wanted: set[SignalKey] | frozenset[SignalKey] | None) -> dict[str, Names]:
    """Wanted keys by family: {family: its wanted names}."""
    out: dict[str, set[str]] = {}
    for kind, name in wanted or ():
        out.setdefault(kind, set()).add(name)
    return {kind: frozenset(names) for kind, names in out.items()}
