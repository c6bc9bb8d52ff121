"""A control backend for tests (the control API's, the CLI's and the dashboard's), built on the
real ``ReplicaPool`` and ``EventBus`` so it cannot drift from the service.

Its inventory and health are the supervisor's own (``Supervisor.inventory`` and
``Supervisor.health`` run on this object: the same envelope, fields and states); drain, eject
and readmit answer as ``CommandHandlers.handle_drain/handle_eject/handle_readmit`` do, through the
same pool calls, so the events (``replica_ejected``, ``replica_draining`` with
``reason="control"`` ...) are the real ones. Processes are what it leaves out: a replica is
ready as soon as it is added, and a restart is a new pid at once. Test switches: ``refuse`` (an
error every submit raises), ``hold`` (an ``asyncio.Event`` submits wait on); ``commands`` lists
what was submitted, in order."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

from vllm_sr import events as ev
from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.control.commands import Command
from vllm_sr.errors import Conflict, InvalidRequest, NotFound, VllmSrError
from vllm_sr.events import EventBus
from vllm_sr.pool.pool import ReplicaPool
from vllm_sr.pool.replica import Replica
from vllm_sr.pool.settings import PoolSettings
from vllm_sr.pool.stats import LatencyWindow, RateWindow
from vllm_sr.supervisor.config_source import ConfigSource
from vllm_sr.supervisor.keeper import TaskKeeper
from vllm_sr.supervisor.signal_procs import SignalProcesses
from vllm_sr.supervisor.supervisor import Supervisor

T = TypeVar("T")
LIMITS = {"max_num_seqs": 64, "max_num_batched_tokens": 8192}
_SERVICE = cast(Any, Supervisor)  # its views run on this backend (duck-typed: same fields)


class StubRouter:
    """Router mode's views as a test gives them (``Supervisor(router=...)``)."""

    def __init__(
        self,
        inventory: Callable[[], dict[str, Any] | None] = lambda: None,
        replay: Callable[[str | None, int, str | None, str | None], Awaitable[dict[str, Any]]]
        | None = None,
        chat: Any = None,
    ) -> None:
        self._inventory, self._replay = inventory, replay
        self.chat = chat  # the chat router (its replay log and learning), as the chat mount's

    def inventory(self) -> dict[str, Any] | None:
        return self._inventory()

    async def replay(
        self,
        decision: str | None = None,
        since: int = 0,
        recipe: str | None = None,
        session: str | None = None,
    ) -> dict[str, Any]:
        if self._replay is None:
            return {"records": [], "last_seq": 0, "decisions": []}
        return await self._replay(decision, since, recipe, session)


