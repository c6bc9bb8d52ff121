"""What one request's Router Learning did, per method (upstream's routerLearningPolicy), and
the debug headers that say it: ``x-vsr-learning-{methods,actions,scopes,reasons}`` (method-keyed
pairs, adaptation first) and ``x-vsr-session-phase``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

ADAPTATION, PROTECTION = "adaptation", "protection"

H_LEARNING_METHODS = "x-vsr-learning-methods"
H_LEARNING_ACTIONS = "x-vsr-learning-actions"
H_LEARNING_SCOPES = "x-vsr-learning-scopes"
H_LEARNING_REASONS = "x-vsr-learning-reasons"
H_SESSION_PHASE = "x-vsr-session-phase"


@dataclass(frozen=True)
class Policy:
    method: str
    mode: str
    action: str
    reason: str
    scope: str = ""
    phase: str = ""  # protection's view of the turn: user_turn or tool_loop
    details: Mapping[str, object] = field(default_factory=dict)


@dataclass
class Policies:
    adaptation: Policy | None = None
    protection: Policy | None = None

    def listed(self) -> list[Policy]:
        return [p for p in (self.adaptation, self.protection) if p is not None]

    def headers(self) -> dict[str, str]:
        """The debug headers (empty values left out, as upstream does)."""
        listed = self.listed()
        if not listed:
            return {}
        out = {H_LEARNING_METHODS: ",".join(p.method for p in listed)}
        for name, attr in (
            (H_LEARNING_ACTIONS, "action"),
            (H_LEARNING_SCOPES, "scope"),
            (H_LEARNING_REASONS, "reason"),
        ):
            pairs = [f"{p.method}={getattr(p, attr)}" for p in listed if getattr(p, attr)]
            if pairs:
                out[name] = ",".join(pairs)
        if self.protection is not None and self.protection.phase:
            out[H_SESSION_PHASE] = self.protection.phase
        return out
