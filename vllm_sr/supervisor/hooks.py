"""How a worker's transitions reach the pool and the event bus: ``LifecycleHooks``, the
``ReplicaHooks`` each ``ManagedReplica`` reports to (``on_*``; the supervisor makes one and
hands it to every worker it spawns). Every state change is told to the pool through its
methods (the pool is the one writer of its records) and published once, here. A replica that
is no longer the published worker of its id (a retired or staged one) reaches the bus but no
pool."""

from __future__ import annotations

import logging
from collections.abc import Callable

from vllm_sr import events as ev
from vllm_sr.clock import Clock
from vllm_sr.events import EventBus
from vllm_sr.jsontypes import JsonObject
from vllm_sr.supervisor.fleet import Fleet, mark_ready, who
from vllm_sr.supervisor.keeper import OwnedTasks
from vllm_sr.supervisor.managed import ManagedReplica

log = logging.getLogger("vllm_sr.supervisor")


class LifecycleHooks:
    """Tells ``fleet``'s pools and ``events`` what a worker did; a hung worker's kill runs as
    one of ``tasks``; ``wake`` wakes the maintenance pass (its reconcile revives a worker whose
    life loop raised)."""

    def __init__(
        self,
        fleet: Fleet,
        events: EventBus,
        clock: Clock,
        tasks: OwnedTasks,
        wake: Callable[[], None],
    ) -> None:
        self.fleet = fleet
        self.events = events
        self.clock = clock
        self.tasks = tasks
        self.wake = wake

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

    def on_health(self, rep: ManagedReplica, doc: JsonObject) -> None:
        """A ready worker's periodic /health: its learner's report, and whether its forward
        has run past the deployment's hang bound (then it leaves dispatch and is restarted)."""
        pool = self.fleet.pool_of(rep)
        if pool is None:
            return
        pool.set_adaptive_threads(rep.id, doc.get("adaptive_threads"))
        pool.set_result_cache_bytes(rep.id, doc.get("result_cache_bytes"))
        running = doc.get("forward_running_s")
        bound = pool.settings.hang_bound_s
        if not isinstance(running, int | float) or running <= bound:
            return
        reason = f"hung: forward running {running:.1f} s > bound {bound:.1f} s"
        if not rep.mark_hung(reason):
            return  # not ready (starting, or already hung): reported once per process
        log.warning("%s: %s; restarting it", rep.id, reason)
        pool.mark_hung(rep.id, reason)
        self.events.publish(
            ev.REPLICA_HUNG,
            **who(rep),
            pid=rep.pid,
            forward_running_s=round(float(running), 3),
            bound_s=bound,
        )
        self.tasks.start(rep.kill_hung(reason), f"hung-{rep.id}")

    def on_exited(self, rep: ManagedReplica, returncode: int, reason: str) -> None:
        pool = self.fleet.pool_of(rep)
        if pool is not None:
            pool.mark_exited(rep.id, reason)
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
            pool.note_supervision_failed(rep.id, rep.supervision_failures, error)
        self.events.publish(
            ev.REPLICA_SUPERVISION_FAILED,
            **who(rep),
            pid=rep.pid,
            error=error,
            failures=rep.supervision_failures,
        )
        self.wake()

    def on_failed(self, rep: ManagedReplica, reason: str) -> None:
        pool = self.fleet.pool_of(rep)
        if pool is not None:
            pool.mark_failed(rep.id, reason)
        self.events.publish(ev.REPLICA_FAILED, **who(rep), reason=reason)

    def on_usage(self, rep: ManagedReplica, usage: JsonObject) -> None:
        """The usage sampler's reading of a published worker (CPU %, RSS, GPU)."""
        pool = self.fleet.pool_of(rep)
        if pool is not None:
            pool.set_usage(rep.id, usage)