class FakeBackend:
    """``FakeBackend({"primary": ["cpu", "cpu"]})``: deployment -> the device of each replica."""

    def __init__(
        self,
        deployments: Mapping[str, Sequence[str]] | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        events: EventBus | None = None,
        artifact: str = "vllm-sr/d3-edge",
        config: dict[str, Any] | None = None,
        settings: PoolSettings | None = None,
    ) -> None:
        self.clock = clock
        self.events = events if events is not None else EventBus(capacity=1000, clock=clock)
        self.artifact = artifact
        self.settings = settings or PoolSettings()
        self.generation = 1
        self.started_at = clock.time()
        self.stopping = False
        self.commands: list[Command] = []
        self.refuse: VllmSrError | None = None
        self.hold: asyncio.Event | None = None
        self.pools: dict[str, ReplicaPool] = {}
        self.keeper = TaskKeeper(clock, self.events.publish)  # the service tasks' failures
        self.router: StubRouter | None = None  # Router mode's views (Supervisor's ``router``)
        self.config_source: ConfigSource | None = None  # config.yaml's hashes (serve's)
        self.plan: Any = None  # Supervisor.health reads it (None: no plan, the pools decide)
        # The signal processes (none here: the inventory leaves them out, as a supervisor's)
        self.signal_procs = SignalProcesses(0, None, self.events.publish)
        self._next_pid = 40_000
        self._config = config
        self.reset(deployments or {"primary": ["cpu", "cpu"]})

    # --- building ---------------------------------------------------------------------

    def reset(self, deployments: Mapping[str, Sequence[str]], first_pid: int | None = None) -> None:
        """Replace every deployment: ``name -> devices``, each replica ready at once."""
        if first_pid is not None:
            self._next_pid = first_pid - 1
        self.pools = {}
        for name, devices in deployments.items():
            pool = self._new_pool(name, len(devices))
            for index, device in enumerate(devices):
                self._add(pool, index, device)

    def _new_pool(self, name: str, desired: int) -> ReplicaPool:
        pool = ReplicaPool(
            name,
            settings=self.settings,
            clock=self.clock,
            emit=self.events.publish,
            artifact=self.artifact,
            desired_replicas=desired,
        )
        self.pools[name] = pool
        return pool

    def _add(self, pool: ReplicaPool, index: int, device: str) -> Replica:
        self._next_pid += 1
        rid = f"{pool.deployment}-{index}"
        record = pool.add_replica(rid, device, self._next_pid)
        pool.mark_ready(rid, self._next_pid, dict(LIMITS), threads=1)
        return record

    # --- reads ------------------------------------------------------------------------

    def pool_of(self, replica_id: str) -> ReplicaPool:
        for pool in self.pools.values():
            if replica_id in pool:
                return pool
        known = sorted(r.id for p in self.pools.values() for r in p.replicas())
        raise NotFound(f"no replica {replica_id!r}; known: {known}")

    def replica(self, replica_id: str) -> Replica:
        """The pool's own record of ``replica_id``."""
        return self.pool_of(replica_id).replica(replica_id)

    def replica_ids(self) -> list[str]:
        return [r.id for pool in self.pools.values() for r in pool.replicas()]

    def who(self, replica_id: str) -> dict[str, Any]:
        r = self.replica(replica_id)
        return {"deployment": r.deployment, "replica": r.id, "device": r.device}

    def inventory(self) -> dict[str, Any]:
        inventory: dict[str, Any] = _SERVICE.inventory(self)
        return inventory

    def health(self) -> dict[str, Any]:
        health: dict[str, Any] = _SERVICE.health(self)
        return health

    async def replay(
        self,
        decision: str | None = None,
        since: int = 0,
        recipe: str | None = None,
        session: str | None = None,
    ) -> dict[str, Any]:
        records: dict[str, Any] = await _SERVICE.replay(self, decision, since, recipe, session)
        return records

    async def outcome(self, outcome: Any) -> dict[str, Any]:
        result: dict[str, Any] = await _SERVICE.outcome(self, outcome)
        return result

    def _router_chat(self) -> Any:
        return _SERVICE._router_chat(self)

    def effective_config(self) -> dict[str, Any]:
        if self._config is not None:
            return self._config
        deployments = {
            name: {
                "provider": "model_runtime",
                "artifact": self.artifact,
                "replicas": [{"device": r.device} for r in pool.replicas()],
            }
            for name, pool in self.pools.items()
        }
        return {"global": {"model_catalog": {"deployments": deployments}}}

    # --- state a test sets (what the supervisor's hooks and the request path would) ------

    def set_adaptive_threads(self, replica_id: str, report: dict[str, Any] | None) -> None:
        """What the supervisor does with a worker's /health ``adaptive_threads``."""
        self.pool_of(replica_id).set_adaptive_threads(replica_id, report)

    def fail(self, replica_id: str, reason: str) -> None:
        """The worker exited for good (the supervisor's ``on_failed``)."""
        self.pool_of(replica_id).mark_failed(replica_id, reason)
        self.events.publish(ev.REPLICA_FAILED, **self.who(replica_id), reason=reason)

    def set_traffic(self, replica_id: str, **figures: float) -> None:
        """Writes traffic figures into the pool's record, as its request path leaves them:
        ``inflight``, ``outstanding_bytes``, ``requests`` (successes), ``requests_per_s``
        (over the pool's 10 s rate window), ``latency_p50_ms``, ``latency_p99_ms``."""
        r = self.replica(replica_id)
        unknown = set(figures) - {
            "inflight",
            "outstanding_bytes",
            "requests",
            "requests_per_s",
            "latency_p50_ms",
            "latency_p99_ms",
        }
        if unknown:
            raise TypeError(f"set_traffic: unknown figures {sorted(unknown)}")
        if "inflight" in figures:
            r.inflight = int(figures["inflight"])
        if "outstanding_bytes" in figures:
            r.outstanding_bytes = int(figures["outstanding_bytes"])
        if "requests" in figures:
            r.outcomes["success"] = int(figures["requests"])
        if "requests_per_s" in figures:
            r.rate = RateWindow(self.clock)
            r.rate.add(round(figures["requests_per_s"] * 10))
        if "latency_p50_ms" in figures or "latency_p99_ms" in figures:
            # Two samples: nearest rank gives p50 = the first, p99 = the second.
            p50 = figures.get("latency_p50_ms", figures.get("latency_p99_ms", 0.0))
            p99 = figures.get("latency_p99_ms", p50)
            r.latency = LatencyWindow()
            r.latency.add(p50 / 1000.0)
            r.latency.add(p99 / 1000.0)

    # --- commands ---------------------------------------------------------------------

    async def submit(self, command: Command) -> dict[str, Any]:
        """As ``Supervisor._apply`` answers: the handler's dict, or a typed error."""
        self.commands.append(command)
        if self.hold is not None:
            await self.hold.wait()
        if self.refuse is not None:
            raise self.refuse
        handler = getattr(self, f"handle_{command.kind}", None)
        if handler is None:
            raise NotFound(f"unknown command {command.kind!r}")
        try:
            result: dict[str, Any] = handler(command)
        except VllmSrError:
            raise
        except Exception as exc:
            raise VllmSrError(f"{command.kind} failed: {exc}") from exc
        return result

    def _published(self, replica_id: str | None) -> tuple[Replica, ReplicaPool]:
        for pool in self.pools.values():
            if replica_id in pool:
                return pool.replica(str(replica_id)), pool
        raise NotFound(f"no replica {replica_id!r}; known: {sorted(self.replica_ids())}")

    def handle_eject(self, cmd: Command) -> dict[str, Any]:
        rep, pool = self._published(cmd.replica)
        pool.outliers.eject(rep.id, duration_ms=cmd.duration_ms)
        return {"ok": True, "replica": rep.id, "state": pool.replica(rep.id).display_state()}

    def handle_readmit(self, cmd: Command) -> dict[str, Any]:
        rep, pool = self._published(cmd.replica)
        pool.outliers.readmit(rep.id)
        return {"ok": True, "replica": rep.id, "state": pool.replica(rep.id).display_state()}

    def handle_drain(self, cmd: Command) -> dict[str, Any]:
        rep, pool = self._published(cmd.replica)
        pool.mark_draining(rep.id)
        self.events.publish(ev.REPLICA_DRAINING, **self.who(rep.id), pid=rep.pid, reason="control")
        return {"ok": True, "replica": rep.id, "inflight": pool.replica(rep.id).inflight}

    def handle_restart(self, cmd: Command) -> dict[str, Any]:
        """The supervisor's restart without a process: exited, restarted, ready at once."""
        rep, pool = self._published(cmd.replica)
        self._check_not_stopping()
        old_pid, reason = rep.pid, "restarted on request"
        pool.mark_exited(rep.id, reason)
        rep.restart_reason = reason
        self.events.publish(
            ev.REPLICA_EXITED, **self.who(rep.id), pid=old_pid, returncode=-15, reason=reason
        )
        self._next_pid += 1
        pool.mark_starting(rep.id, self._next_pid)
        restarts = pool.increment_restarts(rep.id)
        self.events.publish(
            ev.REPLICA_RESTARTED, **self.who(rep.id), pid=self._next_pid, restarts=restarts
        )
        pool.mark_ready(rep.id, self._next_pid, dict(rep.limits or LIMITS), rep.threads)
        self.events.publish(
            ev.REPLICA_READY, **self.who(rep.id), pid=self._next_pid, limits=rep.limits
        )
        return {"replica": rep.id, "old_pid": old_pid, "pid": self._next_pid}

    def handle_scale(self, cmd: Command) -> dict[str, Any]:
        """The scaler (a config edit in the service) then a reload's answer and events."""
        self._check_not_stopping()
        if cmd.deployment is None or cmd.replicas is None or cmd.replicas < 0:
            raise InvalidRequest(
                f"scale needs a deployment and replicas >= 0, got {cmd.deployment!r}, "
                f"{cmd.replicas!r}"
            )
        pool = self.pools.get(cmd.deployment)
        if pool is None:
            known = ", ".join(self.pools) or "none"
            raise NotFound(f"no deployment {cmd.deployment!r}; deployments: {known}")
        replicas = pool.replicas()
        device = replicas[-1].device if replicas else "cpu"
        started = [self._add(pool, i, device).id for i in range(len(replicas), cmd.replicas)]
        retired = [r.id for r in replicas[cmd.replicas :]]
        for rid in retired:
            rep = pool.replica(rid)
            pool.mark_draining(rid)
            self.events.publish(ev.REPLICA_DRAINING, **self.who(rid), pid=rep.pid, reason="reload")
        pool.apply_settings(pool.settings, cmd.replicas)
        answer = self._publish(started, retired)
        for rid in retired:  # nothing in flight here: the drains end at once
            pid = pool.replica(rid).pid
            pool.mark_stopped(rid)
            self.events.publish(ev.REPLICA_STOPPED, **self.who(rid), pid=pid)
            pool.remove_replica(rid)
        return answer

    def handle_reload(self, cmd: Command) -> dict[str, Any]:
        self._check_not_stopping()
        return self._publish([], [])

    def handle_stop(self, cmd: Command) -> dict[str, Any]:
        self.stopping = True
        return {"ok": True, "quick": cmd.quick}

    def _publish(self, started: list[str], retired: list[str]) -> dict[str, Any]:
        self.generation += 1
        self.events.publish(
            ev.POOL_PUBLISHED, generation=self.generation, deployments=list(self.pools)
        )
        kept = [rid for rid in self.replica_ids() if rid not in started and rid not in retired]
        return {
            "ok": True,
            "generation": self.generation,
            "kept": kept,
            "started": started,
            "retired": retired,
        }

    def _check_not_stopping(self) -> None:
        if self.stopping:
            raise Conflict("the service is stopping")


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
