"""What the supervisor runs, and how a new generation differs from the running one.

``ServicePlan`` is the supervisor's view of a planned service: per deployment its settings and
replica specs (placement ``ReplicaSpec`` objects, or anything with ``id``, ``deployment``,
``device`` and ``identity()``). ``diff_plans`` decides, per replica, keep / start / retire: a
worker whose id and identity (artifact, revision, engine args, device, threads) are unchanged
keeps its process; changes to anything else (bindings, signals, timeouts, outlier settings)
never restart a worker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_sr.pool.settings import PoolSettings


@dataclass
class DeploymentPlan:
    name: str
    artifact: str
    replicas: list[Any]
    # The deployment's one settings object (deadline, ejection, limits set in config),
    # built once from the schema (``PoolSettings.from_deployment``).
    settings: PoolSettings = field(default_factory=PoolSettings)


@dataclass
class ServicePlan:
    deployments: dict[str, DeploymentPlan]
    default_deployment: str
    config: dict[str, Any] = field(default_factory=dict)  # the effective config, for /v1/config
    # Router mode's settings (``vllm_sr.frontend.chat_mount.RouterPlan``); None in tests that
    # build plans by hand (Engine mode).
    router: Any = None
    listen: str | None = None  # HOST:PORT of config.yaml's first listener (serve's default)
    embedded_default: str | None = None  # the built-in artifact served when no model_catalog

    def specs(self) -> list[Any]:
        return [spec for d in self.deployments.values() for spec in d.replicas]


@dataclass
class PlanDiff:
    keep: list[Any]  # new specs whose running worker stays (same id and identity)
    start: list[Any]  # new specs that need a new worker
    retire: list[str]  # ids of running workers not in the new plan (or replaced)

    @property
    def changed(self) -> bool:
        return bool(self.start or self.retire)


def diff_plans(running: Mapping[str, Any], new_specs: Iterable[Any]) -> PlanDiff:
    """``running`` maps replica id -> the spec its worker runs."""
    keep: list[Any] = []
    start: list[Any] = []
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
