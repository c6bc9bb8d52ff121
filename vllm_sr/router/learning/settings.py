"""Effective Router Learning settings: upstream's defaults and its rules for a decision's
``adaptations`` (``learning_config.go``: a component's mode inherits the decision's, never goes
beyond it, and ``bypass`` turns both off)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from vllm_sr.config.learning_rules import DEFAULT_CANDIDATE_SET, CandidateSet, candidate_set_of
from vllm_sr.config.routing import Adaptations
from vllm_sr.config.routing import LearningAdaptation as DecisionAdaptation
from vllm_sr.config.routing import LearningProtection as DecisionProtection
from vllm_sr.config.upstream_learning import (
    LearningAdaptation,
    LearningIdentity,
    LearningIdentityHeaders,
    LearningProtection,
    LearningTuning,
    RouterLearning,
)

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
    def from_config(cls, learning: RouterLearning | None) -> LearningSettings:
        """From ``global.router.learning`` (None: off)."""
        if learning is None or not learning.enabled:
            return cls()
        adaptation = learning.adaptation or LearningAdaptation()
        protection = learning.protection or LearningProtection()
        headers = (protection.identity or LearningIdentity()).headers or LearningIdentityHeaders()
        ttl = learning.state_store.ttl_seconds if learning.state_store else None
        return cls(
            enabled=True,
            adaptation=adaptation.enabled is not False,
            candidate_set=candidate_set_of(adaptation.candidate_set) or DEFAULT_CANDIDATE_SET,
            strategy=_text(adaptation.strategy) or "routing_sampling",
            protection=protection.enabled is not False,
            scope=_text(protection.scope) or "conversation",
            session_header=_text(headers.session) or SESSION_HEADER,
            conversation_header=_text(headers.conversation) or CONVERSATION_HEADER,
            tuning=_tuning(Tuning(), protection.tuning),
            state_ttl_s=float(ttl or 0) or DEFAULT_STATE_TTL_S,
        )


@dataclass(frozen=True)
class DecisionLearning:
    """One decision's effective modes, candidate set and protection tuning."""

    adaptation_mode: str
    protection_mode: str
    candidate_set: CandidateSet
    tuning: Tuning


def for_decision(settings: LearningSettings, adaptations: Adaptations | None) -> DecisionLearning:
    """Upstream's ``AdaptationMode``, ``ProtectionMode``, ``AdaptationCandidateSet`` and
    ``ApplyProtectionTuning`` for a decision's ``adaptations`` (None: apply everywhere)."""
    given = adaptations or Adaptations()
    mode = _text(given.mode) or APPLY
    adaptation = given.adaptation or DecisionAdaptation()
    protection = given.protection or DecisionProtection()
    tuning = settings.tuning
    if protection.stability_weight is not None:
        tuning = replace(tuning, stability_weight=float(protection.stability_weight))
    if protection.switch_margin is not None:
        tuning = replace(tuning, switch_margin=float(protection.switch_margin))
    return DecisionLearning(
        adaptation_mode=_component_mode(mode, _text(adaptation.mode)),
        protection_mode=_component_mode(mode, _text(protection.mode)),
        candidate_set=candidate_set_of(adaptation.candidate_set) or settings.candidate_set,
        tuning=tuning,
    )


def changes_at_execution(settings: LearningSettings, adaptations: Adaptations | None) -> bool:
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


def _tuning(base: Tuning, tuning: LearningTuning | None) -> Tuning:
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


def _text(value: object) -> str:
    return value.strip() if isinstance(value, str) else ""
