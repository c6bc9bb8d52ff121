"""The supervisor's commands: ``CommandHandlers.handle_<kind>``, applied one at a time by the
supervisor's loop (``Supervisor._apply``).

Manual operations (eject, readmit, drain) are the pool's; restart replaces a worker's process;
reload and scale are the ``Reconfiguration``'s; stop is the ``Shutdown``'s
(vllm_sr/supervisor/shutdown.py)."""

from __future__ import annotations

import asyncio
import contextlib

from vllm_sr import events as ev
from vllm_sr.control.commands import Command, CommandQueue
from vllm_sr.errors import Conflict, NotFound
from vllm_sr.events import EventBus
from vllm_sr.jsontypes import JsonObject
from vllm_sr.pool.pool import ReplicaPool
from vllm_sr.supervisor.attached import AttachedReplica
from vllm_sr.supervisor.config_watch import SOURCE as WATCH_SOURCE
from vllm_sr.supervisor.fleet import Fleet, who
from vllm_sr.supervisor.keeper import OwnedTasks
from vllm_sr.supervisor.managed import ManagedReplica, ProcessOptions
from vllm_sr.supervisor.reconfigure import Reconfiguration, resolve
from vllm_sr.supervisor.shutdown import Shutdown


class CommandHandlers:
    """Applies commands to ``fleet``'s published workers, ``reconfiguration`` and
    ``shutdown``; what outlives a command (a restart, a reload waiting for a running watch's)
    runs as one of ``tasks``; a deferred command goes back on ``queue``."""

    def __init__(
        self,
        fleet: Fleet,
        events: EventBus,
        queue: CommandQueue,
        options: ProcessOptions,
        reconfiguration: Reconfiguration,
        shutdown: Shutdown,
        tasks: OwnedTasks,
    ) -> None:
        self.fleet = fleet
        self.events = events
        self.queue = queue
        self.options = options
        self.reconfiguration = reconfiguration
        self.shutdown = shutdown
        self.tasks = tasks

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
        self.tasks.start(self._restart(rep, cmd), f"restart-{rep.id}")
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
            self.tasks.start(self._after(running, cmd), "reload-after-watch")
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
        if self.shutdown.stopping:
            self.shutdown.quick.set()  # a second signal: skip the drain, shorten the grace
            return {"ok": True, "quick": True}
        self.shutdown.begin(cmd.quick)
        self.reconfiguration.cancel()
        self.shutdown.run()
        return {"ok": True, "quick": self.shutdown.quick.is_set()}

    def _check_not_stopping(self) -> None:
        if self.shutdown.stopping:
            raise Conflict("the service is stopping")
