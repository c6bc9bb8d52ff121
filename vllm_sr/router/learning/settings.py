"""Effective Router Learning settings: upstream's defaults and its rules for a decision's
``adaptations`` (``learning_config.go``: a component's mode inherits the decision's, never goes
beyond it, and ``bypass`` turns both off)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from vllm_sr.config.learning_rules import DEFAULT_CANDIDATE_SET, CandidateSet, candidate_set_of

APPLY, OBSERVE, BYPASS = "apply", "observe", "bypass"
SESSION_HEADER = "x-session-id"
CONVERSATION_HEADER = "x-conversation-id"
DEFAULT_STATE_TTL_S = 24 * 3600.0  # upstream's router memory TTL


@dataclass(frozen=True)
class Tuning:
    """Protection knobs with upstream's defaults (``DefaultSessionAwareConfig``)."""

    idle_timeout_s: float = 300.0
    min_turns_before_switch: int = 1
    switch_margin: float = 0.05
    stability_weight: float = 1.0


@dataclass(frozen=True)
class LearningSettings:
    enabled: bool = False
    adaptation: bool = False
    candidate_set: CandidateSet = DEFAULT_CANDIDATE_SET
    strategy: str = "routing_sampling"
    protection: bool = False
    scope: str = "conversation"
    session_header: str = SESSION_HEADER
    conversation_header: str = CONVERSATION_HEADER
    tuning: Tuning = Tuning()
    state_ttl_s: float = DEFAULT_STATE_TTL_S

    @classmethod
    def from_config(cls, learning: Any) -> LearningSettings:
        """From ``global.router.learning`` (a ``RouterLearning`` or None)."""
        if learning is None or not learning.enabled:
            return cls()
        adaptation = learning.adaptation
        protection = learning.protection
        headers = _get(_get(protection, "identity"), "headers")
        tuning = _get(protection, "tuning")
        store = learning.state_store
        return cls(
            enabled=True,
            adaptation=_get(adaptation, "enabled") is not False,
            candidate_set=candidate_set_of(_get(adaptation, "candidate_set"))
            or DEFAULT_CANDIDATE_SET,
            strategy=_text(_get(adaptation, "strategy")) or "routing_sampling",
            protection=_get(protection, "enabled") is not False,
            scope=_text(_get(protection, "scope")) or "conversation",
            session_header=_text(_get(headers, "session")) or SESSION_HEADER,
            conversation_header=_text(_get(headers, "conversation")) or CONVERSATION_HEADER,
            tuning=_tuning(Tuning(), tuning),
            state_ttl_s=float(_get(store, "ttl_seconds") or 0) or DEFAULT_STATE_TTL_S,
        )


@dataclass(frozen=True)
class DecisionLearning:
    """One decision's effective modes, candidate set and protection tuning."""

    adaptation_mode: str
    protection_mode: str
    candidate_set: CandidateSet
    tuning: Tuning


def for_decision(settings: LearningSettings, adaptations: Any) -> DecisionLearning:
    """Upstream's ``AdaptationMode``, ``ProtectionMode``, ``AdaptationCandidateSet`` and
    ``ApplyProtectionTuning`` for a decision's ``adaptations`` (None: apply everywhere)."""
    mode = _text(_get(adaptations, "mode")) or APPLY
    adaptation = _get(adaptations, "adaptation")
    protection = _get(adaptations, "protection")
    tuning = settings.tuning
    weight = _get(protection, "stability_weight")
    margin = _get(protection, "switch_margin")
    if weight is not None:
        tuning = replace(tuning, stability_weight=float(weight))
    if margin is not None:
        tuning = replace(tuning, switch_margin=float(margin))
    return DecisionLearning(
        adaptation_mode=_component_mode(mode, _text(_get(adaptation, "mode"))),
        protection_mode=_component_mode(mode, _text(_get(protection, "mode"))),
        candidate_set=candidate_set_of(_get(adaptation, "candidate_set")) or settings.candidate_set,
        tuning=tuning,
    )


def changes_at_execution(settings: LearningSettings, adaptations: Any) -> bool:
    """Whether learning may change a decision's model when a chat runs (upstream's eval then
    answers ``execution_required``): learning on, and adaptation or protection on in apply
    mode for the decision."""
    if not settings.enabled:
        return False
    d = for_decision(settings, adaptations)
    return (settings.adaptation and d.adaptation_mode == APPLY) or (
        settings.protection and d.protection_mode == APPLY
    )


def _component_mode(decision_mode: str, component: str) -> str:
    if decision_mode == BYPASS or not component:
        return decision_mode
    if decision_mode == OBSERVE and component == APPLY:
        return OBSERVE
    return component


def _tuning(base: Tuning, tuning: Any) -> Tuning:
    if tuning is None:
        return base
    idle = tuning.idle_timeout_seconds
    turns = tuning.min_turns_before_switch
    margin = tuning.switch_margin
    weight = tuning.stability_weight
    return Tuning(
        idle_timeout_s=base.idle_timeout_s if idle is None else float(idle),
        min_turns_before_switch=base.min_turns_before_switch if turns is None else int(turns),
        switch_margin=base.switch_margin if margin is None else float(margin),
        stability_weight=base.stability_weight if weight is None else float(weight),
    )


def _get(obj: Any, key: str) -> Any:
    return None if obj is None else getattr(obj, key, None)


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""
