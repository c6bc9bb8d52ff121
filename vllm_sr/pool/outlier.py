"""Outlier ejection rules: when a replica that keeps timing out may be taken out of dispatch.

Pure decisions over replica records; ``ReplicaPool`` applies them and emits the events.
The rules, in the order they are checked (the first that holds an ejection back names it in
``replica_ejection_withheld``):

1. ``one_worker``: a deployment with one worker never ejects it.
2. ``no_other_replica_answered``: a replica is ejected only while another ready, not ejected
   replica has answered (a successful exchange) since its timeouts began, i.e. since the
   start of the first timed-out exchange of its current run. A model that is slow on every
   replica keeps them all.
3. ``max_ejection_percent``: at most that share of the deployment's replicas are out at
   once, rounded down, but one may always be.

See docs/outlier-detection.md for where this differs from Envoy's outlier detection.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from vllm_sr.pool.replica import Replica

RULE_ONE_WORKER = "one_worker"
RULE_NO_OTHER_ANSWERED = "no_other_replica_answered"
RULE_MAX_PERCENT = "max_ejection_percent"
RULES = (RULE_ONE_WORKER, RULE_NO_OTHER_ANSWERED, RULE_MAX_PERCENT)

# Why a replica was readmitted (the ``why`` field of ``replica_readmitted``).
WHY_COOLDOWN = "cooldown_ended"
WHY_SUCCESS = "success"
WHY_NO_OTHER = "no_other_replica"
WHY_MANUAL = "manual"
WHY_UNDRAIN = "undrain"  # `ctl readmit` of a replica `ctl drain` took out


@dataclass(frozen=True)
class OutlierPolicy:
    """The deployment's ``outlier_detection`` settings, validated by ``PoolSettings``."""

    consecutive_timeouts: int = 3
    base_ejection_ms: int = 30_000
    max_ejection_ms: int = 300_000
    max_ejection_percent: int = 50

    @property
    def enabled(self) -> bool:
        """``consecutive_timeouts: 0`` turns ejection off (the failure backoff stays)."""
        return self.consecutive_timeouts > 0

    def duration_ms(self, level: int) -> int:
        """Cool-down of the ejection at ``level`` (0 for the first since the last success):
        the base, doubled for each ejection before it, capped at ``max_ejection_ms``."""
        # Cap the exponent so a replica ejected for days does not build a huge integer.
        return min(self.base_ejection_ms << min(level, 40), self.max_ejection_ms)

    def max_ejected(self, replicas: int) -> int:
        """How many of ``replicas`` may be ejected at once: the percentage rounded down,
        but never fewer than one (the rule "one may always be out")."""
        return max(1, replicas * self.max_ejection_percent // 100)


@dataclass(frozen=True)
class Decision:
    eject: bool
    rule: str | None = None  # the rule that held the ejection back
    duration_ms: int = 0


def decide(policy: OutlierPolicy, replica: Replica, replicas: Iterable[Replica]) -> Decision:
    """Whether ``replica``, which has just timed out again, is ejected now.

    ``replicas`` is the whole deployment, ``replica`` included. The caller only asks while
    ejection is enabled, the replica is not already ejected and its run of timeouts has
    reached the threshold."""
    everyone = list(replicas)
    others = [r for r in everyone if r is not replica]
    if not others:
        return Decision(False, RULE_ONE_WORKER)
    began = replica.timeouts_began_at
    answered = any(
        r.serving
        and not r.ejected
        and r.last_success_at is not None
        and (began is None or r.last_success_at > began)
        for r in others
    )
    if not answered:
        return Decision(False, RULE_NO_OTHER_ANSWERED)
    out = sum(1 for r in everyone if r.ejected)
    if out + 1 > policy.max_ejected(len(everyone)):
        return Decision(False, RULE_MAX_PERCENT)
    return Decision(True, None, policy.duration_ms(replica.ejection_level))
