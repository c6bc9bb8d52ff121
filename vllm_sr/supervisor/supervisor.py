"""The supervisor: owns the worker processes and the pools the frontend dispatches through.

One loop takes ``Command``s off one queue and applies each with ``handle_<kind>``; signal
handlers and the control API only enqueue. Long work a command starts (a reload waiting for new
workers, a drain before stop) runs as a task the supervisor owns, so the loop stays free to take
a second signal (quick stop) or another command. Process lifecycles are ``ManagedReplica`` tasks
that report through the ``on_*`` hooks below: every state change reaches the pool and the event
bus here, once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from vllm_sr import __version__
from vllm_sr import events as ev
from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.errors import Conflict, ModelNotFound, NotFound, VllmSrError
from vllm_sr.events import EventBus
from vllm_sr.pool.client import WorkerClient
from vllm_sr.pool.pool import PoolSettings, ReplicaPool
from vllm_sr.supervisor import reload_task
from vllm_sr.supervisor.attached import AttachedReplica
from vllm_sr.control.commands import Command, CommandQueue
from vllm_sr.supervisor.managed import ManagedReplica, ProcessOptions
from vllm_sr.supervisor.reload import DeploymentPlan, ServicePlan
from vllm_sr.supervisor.reload_task import Scaler
from vllm_sr.supervisor.systemd import SystemdNotifier, status_line

log = logging.getLogger("vllm_sr.supervisor")

Planner = Callable[[], ServicePlan]
PROBE_TIMEOUT_S = 2.0
QUICK_GRACE_S = 1.0
MAINTAIN_INTERVAL_S = 0.05
STATUS_EVERY = 4  # rounds between STATUS= checks (the inventory is not free)


def pool_settings(dep: DeploymentPlan) -> PoolSettings:
    values: dict[str, Any] = {
        "timeout_ms": dep.timeout_ms,
        "configured_max_num_seqs": dep.max_num_seqs,
        "configured_max_num_batched_tokens": dep.max_num_batched_tokens,
    }
    values.update({k: v for k, v in dep.outlier.items() if v is not None})
    return PoolSettings(**values)


class Supervisor:
    def __init__(
        self,
        planner: Planner,
        *,
        runtime_dir: str | Path,
        options: ProcessOptions | None = None,
        events: EventBus | None = None,
        clock: Clock = SYSTEM_CLOCK,
        notifier: SystemdNotifier | None = None,
        drain_timeout_s: float = 30.0,
    ) -> None:
        self.planner = planner
        self.runtime_dir = Path(runtime_dir).absolute()
        self.workers_dir = self.runtime_dir / "workers"
        self.options = options or ProcessOptions()
        self.events = events or EventBus(clock=clock)
        self.clock = clock
        self.notifier = notifier or SystemdNotifier(env={})
        self.drain_timeout_s = drain_timeout_s
        self.queue = CommandQueue()
        self.plan: ServicePlan | None = None
        self.pools: dict[str, ReplicaPool] = {}  # published: what the frontend dispatches to
        self.replicas: dict[str, ManagedReplica] = {}  # every live worker, staged ones too
        self.published: set[str] = set()
        self.generation = 0
        self.started_at = clock.time()
        self.admitting = True
        self.stopping = False
        self._quick = asyncio.Event()
        self._stopped = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._announced_ready = False
        self._last_status = ""
        self.on_change: list[Callable[[], None]] = []
        self.scaler: Scaler | None = None  # writes a new replica count into config (scale)
        self._reload_task: asyncio.Task[None] | None = None
        self._staged: dict[int, ManagedReplica] = {}
        self._own_cpus: list[int] = []

    # ------------------------------------------------------------------ frontend seam
    def resolve(self, model: str | None) -> tuple[ReplicaPool, DeploymentPlan]:
        """The published pool and plan for ``model`` (a deployment name; None = default)."""
        assert self.plan is not None
        name = model or self.plan.default_deployment
        pool = self.pools.get(name)
        dep = self.plan.deployments.get(name)
        if pool is None or dep is None:
            if (
                model is not None
                and model
                == self.plan.deployments.get(
                    self.plan.default_deployment, DeploymentPlan("", "", [])
                ).artifact
            ):
                return self.resolve(None)  # the artifact name of the default deployment
            raise ModelNotFound(
                f"model {name!r} is not a deployment; known: {sorted(self.pools)}", model=name
            )
        return pool, dep

    def client(self, replica_id: str) -> WorkerClient:
        return self.replicas[replica_id].client

    # ------------------------------------------------------------------ control-API backend
    def inventory(self) -> dict[str, Any]:
        now = self.clock.time()
        deployments = []
        for name, pool in self.pools.items():
            doc = pool.inventory()
            doc.setdefault("name", name)
            deployments.append(doc)
        return {
            "service": {
                "version": __version__,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "started_at": self.started_at,
                "uptime_s": round(now - self.started_at, 3),
                "generation": self.generation,
            },
            "deployments": deployments,
        }

    def health(self) -> dict[str, Any]:
        ready = {name: sum(1 for r in p.replicas() if r.serving) for name, p in self.pools.items()}
        ok = bool(ready) and all(n > 0 for n in ready.values()) and not self.stopping
        status = "stopping" if self.stopping else ("ready" if ok else "unavailable")
        return {"status": status, "ready": ok, "deployments": ready, "generation": self.generation}

    def effective_config(self) -> dict[str, Any]:
        return dict(self.plan.config) if self.plan else {}

    async def submit(self, command: Command) -> dict[str, Any]:
        return await self.queue.submit(command)

    # ------------------------------------------------------------------ start / run
    def _socket_path(self, replica_id: str) -> str:
        path = self.workers_dir / f"{replica_id}.sock"
        if any(r.socket_path == str(path) for r in self.replicas.values()):
            # A replacement runs beside its predecessor until it is ready.
            path = self.workers_dir / f"{replica_id}.g{self.generation + 1}.sock"
        return str(path)

    def _spawn(self, spec: Any) -> ManagedReplica:
        if getattr(spec, "endpoint", None):
            return AttachedReplica(spec, self, self.options, self.clock)
        return ManagedReplica(spec, self._socket_path(spec.id), self, self.options, self.clock)

    async def start(self) -> None:
        """Plan, spawn every worker, publish the pools. Workers join dispatch as they get ready."""
        self.workers_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.workers_dir, 0o700)
        self.plan = self.planner()
        for dep in self.plan.deployments.values():
            self.pools[dep.name] = self._new_pool(dep)
        for spec in self.plan.specs():
            rep = self._spawn(spec)
            self.replicas[spec.id] = rep
            self.published.add(spec.id)
            where = spec.device or getattr(spec, "endpoint", None)
            rep.record = self.pools[spec.deployment].add_replica(spec.id, str(where))
            rep.start()
        self.notifier.extend_timeout(self.options.ready_timeout_s + 30)
        self.place_self()
        self._task(self._maintain(), "maintain")
        self._task(self.notifier.run_watchdog(), "watchdog")
        self.events.publish(
            ev.POOL_PUBLISHED, generation=self.generation, deployments=list(self.pools)
        )

    def place_self(self) -> None:
        """Keep the service's own per-request work off the workers' pinned CPUs when some are
        left over (the page: per-request work small and off the forward's cores)."""
        if self.plan is None:
            return
        specs = [s for s in self.plan.specs() if not getattr(s, "endpoint", None)]
        if not specs or not all(getattr(s, "cpus", None) for s in specs):
            return  # an unpinned worker would inherit a narrowed set: leave it all
        pinned = {c for spec in specs for c in spec.cpus}
        with contextlib.suppress(psutil.Error, OSError, AttributeError):
            me = psutil.Process()
            if not self._own_cpus:
                self._own_cpus = list(me.cpu_affinity() or [])
            rest = [c for c in self._own_cpus if c not in pinned]
            me.cpu_affinity(rest or self._own_cpus)

    def _new_pool(self, dep: DeploymentPlan) -> ReplicaPool:
        return ReplicaPool(
            dep.name,
            settings=pool_settings(dep),
            clock=self.clock,
            emit=self.events.publish,
            artifact=dep.artifact,
            desired_replicas=len(dep.replicas),
        )

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(
                sig, self.queue.put_nowait, Command("stop", source=f"signal:{sig.name}")
            )
        loop.add_signal_handler(
            signal.SIGHUP, self.queue.put_nowait, Command("reload", source="signal:SIGHUP")
        )

    async def run(self) -> None:
        """The one loop: apply commands until a stop has finished."""
        while not self._stopped.is_set():
            getter = asyncio.ensure_future(self.queue.get())
            stopped = asyncio.ensure_future(self._stopped.wait())
            done, _ = await asyncio.wait({getter, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                stopped.cancel()
                break
            stopped.cancel()
            await self._apply(getter.result())

    async def _apply(self, cmd: Command) -> None:
        handler = getattr(self, f"handle_{cmd.kind}", None)
        try:
            if handler is None:
                raise NotFound(f"unknown command {cmd.kind!r}")
            result = await handler(cmd)
        except VllmSrError as exc:
            if cmd.done is not None and not cmd.done.done():
                cmd.done.set_exception(exc)
            elif cmd.done is None:
                log.warning("%s (%s): %s", cmd.kind, cmd.source, exc.message)
            return
        except Exception as exc:
            log.exception("command %s failed", cmd.kind)
            if cmd.done is not None and not cmd.done.done():
                cmd.done.set_exception(VllmSrError(f"{cmd.kind} failed: {exc}"))
            return
        if cmd.done is not None and not cmd.done.done() and result is not None:
            cmd.done.set_result(result)

    def _task(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ maintenance
    async def _maintain(self) -> None:
        """Drive the pools' clocks (ejection cool-downs, backoffs) and run their /health probes."""
        probing: set[str] = set()
        rounds = 0
        while True:
            rounds += 1
            for pool in list(self.pools.values()):
                pool.tick()  # also schedules re-probes of replicas a failed probe took out
                for rid in pool.take_probe_requests():
                    if rid in probing or rid not in self.replicas:
                        continue
                    probing.add(rid)
                    self._task(self._probe(pool, rid, probing), f"probe-{rid}")
            if rounds % STATUS_EVERY == 0:
                self._publish_status()
            await asyncio.sleep(MAINTAIN_INTERVAL_S)

    async def _probe(self, pool: ReplicaPool, rid: str, probing: set[str]) -> None:
        try:
            status, _ = await self.replicas[rid].client.health(timeout_s=PROBE_TIMEOUT_S)
            ok = status == 200
        except (VllmSrError, KeyError):
            ok = False
        finally:
            probing.discard(rid)
        if rid in pool:
            pool.probe_result(rid, ok)

    def _publish_status(self) -> None:
        """STATUS= on every change; READY=1 once every deployment has a ready replica."""
        if self.stopping:
            return
        text = status_line(self.inventory())
        if text != self._last_status:
            self._last_status = text
            self.notifier.status(text)
            for callback in self.on_change:
                callback()
        if not self._announced_ready and self.health()["ready"]:
            self._announced_ready = True
            self.notifier.ready(text)
            self.events.publish(ev.SERVICE_READY, generation=self.generation)

    # ------------------------------------------------------------------ lifecycle hooks
    def _pool_of(self, rep: ManagedReplica) -> ReplicaPool | None:
        if rep.id not in self.published or self.replicas.get(rep.id) is not rep:
            return None
        return self.pools.get(rep.spec.deployment)

    def _who(self, rep: ManagedReplica) -> dict[str, Any]:
        return {
            "deployment": rep.spec.deployment,
            "replica": rep.id,
            "device": str(rep.spec.device),
        }

    def on_starting(self, rep: ManagedReplica, restarted: bool) -> None:
        pool = self._pool_of(rep)
        if pool is not None:
            pool.mark_starting(rep.id, rep.pid)
            pool.set_restarts(rep.id, rep.restarts)
        if restarted:
            self.events.publish(
                ev.REPLICA_RESTARTED, **self._who(rep), pid=rep.pid, restarts=rep.restarts
            )
        else:
            self.events.publish(ev.REPLICA_STARTING, **self._who(rep), pid=rep.pid)

    def on_ready(self, rep: ManagedReplica) -> None:
        pool = self._pool_of(rep)
        if pool is not None:
            pool.mark_ready(rep.id, rep.pid, rep.limits, rep.health.get("threads"))
        self.events.publish(ev.REPLICA_READY, **self._who(rep), pid=rep.pid, limits=rep.limits)

    def on_exited(self, rep: ManagedReplica, returncode: int, reason: str) -> None:
        pool = self._pool_of(rep)
        if pool is not None:
            pool.mark_exited(rep.id, reason)
        pid = rep.process.pid if rep.process else None
        self.events.publish(
            ev.REPLICA_EXITED, **self._who(rep), pid=pid, returncode=returncode, reason=reason
        )

    def on_backoff(self, rep: ManagedReplica, delay_s: float) -> None:
        pool = self._pool_of(rep)
        if pool is not None:
            pool.mark_backoff_restart(rep.id, self.clock.monotonic() + delay_s)

    def on_failed(self, rep: ManagedReplica, reason: str) -> None:
        pool = self._pool_of(rep)
        if pool is not None:
            pool.mark_failed(rep.id, reason)
        self.events.publish(ev.REPLICA_FAILED, **self._who(rep), reason=reason)

    # ------------------------------------------------------------------ commands
    def _published_replica(self, replica_id: str | None) -> tuple[ManagedReplica, ReplicaPool]:
        rep = self.replicas.get(replica_id or "")
        pool = self._pool_of(rep) if rep is not None else None
        if rep is None or pool is None:
            raise NotFound(f"no replica {replica_id!r}; known: {sorted(self.published)}")
        return rep, pool

    async def handle_eject(self, cmd: Command) -> dict[str, Any]:
        rep, pool = self._published_replica(cmd.replica)
        pool.eject(rep.id, duration_ms=cmd.duration_ms)
        return {"ok": True, "replica": rep.id, "state": pool.replica(rep.id).display_state()}

    async def handle_readmit(self, cmd: Command) -> dict[str, Any]:
        rep, pool = self._published_replica(cmd.replica)
        pool.readmit(rep.id)
        return {"ok": True, "replica": rep.id, "state": pool.replica(rep.id).display_state()}

    async def handle_restart(self, cmd: Command) -> dict[str, Any] | None:
        rep, _ = self._published_replica(cmd.replica)
        self._check_not_stopping()
        if isinstance(rep, AttachedReplica):
            await rep.restart()  # refuses: someone else runs it
        self._task(self._restart(rep, cmd), f"restart-{rep.id}")
        return None  # answered once the new process is running

    async def _restart(self, rep: ManagedReplica, cmd: Command) -> None:
        old_pid = rep.pid
        await rep.restart()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.stop_grace_s + 10.0
        while rep.pid in (None, old_pid) and rep.state != "failed" and loop.time() < deadline:
            await asyncio.sleep(0.02)
        if cmd.done is not None and not cmd.done.done():
            cmd.done.set_result({"replica": rep.id, "old_pid": old_pid, "pid": rep.pid})

    async def handle_drain(self, cmd: Command) -> dict[str, Any]:
        rep, pool = self._published_replica(cmd.replica)
        pool.drain(rep.id)
        self.events.publish(ev.REPLICA_DRAINING, **self._who(rep), pid=rep.pid, reason="control")
        return {"ok": True, "replica": rep.id, "inflight": pool.replica(rep.id).inflight}

    async def handle_reload(self, cmd: Command) -> dict[str, Any] | None:
        return await reload_task.reload(self, cmd)

    async def handle_scale(self, cmd: Command) -> dict[str, Any] | None:
        return await reload_task.scale(self, cmd)

    async def handle_stop(self, cmd: Command) -> dict[str, Any]:
        if self.stopping:
            self._quick.set()  # a second signal: skip the drain, shorten the grace
            return {"ok": True, "quick": True}
        self.stopping = True
        self.admitting = False
        if cmd.quick:
            self._quick.set()
        reload_task.cancel_reload(self)
        self.notifier.stopping()
        self.events.publish(ev.SERVICE_STOPPING, quick=self._quick.is_set())
        self._task(self._stop_all(), "stop")
        return {"ok": True, "quick": self._quick.is_set()}

    async def _stop_all(self) -> None:
        try:
            await self._drain_all()
            grace = QUICK_GRACE_S if self._quick.is_set() else self.options.stop_grace_s
            reps = [*self.replicas.values(), *self._staged.values()]
            stopping = asyncio.gather(
                *(self._stop_replica(rep, grace) for rep in reps), return_exceptions=True
            )
            quick: asyncio.Future[Any] = asyncio.ensure_future(self._quick.wait())
            pending: set[asyncio.Future[Any]] = {stopping, quick}
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if not stopping.done():  # a second signal while waiting for the grace: no more
                for rep in reps:
                    rep.kill_now()
                await stopping
            quick.cancel()
        finally:
            for task in list(self._tasks):
                if task is not asyncio.current_task():
                    task.cancel()
            self._stopped.set()

    async def _drain_all(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout_s
        while not self._quick.is_set() and loop.time() < deadline:
            busy = sum(r.inflight for p in self.pools.values() for r in p.replicas())
            if busy == 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._quick.wait(), 0.05)

    async def _stop_replica(self, rep: ManagedReplica, grace_s: float) -> None:
        pid = rep.pid
        await rep.stop(grace_s)
        pool = self._pool_of(rep)
        if pool is not None:
            pool.mark_stopped(rep.id)
        self.events.publish(ev.REPLICA_STOPPED, **self._who(rep), pid=pid)

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def kill_all_now(self) -> None:
        """On the way out after an error: never leave a worker behind."""
        for rep in self.replicas.values():
            rep.kill_now()

    def _check_not_stopping(self) -> None:
        if self.stopping:
            raise Conflict("the service is stopping")
