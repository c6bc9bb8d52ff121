"""A scripted control backend for tests (the control API's and the dashboard's): an inventory of
deployments and replicas, every submitted command recorded, simple state changes applied with
the events the real supervisor would publish, and switches to refuse or hold commands."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from vllm_sr import events as ev
from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.errors import Conflict, InvalidRequest, NotFound, VllmSrError
from vllm_sr.events import EventBus
from vllm_sr.control.commands import Command

DEFAULT_BASE_EJECTION_MS = 30_000
T = TypeVar("T")


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


def sample_adaptive_threads(
    state: str = "learned", retire_reason: str | None = None
) -> dict[str, Any]:
    """An ``adaptive_threads`` report shaped like the worker's (``AdaptiveThreads.report()``),
    for inventories in tests: two buckets, counts 1 and 2, 1 thread learned best."""

    def count(
        threads: int, samples: int, median_ms: float | None, ratio: float | None
    ) -> dict[str, Any]:
        return {"threads": threads, "samples": samples, "median_ms": median_ms, "ratio": ratio}

    recommended = None if state == "retired" else 1
    return {
        "mode": 1,
        "state": state,
        "configured": 2,
        "budget": 2,
        "allowed": [1, 2],
        "golden_passed": True,
        "window": 8,
        "min_samples": 5,
        "share": 0.1,
        "max_shadow_per_s": 5.0,
        "buckets": [
            {
                "bucket": "9-16",
                "tokens_max": 16,
                "phase": "learned",
                "forwards": 120,
                "explored": 10,
                "best": 1,
                "serving": 2,
                "matches": 0,
                "counts": [count(1, 5, 3.1, 0.8), count(2, 5, 3.9, 1.0)],
            },
            {
                "bucket": "65-128",
                "tokens_max": 128,
                "phase": "exploring",
                "forwards": 12,
                "explored": 2,
                "best": None,
                "serving": 2,
                "matches": 0,
                "counts": [count(1, 1, 21.0, None), count(2, 1, 15.2, 1.0)],
            },
        ],
        "best_threads": recommended,
        "recommended_threads": recommended,
        "recommendation": None if recommended is None else f"pin --threads {recommended}",
        "retire_reason": retire_reason,
        "shadow_passes": 12,
        "shadow_seconds": 0.09,
        "shadow_time_share": 0.05,
    }


class ThreadedControlServer:
    """A ``ControlServer`` for ``backend`` on an event loop of its own thread, for blocking
    tests (the CLI, the sync client). ``call(fn, *args)`` runs ``fn`` on that loop."""

    def __init__(self, backend: FakeBackend, path: str | Path, **kwargs: Any) -> None:
        self.backend = backend
        self.path = path
        self._kwargs = kwargs
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server: Any = None

    def __enter__(self) -> ThreadedControlServer:
        from vllm_sr.control.server import ControlServer

        self._thread.start()
        self.server = ControlServer(self.backend, self.path, **self._kwargs)
        self.run(self.server.start())
        return self

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        async def _call() -> T:
            return fn(*args)

        return self.run(_call())

    def __exit__(self, *exc: object) -> None:
        try:
            self.run(self.server.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
            self.loop.close()
