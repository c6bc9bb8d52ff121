"""Replica pool: admission, dispatch and outlier ejection (pure logic, see pool.py)."""

from __future__ import annotations

from vllm_sr.pool.pool import Lease, PoolSettings, ReplicaPool
from vllm_sr.pool.replica import OUTCOMES, Outcome, Replica, ReplicaState

__all__ = [
    "OUTCOMES",
    "Lease",
    "Outcome",
    "PoolSettings",
    "Replica",
    "ReplicaPool",
    "ReplicaState",
]
