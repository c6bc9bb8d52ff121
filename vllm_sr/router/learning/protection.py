"""Protection's switch step (upstream's SessionAwareSelector as Router Learning configures it,
``router_learning_protection.go``), pure: given the conversation's state, the candidates and
their scores, which model the turn goes to and why.

The scores: the current model gets a stay bias (0.10) and a prefix-cache benefit; another model
pays a handoff penalty (0.05), a prefix-cache penalty, a switch-history penalty, the
``switch_margin`` and, when it does not score above the current model to begin with, the stay
bias. ``stability_weight`` scales the handoff, prefix-cache, switch-history and tool-loop
terms. Hard locks keep the current model outright: an active tool loop, and fewer turns than
``min_turns_before_switch``. An idle conversation (``idle_timeout_seconds``) starts over: no
lock, no switch costs. Session scope keeps the session's model while it is not idle."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from vllm_sr.router.learning.policy import PROTECTION, Policy
from vllm_sr.router.learning.settings import APPLY, OBSERVE, Tuning

STAY_BIAS = 0.10
TOOL_LOOP_STAY_BIAS = 0.35
PREFIX_CACHE_WEIGHT = 0.20
HANDOFF_PENALTY = 0.05
MAX_CACHE_COST_MULTIPLIER = 2.5
SWITCH_HISTORY_WEIGHT = 0.04
DEFAULT_CACHE_WARMTH = 0.5  # upstream's value when no cache telemetry is known


class Evidence(Protocol):
    good_fit: int
    underpowered: int
    failed: int


@dataclass(frozen=True)
class Conversation:
    """The conversation's state at this turn (None fields: a new conversation)."""

    model: str = ""
    turns: int = 0
    switches: int = 0
    idle_s: float | None = None
    turn_index: int = 0  # user turns before this one, from the messages
    active_tool_loop: bool = False
    history_tokens: int = 0
    context_tokens: int = 0


@dataclass(frozen=True)
class SwitchInput:
    mode: str
    scope: str
    tuning: Tuning
    conversation: Conversation
    candidates: Sequence[str]  # in the decision's order; the current model last if added
    scores: Mapping[str, float]  # the proposal's scores (missing candidates: 0)
    base_model: str  # the decision's own pick
    proposal: str  # adaptation's pick (or the base)
    cost_pressure: Mapping[str, float] = field(default_factory=dict)
    evidence: Callable[[str], Evidence] | None = None


@dataclass(frozen=True)
class SwitchResult:
    model: str
    policy: Policy
    scores: dict[str, float]


def effective_turns(c: Conversation) -> int:
    return max(c.turns, c.turn_index)


def phase_of(c: Conversation) -> str:
    return "tool_loop" if c.active_tool_loop else "user_turn"


def switch(inp: SwitchInput) -> SwitchResult:
    c, t = inp.conversation, inp.tuning
    current = c.model
    idle_expired = c.idle_s is not None and t.idle_timeout_s > 0 and c.idle_s >= t.idle_timeout_s
    rescue = _rescue(inp, idle_expired)
    if rescue is not None:
        return rescue
    if inp.scope == "session" and current in inp.candidates and not idle_expired:
        return _result(inp, current, "session_scope_protect", dict(inp.scores))
    if not current:
        return _result(inp, inp.proposal, "missing_previous_model", dict(inp.scores))
    if current not in inp.candidates:
        return _result(inp, inp.proposal, "previous_model_not_in_candidates", dict(inp.scores))
    lock = _hard_lock(c, t, idle_expired)
    if lock:
        return _result(inp, current, lock, dict(inp.scores), hard_lock=True)
    adjusted = _adjusted(inp, idle_expired)
    best = max(inp.candidates, key=lambda m: adjusted[m])  # the first of equals
    reason = "stay_has_best_adjusted_score" if best == current else "switch_allowed"
    return _result(inp, best, reason, adjusted, idle_expired=idle_expired)


def _hard_lock(c: Conversation, t: Tuning, idle_expired: bool) -> str:
    if c.active_tool_loop:
        return "hard_lock=tool_loop"
    if effective_turns(c) < t.min_turns_before_switch and not idle_expired:
        return "hard_lock=min_turns"
    return ""


