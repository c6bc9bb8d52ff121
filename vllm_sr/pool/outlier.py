"""Outlier ejection of a deployment's replicas: the cluster's consecutive-failure rules
(:mod:`vllm_sr.cluster.ejection`) applied to timeouts in a row, with the pool's own settings
(``PoolSettings``' outlier_detection, in ms; the cool-down doubles per ejection since the last
success, and one replica may always be out).

Pure decisions over replica records; ``ReplicaPool`` applies them and emits the events. The
rules, in the order they are checked (the first that holds an ejection back names it in
``replica_ejection_withheld``): ``one_worker``, ``no_other_replica_answered`` (another ready,
not ejected replica has answered since the start of the first timed-out exchange of this
replica's current run: a model that is slow on every replica keeps them all),
``max_ejection_percent``.

See docs/outlier-detection.md for where this differs from Envoy's outlier detection.
"""

from __future__ import annotations

from collections.abc import Iterable

from vllm_sr.cluster import ejection
from vllm_sr.cluster.ejection import (
    RULE_MAX_PERCENT,
    RULE_NO_OTHER_ANSWERED,
    RULE_ONE_WORKER,
    RULES,
    Decision,
    EjectionRules,
)
from vllm_sr.pool.replica import Replica

__all__ = [
    "RULES",
    "RULE_MAX_PERCENT",
    "RULE_NO_OTHER_ANSWERED",
    "RULE_ONE_WORKER",
    "WHY_COOLDOWN",
    "WHY_MANUAL",
    "WHY_NO_OTHER",
    "WHY_SUCCESS",
    "WHY_UNDRAIN",
    "Decision",
    "decide",
    "rules",
]

# Why a replica was readmitted (the ``why`` field of ``replica_readmitted``).
WHY_COOLDOWN = "cooldown_ended"
WHY_SUCCESS = "success"
WHY_NO_OTHER = "no_other_replica"
WHY_MANUAL = "manual"
WHY_UNDRAIN = "undrain"  # `ctl readmit` of a replica `ctl drain` took out


def rules(
    consecutive_timeouts: int = 3,
    base_ejection_ms: int = 30_000,
    max_ejection_ms: int = 300_000,
    max_ejection_percent: int = 50,
) -> EjectionRules:
    """A deployment's ``outlier_detection`` (validated by ``PoolSettings``) as cluster rules,
    in ms: ``consecutive_timeouts: 0`` turns ejection off (the failure backoff stays)."""
    return EjectionRules(
        threshold=consecutive_timeouts,
        base=base_ejection_ms,
        cap=max_ejection_ms,
        max_percent=max_ejection_percent,
        growth="double",
        at_least_one=True,
    )


def decide(policy: EjectionRules, replica: Replica, replicas: Iterable[Replica]) -> Decision:
    """Whether ``replica``, which has just timed out again, is ejected now (the decision's
    ``duration`` in ms).

    ``replicas`` is the whole deployment, ``replica`` included. The caller only asks while
    ejection is enabled, the replica is not already ejected and its run of timeouts has
    reached the threshold."""
    everyone = list(replicas)
    began = replica.timeouts.began_at
    answered = any(
        r.serving
        and not r.ejected
        and r.last_success_at is not None
        and (began is None or r.last_success_at > began)
        for r in everyone
        if r is not replica
    )
    return ejection.decide(
        policy,
        members=len(everyone),
        out=sum(1 for r in everyone if r.ejected),
        nth=replica.ejection_level + 1,
        another_answered=answered,
    )
