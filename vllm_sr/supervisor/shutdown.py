"""The service's stop: admission off, drain to the deadline, SIGTERM, grace, SIGKILL. A second
stop (a second signal) skips what is left of the drain and shortens the grace. ``Shutdown``
owns the stop's state (``stopping``, ``admitting``, ``quick``, ``stopped``), which the
supervisor's views, its loop and a running reconfiguration read."""

from __future__ import annotations

import asyncio

from vllm_sr import events as ev
from vllm_sr.events import EventBus
from vllm_sr.supervisor.fleet import Fleet, who
from vllm_sr.supervisor.keeper import OwnedTasks
from vllm_sr.supervisor.managed import ManagedReplica, ProcessOptions
from vllm_sr.supervisor.reconfigure import wait_idle
from vllm_sr.supervisor.signal_procs import SignalProcesses
from vllm_sr.supervisor.systemd import SystemdNotifier

QUICK_GRACE_S = 1.0


class Shutdown:
    """Stops ``fleet``'s workers and the signal processes, then cancels ``tasks``."""

    def __init__(
        self,
        fleet: Fleet,
        events: EventBus,
        notifier: SystemdNotifier,
        options: ProcessOptions,
        signal_procs: SignalProcesses,
        tasks: OwnedTasks,
        *,
        drain_timeout_s: float,
    ) -> None:
        self.fleet = fleet
        self.events = events
        self.notifier = notifier
        self.options = options
        self.signal_procs = signal_procs
        self.tasks = tasks
        self.drain_timeout_s = drain_timeout_s
        self.admitting = True
        self.stopping = False
        self.quick = asyncio.Event()  # a second stop: skip the drain, shorten the grace
        self.stopped = asyncio.Event()  # every worker stopped and every owned task cancelled

    def begin(self, quick: bool) -> None:
        """Admission off: the service is stopping (``run`` does the stop)."""
        self.stopping = True
        self.admitting = False
        if quick:
            self.quick.set()

    def run(self) -> None:
        """Announce the stop begun by ``begin`` and run it as an owned task."""
        self.notifier.stopping()
        self.events.publish(ev.SERVICE_STOPPING, quick=self.quick.is_set())
        self.tasks.start(self._stop_all(), "stop")

    async def _stop_all(self) -> None:
        try:
            await self._drain_all()
            grace = QUICK_GRACE_S if self.quick.is_set() else self.options.stop_grace_s
            reps = self.fleet.workers()
            stopping = asyncio.ensure_future(self._stop_replicas(reps, grace))
            quick = asyncio.ensure_future(self.quick.wait())
            await asyncio.wait({stopping, quick}, return_when=asyncio.FIRST_COMPLETED)
            if not stopping.done():  # a second signal while waiting for the grace: no more
                for rep in reps:
                    rep.kill_now()
                await stopping
            quick.cancel()
            await self.signal_procs.stop()  # nothing routes any more
        finally:
            self.tasks.cancel_all()
            self.stopped.set()

    async def _stop_replicas(self, reps: list[ManagedReplica], grace_s: float) -> None:
        await asyncio.gather(
            *(self._stop_replica(r, grace_s) for r in reps), return_exceptions=True
        )

    async def _drain_all(self) -> None:
        """Admission is off; wait until nothing is in flight anywhere (or the drain timeout,
        or a second signal)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout_s
        while not self.quick.is_set():
            # A retry admitted elsewhere while we waited counts too: look again each round.
            busy = [r for r in self.fleet.workers() if r.record is not None and r.record.inflight]
            left = deadline - loop.time()
            if not busy or left <= 0:
                return
            await wait_idle(busy[0], left, self.quick)

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
