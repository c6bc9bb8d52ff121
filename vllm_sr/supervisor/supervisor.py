"""The supervisor: owns the worker processes and the pools the frontend dispatches through.

One loop takes ``Command``s off one queue and applies each with ``handle_<kind>``; signal
handlers and the control API only enqueue. Long work a command starts (a reload waiting for new
workers, a drain before stop) runs as a task the supervisor owns, so the loop stays free to take
a second signal (quick stop) or another command. Worker lifecycles are ``ManagedReplica`` tasks
(made by the injected ``spawn`` factory, so tests can run the handlers without processes) that
report to the supervisor's ``LifecycleHooks`` (``hooks``): every state change reaches the
pool and the event bus there, once. Commands are its ``CommandHandlers`` (``handlers``), the
stop its ``Shutdown`` (``shutdown``); the tasks all of them start are its ``OwnedTasks``.
Nothing polls: the maintenance task sleeps until the pools' next timed transition, a requested
probe or an event.

Router mode's views (the chat mount's backends and counters, router_replay's records) reach the
inventory and the control API through the ``router`` given to the constructor; the supervisor
never imports the frontend.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from vllm_sr import __version__
from vllm_sr import events as ev
from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.control.commands import Command, CommandQueue
from vllm_sr.errors import NotFound, VllmSrError
from vllm_sr.events import Event, EventBus
from vllm_sr.jsontypes import JsonObject
from vllm_sr.plan import ReplicaSpec, RouterPlan, ServicePlan
from vllm_sr.pool.directory import PoolDirectory
from vllm_sr.pool.pool import ReplicaPool
from vllm_sr.supervisor.affinity import place_service
from vllm_sr.supervisor.attached import AttachedReplica
from vllm_sr.supervisor.config_source import ConfigSource
from vllm_sr.supervisor.fleet import Fleet, Spawn, size_caches, start_in_order
from vllm_sr.supervisor.handlers import CommandHandlers
from vllm_sr.supervisor.hooks import LifecycleHooks
from vllm_sr.supervisor.keeper import OwnedTasks, TaskKeeper
from vllm_sr.supervisor.managed import ManagedReplica, ProcessOptions
from vllm_sr.supervisor.readiness import WorkerView, startup_status
from vllm_sr.supervisor.reconfigure import Planner, Reconfiguration, Scaler
from vllm_sr.supervisor.router_build import RouterBuilder, build_router
from vllm_sr.supervisor.shutdown import Shutdown
from vllm_sr.supervisor.signal_procs import SignalProcesses
from vllm_sr.supervisor.systemd import SystemdNotifier, status_line
from vllm_sr.supervisor.usage import GpuProbe, UsageSampler

if TYPE_CHECKING:
    from vllm_sr.router.chat import ChatRouter
    from vllm_sr.router.learning.outcomes import Outcome
    from vllm_sr.router.signal_dispatch import SignalDispatch

log = logging.getLogger("vllm_sr.supervisor")

PROBE_TIMEOUT_S = 2.0
USAGE_EVERY_S = 2.0  # CPU %, RSS (and GPU usage) per worker

__all__ = ["Planner", "RouterViews", "Scaler", "Supervisor"]

NO_REPLAY: JsonObject = {"records": [], "last_seq": 0, "decisions": []}


class RouterViews(Protocol):
    """Router mode's views the supervisor serves (the frontend's ``ChatMount``)."""

    chat: ChatRouter | None  # the published generation's chat router (replay log, learning)

    def inventory(self) -> JsonObject | None: ...

    def use_signal_dispatch(self, dispatch: SignalDispatch) -> None: ...

    async def replay(
        self,
        decision: str | None = None,
        since: int = 0,
        recipe: str | None = None,
        session: str | None = None,
    ) -> JsonObject: ...


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
        router: RouterViews | None = None,
        directory: PoolDirectory | None = None,
        scaler: Scaler | None = None,
        gpu_probe: GpuProbe | None = None,
        config_source: ConfigSource | None = None,
        router_builder: RouterBuilder | None = None,
        signal_processes: int = 0,
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
        self.usage = UsageSampler(gpu_probe)
        self.queue = CommandQueue()
        self._wake = asyncio.Event()
        self.fleet = Fleet(clock, self.events.publish, on_wake=self._wake.set, directory=directory)
        self.keeper = TaskKeeper(clock, self.events.publish)
        self.tasks = OwnedTasks()
        self.started_at = clock.time()
        self._announced_ready = False
        self._last_status = ""
        self._own_cpus: list[int] = []
        self._starts: list[asyncio.Future[None]] = []  # GPU workers waiting for a card's earlier
        self.router = router  # Router mode's views (serve: the frontend's chat mount)
        # Builds each generation's router when it is published (serve: the chat mount too)
        self.router_builder = router_builder
        # Router mode's CPU-bound signals, off the frontend's loop (none: they stay on it)
        self.signal_procs = SignalProcesses(signal_processes, None, self.events.publish)
        self.shutdown = Shutdown(
            self.fleet,
            self.events,
            self.notifier,
            self.options,
            self.signal_procs,
            self.tasks,
            drain_timeout_s=drain_timeout_s,
        )
        self.hooks = LifecycleHooks(self.fleet, self.events, clock, self.tasks, self._wake.set)
        self.reconfiguration = Reconfiguration(
            self.fleet,
            planner,
            self.spawn,
            events=self.events,
            notifier=self.notifier,
            ready_timeout_s=self.options.ready_timeout_s,
            drain_timeout_s=drain_timeout_s,
            quick=self.shutdown.quick,
            status=lambda: self._last_status or None,
            on_published=self.place_self,
            router=router_builder,
        )
        self.reconfiguration.cache_bytes = self.options.worker_cache_bytes
        self.reconfiguration.scaler = scaler
        self.handlers = CommandHandlers(
            self.fleet,
            self.events,
            self.queue,
            self.options,
            self.reconfiguration,
            self.shutdown,
            self.tasks,
        )
        self.events.add_sink(self._on_event)
        self.config_source = config_source  # config.yaml's served and on-disk hashes
        if config_source is not None:
            self.events.add_sink(config_source.on_event)

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
    def stopping(self) -> bool:
        return self.shutdown.stopping

    @property
    def admitting(self) -> bool:
        """Whether new chats are taken (off once a stop began)."""
        return self.shutdown.admitting

    @property
    def scaler(self) -> Scaler | None:
        return self.reconfiguration.scaler

    @scaler.setter
    def scaler(self, value: Scaler | None) -> None:
        self.reconfiguration.scaler = value

    # ------------------------------------------------------------------ control-API backend
    def inventory(self) -> JsonObject:
        now = self.clock.time()
        deployments: list[JsonObject] = []
        for name, pool in list(self.pools.items()):
            entry = pool.inventory()
            entry.setdefault("name", name)
            deployments.append(entry)
        service: JsonObject = {
            "version": __version__,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_at": self.started_at,
            "uptime_s": round(now - self.started_at, 3),
            "generation": self.generation,
            "task_failures": dict(self.keeper.failures),
        }
        if self.config_source is not None:
            service["config"] = self.config_source.view()  # served against on-disk hash
        doc: JsonObject = {"service": service, "deployments": deployments}
        router = self.router.inventory() if self.router is not None else None
        if router is not None:
            doc["router"] = router  # backends and decision counters (Router mode)
        if self.signal_procs.started:
            doc["signal_processes"] = self.signal_procs.inventory()
        return doc

    async def replay(
        self,
        decision: str | None = None,
        since: int = 0,
        recipe: str | None = None,
        session: str | None = None,
    ) -> JsonObject:
        """Router mode's router_replay records after ``since`` (of one decision, recipe and/or
        session, or all)."""
        if self.router is None:
            return dict(NO_REPLAY)
        return await self.router.replay(decision, since, recipe, session)

    async def outcome(self, outcome: Outcome) -> JsonObject:
        """Router Learning's outcome verdict, applied to the running generation's learning
        (vllm_sr/router/learning/outcomes.py)."""
        from vllm_sr.router.learning.outcomes import LearningOff, ingest

        chat = self._router_chat()
        if chat is None:
            raise LearningOff(
                "outcome verdicts feed Router Learning: the service is not routing (Engine "
                "mode, or no providers); accepted: Router mode with global.router.learning"
            )
        return await ingest(chat, outcome)

    def _router_chat(self) -> ChatRouter | None:
        """The published generation's chat router (the chat mount's ``chat``: its replay log
        and Router Learning), None in Engine mode."""
        return self.router.chat if self.router is not None else None

    def router_plan(self) -> RouterPlan | None:
        """Router mode's settings of the published generation (None: Engine mode)."""
        return self.plan.router if self.plan is not None else None

    def health(self) -> JsonObject:
        ready = {name: sum(1 for r in p.replicas() if r.serving) for name, p in self.pools.items()}
        # A plan with no deployment (Router mode whose routing needs no model) waits for none.
        workerless = self.plan is not None and not self.plan.deployments
        ok = (bool(ready) or workerless) and all(n > 0 for n in ready.values())
        ok = ok and not self.stopping
        status = "stopping" if self.stopping else ("ready" if ok else "unavailable")
        return {"status": status, "ready": ok, "deployments": ready, "generation": self.generation}

    def startup_status(self) -> JsonObject:
        """``/startup-status`` (and ``/ready``'s verdict): vllm_sr/supervisor/readiness.py."""
        plan = self.plan
        desired = {n: len(d.replicas) for n, d in plan.deployments.items()} if plan else {}
        serving = {
            r.id
            for name in desired
            if (p := self.pools.get(name))
            for r in p.replicas()
            if r.serving
        }
        workers: dict[str, list[WorkerView]] = {}
        for rep in list(self.fleet.replicas.values()):
            if rep.id not in self.fleet.published or rep.spec.deployment not in desired:
                continue
            reported = rep.health.get("status") if isinstance(rep.health, dict) else None
            reason = rep.last_error or (rep.health.get("reason") if rep.health else None)
            workers.setdefault(rep.spec.deployment, []).append(
                WorkerView(
                    rep.id,
                    rep.state,
                    reported if isinstance(reported, str) else None,
                    rep.id in serving,
                    reason if isinstance(reason, str) else None,
                )
            )
        return startup_status(
            desired,
            workers,
            published=plan is not None,
            stopping=self.stopping,
            generation=self.generation,
        )

    def effective_config(self) -> JsonObject:
        return dict(self.plan.config) if self.plan else {}

    async def submit(self, command: Command) -> JsonObject:
        return await self.queue.submit(command)

    # ------------------------------------------------------------------ start / run
    def _socket_path(self, replica_id: str) -> str:
        path = self.workers_dir / f"{replica_id}.sock"
        if any(r.socket_path == str(path) for r in self.fleet.workers()):
            # A replacement runs beside its predecessor until it is ready.
            path = self.workers_dir / f"{replica_id}.g{self.generation + 1}.sock"
        return str(path)

    def _spawn_process(self, spec: ReplicaSpec) -> ManagedReplica:
        if spec.endpoint:
            return AttachedReplica(spec, self.hooks, self.options, self.clock)
        return ManagedReplica(
            spec, self._socket_path(spec.id), self.hooks, self.options, self.clock
        )

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
        if self.router_builder is not None:  # built while the workers load; nothing to retire
            self.router_builder.swap(await build_router(self.router_builder, plan.router))
        self.notifier.extend_timeout(self.options.ready_timeout_s + 30)
        self.place_self()
        # Kept: one that raises is reported and run again (supervision never dies silently).
        self.tasks.start(self.keeper.keep("maintain", self._maintain), "maintain")
        self.tasks.start(self.keeper.keep("watchdog", self.notifier.run_watchdog), "watchdog")
        self.tasks.start(self.keeper.keep("usage", self._sample_usage), "usage")
        self.events.publish(
            ev.POOL_PUBLISHED, generation=self.generation, deployments=list(self.pools)
        )

    def keep_task(self, name: str, factory: Callable[[], Awaitable[object]]) -> None:
        """A long-running task of the service, kept alive by the keeper (reported and run
        again when it raises) and ended by the stop."""
        self.tasks.start(self.keeper.keep(name, factory), name)

    async def _sample_usage(self) -> None:
        await self.usage.run(
            lambda: list(self.replicas.values()), USAGE_EVERY_S, self.hooks.on_usage
        )

    def place_self(self) -> None:
        """Keep the service's own per-request work off the workers' pinned CPUs (and start
        the signal processes with the first generation that routes)."""
        self._own_cpus = place_service(self.plan, self._own_cpus)
        self.signal_procs.start_for(self.plan, self.router)

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
        while not self.shutdown.stopped.is_set():
            getter = asyncio.ensure_future(self.queue.get())
            stopped = asyncio.ensure_future(self.shutdown.stopped.wait())
            done, _ = await asyncio.wait({getter, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                stopped.cancel()
                break
            stopped.cancel()
            await self._apply(getter.result())

    async def _apply(self, cmd: Command) -> None:
        handler = getattr(self.handlers, f"handle_{cmd.kind}", None)
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
                delay = (
                    pool.outliers.tick()
                )  # also schedules re-probes of replicas a failed probe took out
                if delay is not None:
                    delays.append(delay)
                for rid in pool.outliers.take_probe_requests():
                    if rid in probing or rid not in self.replicas:
                        continue
                    probing.add(rid)
                    self.tasks.start(self._probe(pool, rid, probing), f"probe-{rid}")
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
            pool.outliers.probe_result(rid, ok)
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
