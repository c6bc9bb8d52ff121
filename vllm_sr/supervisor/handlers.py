"""The supervisor's commands (``handle_<kind>``, applied one at a time by its loop) and the
stop they end with: part of ``Supervisor``, kept in its own module.

Manual operations (eject, readmit, drain) are the pool's; restart replaces a worker's process;
reload and scale are the ``Reconfiguration``'s. A stop escalates: admission off, drain to the
deadline, SIGTERM, grace, SIGKILL; a second stop (a second signal) skips what is left of the
drain and shortens the grace."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import TYPE_CHECKING

from vllm_sr import events as ev
from vllm_sr.control.commands import Command, CommandQueue
from vllm_sr.errors import Conflict, NotFound
from vllm_sr.events import EventBus
from vllm_sr.jsontypes import JsonObject
from vllm_sr.pool.pool import ReplicaPool
from vllm_sr.supervisor.attached import AttachedReplica
from vllm_sr.supervisor.config_watch import SOURCE as WATCH_SOURCE
from vllm_sr.supervisor.fleet import Fleet, who
from vllm_sr.supervisor.managed import ManagedReplica, ProcessOptions
from vllm_sr.supervisor.reconfigure import Reconfiguration, resolve, wait_idle
from vllm_sr.supervisor.signal_procs import SignalProcesses
from vllm_sr.supervisor.systemd import SystemdNotifier

QUICK_GRACE_S = 1.0


class CommandHandlers:
    fleet: Fleet
    events: EventBus
    queue: CommandQueue
    options: ProcessOptions
    notifier: SystemdNotifier
    reconfiguration: Reconfiguration
    drain_timeout_s: float
    admitting: bool
    stopping: bool
    _quick: asyncio.Event
    _stopped: asyncio.Event
    _tasks: set[asyncio.Task[object]]
    signal_procs: SignalProcesses

    if TYPE_CHECKING:

        def _task(
            self, coro: Coroutine[object, object, object], name: str
        ) -> asyncio.Task[object]: ...

    def _published_replica(self, replica_id: str | None) -> tuple[ManagedReplica, ReplicaPool]:
        rep = self.fleet.replicas.get(replica_id or "")
        pool = self.fleet.pool_of(rep) if rep is not None else None
        if rep is None or pool is None:
            raise NotFound(f"no replica {replica_id!r}; known: {sorted(self.fleet.published)}")
        return rep, pool

    async def handle_eject(self, cmd: Command) -> JsonObject:
        rep, pool = self._published_replica(cmd.replica)
        pool.outliers.eject(rep.id, duration_ms=cmd.duration_ms)
        return {"ok": True, "replica": rep.id, "state": pool.replica(rep.id).display_state()}

    async def handle_readmit(self, cmd: Command) -> JsonObject:
        rep, pool = self._published_replica(cmd.replica)
        pool.outliers.readmit(rep.id)
        return {"ok": True, "replica": rep.id, "state": pool.replica(rep.id).display_state()}

    async def handle_restart(self, cmd: Command) -> JsonObject | None:
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

    async def handle_drain(self, cmd: Command) -> JsonObject:
        rep, pool = self._published_replica(cmd.replica)
        pool.mark_draining(rep.id)
        self.events.publish(ev.REPLICA_DRAINING, **who(rep), pid=rep.pid, reason="control")
        return {"ok": True, "replica": rep.id, "inflight": pool.replica(rep.id).inflight}

    async def handle_reload(self, cmd: Command) -> JsonObject | None:
        self._check_not_stopping()
        running = self.reconfiguration.task
        if (
            running is not None
            and self.reconfiguration.running
            and self.reconfiguration.source == WATCH_SOURCE
            and cmd.source != WATCH_SOURCE
        ):
            # The config watch is applying an edit an operator may have just made: their
            # reload (`systemctl reload`) runs after it, on the file as it is then, rather than
            # being refused as a reload already in progress.
            self._task(self._after(running, cmd), "reload-after-watch")
            return None
        await self.reconfiguration.reload(cmd)
        return None  # resolved once the new generation is published

    async def _after(self, running: asyncio.Task[None], cmd: Command) -> None:
        await asyncio.wait({running})
        self.queue.put_nowait(cmd)  # applied again by the loop, its ``done`` still awaited

    async def handle_scale(self, cmd: Command) -> JsonObject | None:
        self._check_not_stopping()
        await self.reconfiguration.scale(cmd)
        return None

    async def handle_stop(self, cmd: Command) -> JsonObject:
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
            stopping = asyncio.ensure_future(self._stop_replicas(reps, grace))
            quick = asyncio.ensure_future(self._wait_quick())
            await asyncio.wait({stopping, quick}, return_when=asyncio.FIRST_COMPLETED)
            if not stopping.done():  # a second signal while waiting for the grace: no more
                for rep in reps:
                    rep.kill_now()
                await stopping
            quick.cancel()
            await self.signal_procs.stop()  # nothing routes any more
        finally:
            for task in list(self._tasks):
                if task is not asyncio.current_task():
                    task.cancel()
            self._stopped.set()

    async def _stop_replicas(self, reps: list[ManagedReplica], grace_s: float) -> None:
        await asyncio.gather(
            *(self._stop_replica(r, grace_s) for r in reps), return_exceptions=True
        )

    async def _wait_quick(self) -> None:
        await self._quick.wait()

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
        self.signal_procs.kill_now()

    def _check_not_stopping(self) -> None:
        if self.stopping:
            raise Conflict("the service is stopping")