def _adjusted(inp: SwitchInput, idle_expired: bool) -> dict[str, float]:
    c, t = inp.conversation, inp.tuning
    w = t.stability_weight
    current = c.model
    mass = continuation_mass(c)
    warmth = DEFAULT_CACHE_WARMTH * (0.2 if idle_expired else 1.0)
    base = {m: float(inp.scores.get(m, 0.0)) for m in inp.candidates}
    out: dict[str, float] = {}
    stay = base[current]
    if not idle_expired:
        stay += STAY_BIAS + PREFIX_CACHE_WEIGHT * w * mass * warmth * _cost_mult(inp, current)
    if c.active_tool_loop:
        stay += TOOL_LOOP_STAY_BIAS * w
    out[current] = stay
    for m in inp.candidates:
        if m == current:
            continue
        score = base[m]
        if not idle_expired:
            prefix = PREFIX_CACHE_WEIGHT * w * mass * warmth * _cost_mult(inp, m)
            history = SWITCH_HISTORY_WEIGHT * w * min(max(c.switches / 8.0, 0.0), 1.0)
            score -= HANDOFF_PENALTY * w + prefix + history + t.switch_margin
            if base[m] - base[current] <= 0:
                score -= STAY_BIAS
        if c.active_tool_loop:
            score -= TOOL_LOOP_STAY_BIAS * w
        out[m] = score
    return out


def continuation_mass(c: Conversation) -> float:
    """How much of the conversation a switch would throw away (upstream's weights)."""
    context = max(c.context_tokens, 1)
    reuse = min(max(c.history_tokens / context, 0.0), 1.0)
    history = min(max(c.history_tokens / 8192.0, 0.0), 1.0)
    depth = min(max(effective_turns(c) / 8.0, 0.0), 1.0)
    return min(max(0.45 * reuse + 0.35 * history + 0.20 * depth, 0.0), 1.0)


def _cost_mult(inp: SwitchInput, candidate: str) -> float:
    pressure = max(
        inp.cost_pressure.get(inp.conversation.model, 0.5),
        inp.cost_pressure.get(candidate, 0.5),
    )
    return 1.0 + (MAX_CACHE_COST_MULTIPLIER - 1.0) * pressure


def _rescue(inp: SwitchInput, idle_expired: bool) -> SwitchResult | None:
    """A conversation on a model that keeps failing (or is judged underpowered) moves to the
    proposal when the proposal has better evidence or beats it by the margin."""
    current, proposal = inp.conversation.model, inp.proposal
    if inp.mode != APPLY or inp.evidence is None or not current or current == proposal:
        return None
    cur, prop = inp.evidence(current), inp.evidence(proposal)
    weak = cur.underpowered >= 2 and cur.underpowered > cur.good_fit
    if not weak and cur.failed < 2:
        return None
    gap = inp.scores.get(proposal, 0.0) - inp.scores.get(current, 0.0)
    if prop.good_fit <= prop.underpowered and gap < inp.tuning.switch_margin:
        return None
    policy = _policy(inp, "rescue_switch", "rescue_evidence")
    return SwitchResult(proposal, policy, dict(inp.scores))


def _result(
    inp: SwitchInput,
    model: str,
    reason: str,
    scores: dict[str, float],
    *,
    hard_lock: bool = False,
    idle_expired: bool = False,
) -> SwitchResult:
    current = inp.conversation.model
    if idle_expired:
        action, why = "establish_baseline", "idle_reset"
    elif not current:
        action = "establish_baseline"
        why = "new_session" if inp.scope == "session" else "new_conversation"
    elif hard_lock or model != inp.proposal:
        action, why = "hold_current", _normal(reason)
    else:
        action, why = "allow_switch", _normal(reason)
    if inp.mode == OBSERVE:  # computed, not acted on: the proposal stands
        return SwitchResult(inp.proposal, _policy(inp, "observe", "observe_only"), scores)
    return SwitchResult(model, _policy(inp, action, why, model), scores)


def _normal(reason: str) -> str:
    if "tool_loop" in reason:
        return "tool_or_protocol_state"
    if reason == "stay_has_best_adjusted_score":
        return "switch_margin_not_met"
    return reason


def _policy(inp: SwitchInput, action: str, reason: str, final: str = "") -> Policy:
    details = {
        "current_model": inp.conversation.model,
        "base_model": inp.base_model,
        "proposal_model": inp.proposal,
        "final_model": final or inp.proposal,
        "switch_margin": inp.tuning.switch_margin,
        "stability_weight": inp.tuning.stability_weight,
    }
    return Policy(
        PROTECTION,
        inp.mode,
        action,
        reason,
        inp.scope,
        phase_of(inp.conversation),
        details,
    )
