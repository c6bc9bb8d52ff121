"""Typed events on one bus. State changes are emitted once, in one place; sinks (the log,
metrics, the ring buffer, control-API subscribers) each see every event."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from vllm_sr.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger("vllm_sr.events")

# Event names. Fields each carries are listed beside it (docs/events.md is the long form).
REPLICA_STARTING = "replica_starting"  # deployment, replica, device, pid
REPLICA_READY = "replica_ready"  # deployment, replica, device, pid, limits
REPLICA_EXITED = "replica_exited"  # deployment, replica, device, pid, returncode, reason
REPLICA_RESTARTED = "replica_restarted"  # deployment, replica, device, pid, restarts, backoff_s
REPLICA_FAILED = "replica_failed"  # deployment, replica, device, reason
REPLICA_INCOMPATIBLE = "replica_incompatible"  # deployment, replica, device, reason
REPLICA_DRAINING = "replica_draining"  # deployment, replica, device, pid, reason
REPLICA_STOPPED = "replica_stopped"  # deployment, replica, device, pid
REPLICA_BACKOFF = "replica_backoff"  # deployment, replica, device, pid, backoff_s, reason
# replica_ejected: deployment, replica, device, pid, timeouts, duration_ms, reason
REPLICA_EJECTED = "replica_ejected"
REPLICA_READMITTED = "replica_readmitted"  # deployment, replica, device, pid,
# why: cooldown_ended | success | no_other_replica | manual
REPLICA_EJECTION_WITHHELD = "replica_ejection_withheld"  # deployment, replica, timeouts,
# rule: one_worker | no_other_replica_answered | max_ejection_percent
REPLICA_HUNG = "replica_hung"  # deployment, replica, device, pid, forward_running_s, bound_s
# deployment, replica, device, pid, error, failures (its life loop raised; it is started again)
REPLICA_SUPERVISION_FAILED = "replica_supervision_failed"
# Signal processes (Router mode's CPU-bound signals, vllm_sr/supervisor/signal_procs.py)
SIGNAL_PROCESS_STARTING = "signal_process_starting"  # process, pid, restarted
SIGNAL_PROCESS_READY = "signal_process_ready"  # process, pid
SIGNAL_PROCESS_EXITED = "signal_process_exited"  # process, returncode, reason, backoff_s
SERVICE_TASK_FAILED = "service_task_failed"  # task, error, failures, restart_in_s
EXCHANGE_RETRIED = "exchange_retried"  # deployment, replica (the failed one), count, error
POOL_PUBLISHED = "pool_published"  # generation, deployments
RELOAD_FAILED = "reload_failed"  # reason, source (signal:SIGHUP, control, watch), problems
SERVICE_READY = "service_ready"
SERVICE_STOPPING = "service_stopping"  # quick
THREADS_LEARNED = "threads_learned"  # bucket, threads, median_ms, ratio, samples
THREADS_RETIRED = "threads_retired"  # threads, against_threads, bucket, tokens, rows, diff

WARNING_EVENTS = frozenset(
    {
        REPLICA_EXITED,
        REPLICA_FAILED,
        REPLICA_INCOMPATIBLE,
        REPLICA_EJECTED,
        REPLICA_BACKOFF,
        REPLICA_HUNG,
        REPLICA_SUPERVISION_FAILED,
        SIGNAL_PROCESS_EXITED,
        SERVICE_TASK_FAILED,
        EXCHANGE_RETRIED,
        RELOAD_FAILED,
        THREADS_RETIRED,
    }
)


@dataclass(frozen=True)
class Event:
    seq: int
    time: float
    event: str
    fields: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "time": self.time, "event": self.event, **self.fields}


Sink = Callable[[Event], None]


class Subscription:
    """A bounded queue of events for one reader. A reader that falls behind is dropped
    (``dropped`` set, a ``None`` sentinel queued) rather than slowing the publisher."""

    def __init__(self, bus: EventBus, maxsize: int) -> None:
        self._bus = bus
        self.queue: asyncio.Queue[Event | None] = asyncio.Queue(maxsize=maxsize)
        self.dropped = False

    def offer(self, event: Event) -> None:
        if self.dropped:
            return
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped = True
            # Make room for the sentinel so the reader learns it was dropped.
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(None)
            self._bus.unsubscribe(self)

    async def get(self) -> Event | None:
        return await self.queue.get()

    def close(self) -> None:
        self._bus.unsubscribe(self)


class Emit(Protocol):
    """What publishes an event (``EventBus.publish``, or a stand-in in tests)."""

    def __call__(self, name: str, **fields: object) -> object: ...


class EventBus:
    """Publishes events to sinks, keeps the last ``capacity`` in a ring buffer."""

    def __init__(self, capacity: int = 1000, clock: Clock = SYSTEM_CLOCK) -> None:
        self._ring: collections.deque[Event] = collections.deque(maxlen=capacity)
        self._sinks: list[Sink] = []
        self._subs: list[Subscription] = []
        self._seq = 0
        self._clock = clock

    @property
    def last_seq(self) -> int:
        return self._seq

    def add_sink(self, sink: Sink) -> None:
        self._sinks.append(sink)

    def publish(self, name: str, **fields: Any) -> Event:
        self._seq += 1
        event = Event(self._seq, self._clock.time(), name, fields)
        self._ring.append(event)
        for sink in list(self._sinks):
            try:
                sink(event)
            except Exception:  # a broken sink must not break the publisher
                log.exception("event sink failed on %s", name)
        for sub in list(self._subs):
            sub.offer(event)
        return event

    def since(self, seq: int) -> list[Event]:
        return [e for e in self._ring if e.seq > seq]

    def subscribe(self, maxsize: int = 1000) -> Subscription:
        sub = Subscription(self, maxsize)
        self._subs.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        if sub in self._subs:
            self._subs.remove(sub)

    @property
    def subscriber_count(self) -> int:
        return len(self._subs)


def log_sink(logger: logging.Logger | None = None) -> Sink:
    """A sink that writes each event as one log record; the event name is a word in the
    message and, for the journald handler, the ``vllm_sr_event`` / ``vllm_sr_fields`` extras."""
    target = logger or logging.getLogger("vllm_sr.events")

    def _sink(event: Event) -> None:
        level = logging.WARNING if event.event in WARNING_EVENTS else logging.INFO
        detail = " ".join(f"{k}={v}" for k, v in event.fields.items())
        target.log(
            level,
            "%s %s",
            event.event,
            detail,
            extra={"vllm_sr_event": event.event, "vllm_sr_fields": dict(event.fields)},
        )

    return _sink
