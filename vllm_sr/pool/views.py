"""The pool's reports: its deployment's inventory entry and its counters for /metrics (read
only; built on demand, so the request path pays nothing for them)."""

from __future__ import annotations

from typing import Protocol

from vllm_sr.clock import Clock
from vllm_sr.jsontypes import JsonObject
from vllm_sr.pool.ejection import Outliers
from vllm_sr.pool.replica import Replica
from vllm_sr.pool.settings import PoolSettings


class ReplicaPool(Protocol):
    """What the reports read of a ``vllm_sr.pool.pool.ReplicaPool``."""

    deployment: str
    artifact: str
    desired_replicas: int | None
    settings: PoolSettings
    outliers: Outliers
    rejected: dict[str, int]
    retries: int

    @property
    def frontend_cache_bytes(self) -> int: ...

    def replicas(self) -> list[Replica]: ...


def inventory(pool: ReplicaPool, clock: Clock) -> JsonObject:
    replicas = pool.replicas()
    desired = pool.desired_replicas if pool.desired_replicas is not None else len(replicas)
    ready = sum(1 for r in replicas if r.serving)
    ejected = sum(1 for r in replicas if r.ejected and r.serving)
    serving = ready - ejected
    if serving == 0:
        state = "unavailable"
    elif serving >= desired and len(replicas) >= desired:
        state = "ready"
    else:
        state = "degraded"
    limit = pool.settings.max_inflight_per_replica
    return {
        "name": pool.deployment,
        "artifact": pool.artifact,
        "state": state,
        "desired_replicas": desired,
        "ready_replicas": ready,
        "ejected_replicas": ejected,
        "frontend_cache_bytes": pool.frontend_cache_bytes,
        "replicas": [r.inventory(limit, clock) for r in replicas],
    }


def metrics(pool: ReplicaPool) -> JsonObject:
    return {
        "deployment": pool.deployment,
        "replicas": {
            r.id: {
                "state": r.display_state(),
                "inflight": r.inflight,
                "outstanding_bytes": r.outstanding_bytes,
                "admitted_requests": r.admitted_requests,
                "admitted_bytes": r.admitted_bytes,
                "requests": dict(r.outcomes),
                "by_kind": dict(r.by_kind),
                "restarts": r.restarts,
                "ejections": r.ejections,
                "readmissions": r.readmissions,
                "consecutive_timeouts": r.consecutive_timeouts,
                "ejected": r.ejected,
            }
            for r in pool.replicas()
        },
        "withheld": dict(pool.outliers.withheld),
        "rejected": dict(pool.rejected),
        "retries": pool.retries,
    }
