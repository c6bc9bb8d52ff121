"""The supervisor: owns the worker processes and the pools the frontend dispatches through.

One loop takes ``Command``s off one queue and applies each with ``handle_<kind>``; signal
handlers and the control API only enqueue. Long work a command starts (a reload waiting for new
workers, a drain before stop) runs as a task the supervisor owns, so the loop stays free to take
a second signal (quick stop) or another command. Worker lifecycles are ``ManagedReplica`` tasks
(made by the injected ``spawn`` factory, so tests can run the handlers without processes) that
report through the ``on_*`` hooks below: every state change reaches the pool and the event bus
here, once. Nothing polls: the maintenance task sleeps until the pools' next timed transition,
a requested probe or an event.
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

from vllm_sr import __version__
from vllm_sr import events as ev
from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.control.commands import Command, CommandQueue
from vllm_sr.errors import Conflict, NotFound, VllmSrError
from vllm_sr.events import Event, EventBus
from vllm_sr.pool.directory import PoolDirectory
from vllm_sr.pool.pool import ReplicaPool
from vllm_sr.supervisor.affinity import place_service
from vllm_sr.supervisor.attached import AttachedReplica
from vllm_sr.supervisor.fleet import Fleet, Spawn, mark_ready, size_caches, start_in_order, who
from vllm_sr.supervisor.keeper import TaskKeeper
from vllm_sr.supervisor.managed import ManagedReplica, ProcessOptions
from vllm_sr.supervisor.reconfigure import Planner, Reconfiguration, Scaler, resolve, wait_idle
from vllm_sr.supervisor.reload import ServicePlan
from vllm_sr.supervisor.systemd import SystemdNotifier, status_line
from vllm_sr.supervisor.usage import UsageSampler

log = logging.getLogger("vllm_sr.supervisor")

PROBE_TIMEOUT_S = 2.0
USAGE_EVERY_S = 2.0  # CPU %, RSS (and GPU usage) per worker
QUICK_GRACE_S = 1.0

__all__ = ["Planner", "Scaler", "Supervisor"]


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
        spawn: Spawn | None = None,
    ) -> None:
        self.planner = planner
        self.runtime_dir = Path(runtime_dir).absolute()
        self.workers_dir = self.runtime_dir / "workers"
        self.options = options or ProcessOptions()
        self.events = events or EventBus(clock=clock)
        self.clock = clock
        self.notifier = notifier or SystemdNotifier(env={})
        self.drain_timeout_s = drain_timeout_s
        self.spawn: Spawn = spawn or self._spawn_process
        self.usage = UsageSampler()
        self.queue = CommandQueue()
        self._wake = asyncio.Event()
        self.fleet = Fleet(clock, self.events.publish, on_wake=self._wake.set)
        self.keeper = TaskKeeper(clock, self.events.publish)
        self.started_at = clock.time()
        self.admitting = True
        self.stopping = False
        self._quick = asyncio.Event()
        self._stopped = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._announced_ready = False
        self._last_status = ""
        self._own_cpus: list[int] = []
        self._starts: list[Any] = []
        self.router_view: Callable[[], dict[str, Any] | None] | None = (
            None  # GPU workers waiting for a card's earlier worker
        )
        # router_replay's records (set by serve: the frontend's chat mount)
        self.replay_view: Callable[[str | None, int], dict[str, Any]] | None = None
        self.reconfiguration = Reconfiguration(
            self.fleet,
            planner,
            self.spawn,
            events=self.events,
            notifier=self.notifier,
            ready_timeout_s=self.options.ready_timeout_s,
            drain_timeout_s=drain_timeout_s,
            quick=self._quick,
            status=lambda: self._last_status or None,
            on_published=self.place_self,
        )
        self.reconfiguration.cache_bytes = self.options.worker_cache_bytes
        self.events.add_sink(self._on_event)

    # ------------------------------------------------------------------ views
    @property
    def directory(self) -> PoolDirectory:
        return self.fleet.directory

    @property
    def pools(self) -> dict[str, ReplicaPool]:
        return self.fleet.pools

    @property
    def replicas(self) -> dict[str, ManagedReplica]:
        return self.fleet.replicas

    @property
    def plan(self) -> ServicePlan | None:
        return self.fleet.plan

    @property
    def generation(self) -> int:
        return self.fleet.generation

    @property
    def scaler(self) -> Scaler | None:
        return self.reconfiguration.scaler

    @scaler.setter
    def scaler(self, value: Scaler | None) -> None:
        self.reconfiguration.scaler = value

    # ------------------------------------------------------------------ control-API backend
    def inventory(self) -> dict[str, Any]:
        now = self.clock.time()
        deployments = []
        for name, pool in list(self.pools.items()):
            entry = pool.inventory()
            entry.setdefault("name", name)
            deployments.append(entry)
        doc: dict[str, Any] = {
            "service": {
                "version": __version__,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "started_at": self.started_at,
                "uptime_s": round(now - self.started_at, 3),
                "generation": self.generation,
                "task_failures": dict(self.keeper.failures),
            },
            "deployments": deployments,
        }
        view = getattr(self, "router_view", None)  # set by serve: the frontend's chat mount
        router = view() if view is not None else None
        if router is not None:
            doc["router"] = router  # backends and decision counters (Router mode)
        return doc

    def replay(self, decision: str | None = None, since: int = 0) -> dict[str, Any]:
        """Router mode's router_replay records after ``since`` (of one decision, or all)."""
        view = getattr(self, "replay_view", None)  # set by serve: the frontend's chat mount
        if view is None:
            return {"records": [], "last_seq": 0, "decisions": []}
        records: dict[str, Any] = view(decision, since)
        return records

    def router_plan(self) -> Any:
        """Router mode's settings of the published generation (None: Engine mode)."""
        return self.plan.router if self.plan is not None else None

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
        if any(r.socket_path == str(path) for r in self.fleet.workers()):
            # A replacement runs beside its predecessor until it is ready.
            path = self.workers_dir / f"{replica_id}.g{self.generation + 1}.sock"
        return str(path)

    def _spawn_process(self, spec: Any) -> ManagedReplica:
        if getattr(spec, "endpoint", None):
            return AttachedReplica(spec, self, self.options, self.clock)
        return ManagedReplica(spec, self._socket_path(spec.id), self, self.options, self.clock)

    async def start(self) -> None:
        """Plan (in a thread: it may run rocm-smi), spawn every worker, publish the pools.
        Workers join dispatch as they get ready."""
        self.workers_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.workers_dir, 0o700)
        plan = await asyncio.to_thread(self.planner)
        workers = [self.spawn(spec) for spec in plan.specs()]
        self.fleet.first(plan, workers)
        size_caches(workers, plan, self.options.worker_cache_bytes)
        self._starts = start_in_order(workers, [])
        self.notifier.extend_timeout(self.options.ready_timeout_s + 30)
        self.place_self()
        # Kept: one that raises is reported and run again (supervision never dies silently).
        self._task(self.keeper.keep("maintain", self._maintain), "maintain")
        self._task(self.keeper.keep("watchdog", self.notifier.run_watchdog), "watchdog")
        self._task(self.keeper.keep("usage", self._sample_usage), "usage")
        self.events.publish(
            ev.POOL_PUBLISHED, generation=self.generation, deployments=list(self.pools)
        )

    async def _sample_usage(self) -> None:
        await self.usage.run(lambda: list(self.replicas.values()), USAGE_EVERY_S)

    def place_self(self) -> None:
        """Keep the service's own per-request work off the workers' pinned CPUs."""
        self._own_cpus = place_service(self.plan, self._own_cpus)

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
    def _on_event(self, event: Event) -> None:
        if event.event not in (ev.SERVICE_READY,):
            self._wake.set()  # a state change: STATUS= may need saying

    async def _maintain(self) -> None:
        """Drive the pools' clocks (ejection cool-downs, backoffs), run their /health probes
        and keep STATUS= current. Sleeps until the next timed transition or a wake-up (a probe
        requested, an event published)."""
        probing: set[str] = set()
        while True:
            self._wake.clear()
            self._reconcile()
            delays = []
            for pool in list(self.pools.values()):
                delay = pool.tick()  # also schedules re-probes of replicas a failed probe took out
                if delay is not None:
                    delays.append(delay)
                for rid in pool.take_probe_requests():
                    if rid in probing or rid not in self.replicas:
                        continue
                    probing.add(rid)
                    self._task(self._probe(pool, rid, probing), f"probe-{rid}")
            self._publish_status()
            timeout = min(delays) + 0.001 if delays else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def _reconcile(self) -> None:
        """Every pass of the maintenance loop: the plan's replicas against the supervised ones
        (``Fleet.reconcile``). Not while stopping (workers leave on purpose then); a reload
        swaps generations in one step, so the plan and the workers always agree here."""
        if self.stopping:
            return
        try:
            done = self.fleet.reconcile(self.spawn, self.options.worker_cache_bytes)
        except Exception:  # it must not take the pools' clocks and probes down with it
            log.exception("reconcile pass failed; the next pass tries again")
            return
        for action, rep in done:
            log.warning("%s: reconcile: %s (its life loop had ended)", rep.id, action)

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
        self._wake.set()

    def _publish_status(self) -> None:
        """STATUS= on every change; READY=1 once every deployment has a ready replica."""
        if self.stopping:
            return
        text = status_line(self.inventory())
        if text != self._last_status:
            self._last_status = text
            self.notifier.status(text)
        if not self._announced_ready and self.health()["ready"]:
            self._announced_ready = True
            self.notifier.ready(text)
            self.events.publish(ev.SERVICE_READY, generation=self.generation)

    # ------------------------------------------------------------------ lifecycle hooks
    def on_starting(self, rep: ManagedReplica, restarted: bool) -> None:
        pool = self.fleet.pool_of(rep)
        if pool is not None:
            pool.mark_starting(rep.id, rep.pid)
            pool.set_restarts(rep.id, rep.restarts)
        if restarted:
            self.events.publish(
                ev.REPLICA_RESTARTED, **who(rep), pid=rep.pid, restarts=rep.restarts
            )
        else:
            self.events.publish(ev.REPLICA_STARTING, **who(rep), pid=rep.pid)

    def on_ready(self, rep: ManagedReplica) -> None:
        pool = self.fleet.pool_of(rep)
        if pool is not None:
            mark_ready(pool, rep)
        self.events.publish(ev.REPLICA_READY, **who(rep), pid=rep.pid, limits=rep.limits)

    def on_health(self, rep: ManagedReplica, doc: dict[str, Any]) -> None:
        """A ready worker's periodic /health: its learner's report, and whether its forward
        has run past the deployment's hang bound (then it is restarted)."""
        pool = self.fleet.pool_of(rep)
        if pool is None:
            return
        pool.set_adaptive_threads(rep.id, doc.get("adaptive_threads"))
        running = doc.get("forward_running_s")
        bound = pool.settings.hang_bound_s
        if isinstance(running, int | float) and running > bound and rep.state == "ready":
            reason = f"hung: forward running {running:.1f} s > bound {bound:.1f} s"
            log.warning("%s: %s; restarting it", rep.id, reason)
            rep.state = "hung"
            self.events.publish(
                ev.REPLICA_HUNG,
                **who(rep),
                pid=rep.pid,
                forward_running_s=round(float(running), 3),
                bound_s=bound,
            )
            self._task(rep.kill_hung(reason), f"hung-{rep.id}")

    def on_exited(self, rep: ManagedReplica, returncode: int, reason: str) -> None:
        pool = self.fleet.pool_of(rep)
        if pool is not None:
            pool.mark_exited(rep.id, reason)
            pool.replica(rep.id).restart_reason = reason
        pid = rep.process.pid if rep.process else None
        self.events.publish(
            ev.REPLICA_EXITED, **who(rep), pid=pid, returncode=returncode, reason=reason
        )

    def on_backoff(self, rep: ManagedReplica, delay_s: float) -> None:
        pool = self.fleet.pool_of(rep)
        if pool is not None:
            pool.mark_backoff_restart(rep.id, self.clock.monotonic() + delay_s)
            if rep.last_error:  # a spawn that failed has no exit to say why
                pool.set_last_error(rep.id, rep.last_error)
        self.events.publish(
            ev.REPLICA_BACKOFF, **who(rep), pid=None, backoff_s=delay_s, reason=rep.last_error
        )

    def on_supervision_failed(self, rep: ManagedReplica, error: str) -> None:
        """Its life loop raised: reported once here; the reconcile pass (woken now) revives
        it through its backoff."""
        pool = self.fleet.pool_of(rep)
        if pool is not None:
            record = pool.replica(rep.id)
            record.supervision_failures = rep.supervision_failures
            record.last_error = error
        self.events.publish(
            ev.REPLICA_SUPERVISION_FAILED,
            **who(rep),
            pid=rep.pid,
            error=error,
            failures=rep.supervision_failures,
        )
        self._wake.set()

    def on_failed(self, rep: ManagedReplica, reason: str) -> None:
        pool = self.fleet.pool_of(rep)
        if pool is not None:
            pool.mark_failed(rep.id, reason)
        self.events.publish(ev.REPLICA_FAILED, **who(rep), reason=reason)

    # ------------------------------------------------------------------ commands
    def _published_replica(self, replica_id: str | None) -> tuple[ManagedReplica, ReplicaPool]:
        rep = self.replicas.get(replica_id or "")
        pool = self.fleet.pool_of(rep) if rep is not None else None
        if rep is None or pool is None:
            raise NotFound(f"no replica {replica_id!r}; known: {sorted(self.fleet.published)}")
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
        old_pid, lives = rep.pid, rep.lives
        await rep.restart()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(rep.wait_new_life(lives), self.options.stop_grace_s + 10.0)
        resolve(cmd, result={"replica": rep.id, "old_pid": old_pid, "pid": rep.pid})

    async def handle_drain(self, cmd: Command) -> dict[str, Any]:
        rep, pool = self._published_replica(cmd.replica)
        pool.drain(rep.id)
        self.events.publish(ev.REPLICA_DRAINING, **who(rep), pid=rep.pid, reason="control")
        return {"ok": True, "replica": rep.id, "inflight": pool.replica(rep.id).inflight}

    async def handle_reload(self, cmd: Command) -> dict[str, Any] | None:
        self._check_not_stopping()
        await self.reconfiguration.reload(cmd)
        return None  # resolved once the new generation is published

    async def handle_scale(self, cmd: Command) -> dict[str, Any] | None:
        self._check_not_stopping()
        await self.reconfiguration.scale(cmd)
        return None

    async def handle_stop(self, cmd: Command) -> dict[str, Any]:
        if self.stopping:
            self._quick.set()  # a second signal: skip the drain, shorten the grace
            return {"ok": True, "quick": True}
        self.stopping = True
        self.admitting = False
        if cmd.quick:
            self._quick.set()
        self.reconfiguration.cancel()
        self.notifier.stopping()
        self.events.publish(ev.SERVICE_STOPPING, quick=self._quick.is_set())
        self._task(self._stop_all(), "stop")
        return {"ok": True, "quick": self._quick.is_set()}

    async def _stop_all(self) -> None:
        try:
            await self._drain_all()
            grace = QUICK_GRACE_S if self._quick.is_set() else self.options.stop_grace_s
            reps = self.fleet.workers()
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
        """Admission is off; wait until nothing is in flight anywhere (or the drain timeout,
        or a second signal)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout_s
        while not self._quick.is_set():
            # A retry admitted elsewhere while we waited counts too: look again each round.
            busy = [r for r in self.fleet.workers() if r.record is not None and r.record.inflight]
            left = deadline - loop.time()
            if not busy or left <= 0:
                return
            await wait_idle(busy[0], left, self._quick)

    async def _stop_replica(self, rep: ManagedReplica, grace_s: float) -> None:
        pid = rep.pid
        await rep.stop(grace_s)
        pool = self.fleet.pool_of(rep)
        if pool is not None:
            pool.mark_stopped(rep.id)
        self.events.publish(ev.REPLICA_STOPPED, **who(rep), pid=pid)

    def kill_all_now(self) -> None:
        """On the way out after an error: never leave a worker behind."""
        for rep in self.fleet.workers():
            rep.kill_now()

    def _check_not_stopping(self) -> None:
        if self.stopping:
            raise Conflict("the service is stopping")
