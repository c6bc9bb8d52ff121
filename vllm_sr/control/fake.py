"""A scripted control backend for tests (the control API's and the dashboard's): an inventory of
deployments and replicas, every submitted command recorded, simple state changes applied with
the events the real supervisor would publish, and switches to refuse or hold commands."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_sr import events as ev
from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.errors import Conflict, InvalidRequest, NotFound, VllmSrError
from vllm_sr.events import EventBus
from vllm_sr.supervisor.commands import Command

DEFAULT_BASE_EJECTION_MS = 30_000


@dataclass
class FakeReplica:
    id: str
    deployment: str
    device: str
    pid: int | None
    state: str = "ready"
    inflight: int = 0
    max_inflight: int = 32
    outstanding_bytes: int = 0
    restarts: int = 0
    ejections: int = 0
    ejected_until: float | None = None
    consecutive_timeouts: int = 0
    last_error: str | None = None
    threads: int | None = 1
    limits: dict[str, Any] = field(
        default_factory=lambda: {"max_num_seqs": 64, "max_num_batched_tokens": 8192}
    )
    requests: int = 0
    requests_per_s: float = 0.0
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    adaptive_threads: dict[str, Any] | None = None

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "deployment": self.deployment,
            "device": self.device,
            "pid": self.pid,
            "state": self.state,
            "ready": self.ready,
            "inflight": self.inflight,
            "max_inflight": self.max_inflight,
            "outstanding_bytes": self.outstanding_bytes,
            "restarts": self.restarts,
            "limits": dict(self.limits),
            "last_error": self.last_error,
            "ejected_until": self.ejected_until,
            "ejections": self.ejections,
            "consecutive_timeouts": self.consecutive_timeouts,
            "threads": self.threads,
            "requests": self.requests,
            "requests_per_s": self.requests_per_s,
            "latency_p50_ms": self.latency_p50_ms,
            "latency_p99_ms": self.latency_p99_ms,
            "adaptive_threads": self.adaptive_threads,
        }

    def who(self) -> dict[str, Any]:
        return {
            "deployment": self.deployment,
            "replica": self.id,
            "device": self.device,
            "pid": self.pid,
        }


class FakeBackend:
    """``FakeBackend({"primary": ["cpu", "cpu"]})``: deployment -> the device of each replica.

    ``refuse`` (an error) makes every submit raise it; ``hold`` (an ``asyncio.Event``) makes
    submits wait until it is set. ``commands`` lists what was submitted, in order."""

    def __init__(
        self,
        deployments: Mapping[str, Sequence[str]] | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        events: EventBus | None = None,
        artifact: str = "vllm-sr/d3-edge",
        config: dict[str, Any] | None = None,
    ) -> None:
        self.clock = clock
        self.events = events if events is not None else EventBus(capacity=1000, clock=clock)
        self.artifact = artifact
        self.generation = 1
        self.started_at = clock.time()
        self.commands: list[Command] = []
        self.refuse: VllmSrError | None = None
        self.hold: asyncio.Event | None = None
        self._next_pid = 40_000
        self.deployments: dict[str, list[FakeReplica]] = {}
        for name, devices in (deployments or {"primary": ["cpu", "cpu"]}).items():
            self.deployments[name] = [self._new_replica(name, i, d) for i, d in enumerate(devices)]
        self._config = config

    def _new_replica(self, deployment: str, index: int, device: str) -> FakeReplica:
        self._next_pid += 1
        return FakeReplica(f"{deployment}-{index}", deployment, device, self._next_pid)

    # --- reads ------------------------------------------------------------------------

    def replica(self, replica_id: str) -> FakeReplica:
        for replicas in self.deployments.values():
            for replica in replicas:
                if replica.id == replica_id:
                    return replica
        known = ", ".join(r.id for rs in self.deployments.values() for r in rs)
        raise NotFound(f"no replica {replica_id!r}; replicas: {known or 'none'}")

    def _deployment_json(self, name: str, replicas: list[FakeReplica]) -> dict[str, Any]:
        ready = sum(r.ready for r in replicas)
        state = "ready" if ready == len(replicas) else "degraded" if ready else "unavailable"
        return {
            "name": name,
            "artifact": self.artifact,
            "state": state,
            "desired_replicas": len(replicas),
            "ready_replicas": ready,
            "ejected_replicas": sum(r.state == "ejected" for r in replicas),
            "replicas": [r.to_json() for r in replicas],
        }

    def inventory(self) -> dict[str, Any]:
        now = self.clock.time()
        return {
            "service": {
                "version": "0.1.0",
                "host": os.uname().nodename,
                "pid": os.getpid(),
                "started_at": self.started_at,
                "uptime_s": now - self.started_at,
                "generation": self.generation,
            },
            "deployments": [self._deployment_json(n, rs) for n, rs in self.deployments.items()],
        }

    def health(self) -> dict[str, Any]:
        states = {d["name"]: d["state"] for d in self.inventory()["deployments"]}
        status = "ready" if all(s == "ready" for s in states.values()) else "degraded"
        if states and all(s == "unavailable" for s in states.values()):
            status = "unavailable"
        return {"status": status, "deployments": states, "generation": self.generation}

    def effective_config(self) -> dict[str, Any]:
        if self._config is not None:
            return self._config
        deployments = {
            name: {
                "provider": "model_runtime",
                "artifact": self.artifact,
                "replicas": [{"device": r.device} for r in replicas],
            }
            for name, replicas in self.deployments.items()
        }
        return {"global": {"model_catalog": {"deployments": deployments}}}

    # --- commands ---------------------------------------------------------------------

    async def submit(self, command: Command) -> dict[str, Any]:
        self.commands.append(command)
        if self.hold is not None:
            await self.hold.wait()
        if self.refuse is not None:
            raise self.refuse
        handler = getattr(self, f"_handle_{command.kind}", None)
        if handler is None:
            raise InvalidRequest(f"kind: unknown command {command.kind!r}")
        result: dict[str, Any] = handler(command)
        return result

    def _handle_drain(self, command: Command) -> dict[str, Any]:
        replica = self.replica(str(command.replica))
        replica.state = "draining"
        self.events.publish(ev.REPLICA_DRAINING, **replica.who(), reason="manual")
        return {"replica": replica.id, "state": replica.state}

    def _handle_eject(self, command: Command) -> dict[str, Any]:
        replica = self.replica(str(command.replica))
        duration_ms = command.duration_ms or DEFAULT_BASE_EJECTION_MS
        replica.state = "ejected"
        replica.ejections += 1
        replica.ejected_until = self.clock.time() + duration_ms / 1000
        self.events.publish(
            ev.REPLICA_EJECTED,
            **replica.who(),
            timeouts=replica.consecutive_timeouts,
            duration_ms=duration_ms,
            reason="manual",
        )
        return {
            "replica": replica.id,
            "state": replica.state,
            "duration_ms": duration_ms,
            "ejected_until": replica.ejected_until,
        }

    def _handle_readmit(self, command: Command) -> dict[str, Any]:
        replica = self.replica(str(command.replica))
        if replica.state != "ejected":
            raise Conflict(f"replica {replica.id} is not ejected (state {replica.state})")
        replica.state = "ready"
        replica.ejected_until = None
        self.events.publish(ev.REPLICA_READMITTED, **replica.who(), why="manual")
        return {"replica": replica.id, "state": replica.state}

    def _handle_restart(self, command: Command) -> dict[str, Any]:
        replica = self.replica(str(command.replica))
        self._next_pid += 1
        replica.pid = self._next_pid
        replica.restarts += 1
        replica.state = "ready"
        replica.ejected_until = None
        self.events.publish(
            ev.REPLICA_RESTARTED, **replica.who(), restarts=replica.restarts, backoff_s=0.0
        )
        return {"replica": replica.id, "state": replica.state, "pid": replica.pid}

    def _handle_scale(self, command: Command) -> dict[str, Any]:
        name = str(command.deployment)
        if name not in self.deployments:
            known = ", ".join(self.deployments) or "none"
            raise NotFound(f"no deployment {name!r}; deployments: {known}")
        replicas = self.deployments[name]
        target = int(command.replicas or 0)
        device = replicas[-1].device if replicas else "cpu"
        while len(replicas) < target:
            replicas.append(self._new_replica(name, len(replicas), device))
        while len(replicas) > target:
            gone = replicas.pop()
            self.events.publish(ev.REPLICA_STOPPED, **gone.who())
        self._publish_pool()
        return {"deployment": name, "replicas": target, "generation": self.generation}

    def _handle_reload(self, command: Command) -> dict[str, Any]:
        self._publish_pool()
        return {"generation": self.generation}

    def _handle_stop(self, command: Command) -> dict[str, Any]:
        return {}

    def _publish_pool(self) -> None:
        self.generation += 1
        self.events.publish(
            ev.POOL_PUBLISHED, generation=self.generation, deployments=list(self.deployments)
        )
