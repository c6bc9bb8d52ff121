"""How a new generation differs from the running one.

``diff_plans`` decides, per replica, keep / start / retire: a worker whose id and identity
(artifact, revision, engine args, device, threads) are unchanged keeps its process; changes to
anything else (bindings, signals, timeouts, outlier settings) never restart a worker. The plan
records themselves (``ServicePlan``, ``DeploymentPlan``, ``ReplicaSpec``) live in
``vllm_sr.plan``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vllm_sr.plan import ReplicaSpec


@dataclass
class PlanDiff:
    keep: list[ReplicaSpec]  # new specs whose running worker stays (same id and identity)
    start: list[ReplicaSpec]  # new specs that need a new worker
    retire: list[str]  # ids of running workers not in the new plan (or replaced)

    @property
    def changed(self) -> bool:
        return bool(self.start or self.retire)


def diff_plans(running: Mapping[str, ReplicaSpec], new_specs: Iterable[ReplicaSpec]) -> PlanDiff:
    """``running`` maps replica id -> the spec its worker runs."""
    keep: list[ReplicaSpec] = []
    start: list[ReplicaSpec] = []
    matched: set[str] = set()
    for spec in new_specs:
        old = running.get(spec.id)
        if old is not None and old.identity() == spec.identity():
            keep.append(spec)
            matched.add(spec.id)
        else:
            start.append(spec)
    retire = [rid for rid in running if rid not in matched]
    return PlanDiff(keep, start, retire)
