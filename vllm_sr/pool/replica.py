"""One replica as the pool sees it: its lifecycle state (reported by the supervisor through the
pool's ``mark_*``), its dispatch accounting (acquire/release) and its outlier record; the pool
writes every field. ``ReplicaState`` itself is ``vllm_sr.plan``'s, shared with the supervisor.

Ejection and the short failure backoff are overlays on the lifecycle state, not states of
their own inside the replica: a replica can be ``ready`` (its process is healthy) and ejected
at once, and when its process exits while ejected the ejection's clock keeps running. The
inventory shows ``ejected`` for a ready replica that is ejected (``display_state``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from vllm_sr.backoff import Backoff
from vllm_sr.clock import Clock
from vllm_sr.cluster.ejection import Streak
from vllm_sr.cluster.health import HealthProbe
from vllm_sr.errors import NotFound
from vllm_sr.jsontypes import JsonObject
from vllm_sr.plan import ReplicaState
from vllm_sr.pool.stats import LatencyWindow, RateWindow

if TYPE_CHECKING:
    from vllm_sr.pool.connection import WorkerResponse

__all__ = ["OUTCOMES", "Client", "Outcome", "Replica", "ReplicaState", "lookup"]


class Client(Protocol):
    """What is asked of a worker client (``vllm_sr.pool.client.WorkerClient``): the pool's
    exchanges ``post``; the frontend's /metrics scrape ``request``s ``GET /metrics``."""

    async def post(
        self,
        path: str,
        body: bytes,
        *,
        timeout_s: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> WorkerResponse: ...

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        timeout_s: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> WorkerResponse: ...


Outcome = Literal["success", "timeout", "failure", "cancelled", "refused", "no_forward"]
OUTCOMES: tuple[Outcome, ...] = (
    "success",
    "timeout",
    "failure",
    "cancelled",
    "refused",
    "no_forward",
)


@dataclass(eq=False)
class Replica:
    """Mutable record of one replica. The pool is the only writer: the supervisor reports
    what it sees through the pool's methods (``mark_*``, ``note_*``, ``set_*``), never by
    setting a field (docs/internals.md, "Replica state")."""

    id: str
    deployment: str
    device: str
    clock: Clock = field(repr=False)
    pid: int | None = None
    state: ReplicaState = ReplicaState.STARTING
    limits: JsonObject | None = None
    revision: str | None = None  # what the worker reports loading (HF revision or content hash)
    capabilities: JsonObject | None = None  # surfaces, dimensions, max_length, labels, dtype
    threads: int | None = None
    adaptive_threads: object = None  # the worker's learner report (JSON), as /health gave it
    result_cache_bytes: int | None = None  # the worker's result cache bound, as it reported
    restarts: int = 0
    last_error: str | None = None
    restart_at: float | None = None  # monotonic; when the supervisor restarts it (BACKOFF)
    client: Client | None = field(default=None, repr=False)  # how exchanges reach the worker
    served_model: str | None = None  # attached runtimes: the name to put in "model"
    restart_reason: str | None = None  # why the last restart happened (exit, hung, request)
    supervision_failures: int = 0  # times the supervisor's life loop for it raised
    usage: JsonObject | None = None  # sampled process / device usage (CPU %, RSS, GPU)

    # Dispatch accounting.
    inflight: int = 0
    outstanding_bytes: int = 0
    admitted_requests: int = 0
    admitted_bytes: int = 0
    last_assigned: int = 0  # pool-wide sequence number of its last assignment; 0 = never

    # Short failure backoff (0.1 s doubling to 3.2 s); not active = not in a failure streak.
    failure_backoff: Backoff = field(default_factory=lambda: Backoff(0.1, 3.2), repr=False)
    backoff_until: float | None = None
    backoff_set_at: float | None = None  # when the current backoff step began
    # /health probes after a failure (0.1 s doubling to 3.2 s); usable until one fails.
    probe: HealthProbe = field(init=False, repr=False)

    # Outlier record.
    timeouts: Streak = field(default_factory=Streak)  # timed-out exchanges in a row
    last_success_at: float | None = None  # when its last successful answer arrived
    ejected_until: float | None = None  # monotonic
    ejection_level: int = 0  # ejections since the last success: the cool-down's doubling
    ejections: int = 0
    readmissions: int = 0
    withheld_rule: str | None = None  # the rule holding an ejection back, once per transition

    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    by_kind: dict[str, int] = field(default_factory=dict)  # admitted exchanges per kind
    retried_away: int = 0  # exchanges that failed here and were sent to another replica
    idle_waiters: list[Callable[[], None]] = field(default_factory=list, repr=False)
    latency: LatencyWindow = field(default_factory=LatencyWindow, repr=False)
    rate: RateWindow = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rate = RateWindow(self.clock)
        self.probe = HealthProbe(self.clock, backoff_s=0.1, backoff_max_s=3.2)

    @property
    def healthy(self) -> bool:
        """The last /health probe answered 200 (or there was none yet)."""
        return self.probe.usable

    @property
    def consecutive_timeouts(self) -> int:
        return self.timeouts.count

    @consecutive_timeouts.setter
    def consecutive_timeouts(self, count: int) -> None:
        self.timeouts.count = count

    @property
    def backoff_s(self) -> float:
        """The current failure backoff step; 0.0 when not in a failure streak."""
        return self.failure_backoff.current

    @property
    def ejected(self) -> bool:
        return self.ejected_until is not None

    @property
    def serving(self) -> bool:
        """Healthy and a member of dispatch, ejection and failure backoff aside."""
        return self.state is ReplicaState.READY and self.healthy

    def who(self) -> dict[str, object]:
        """The fields every replica event carries."""
        return {
            "deployment": self.deployment,
            "replica": self.id,
            "device": self.device,
            "pid": self.pid,
        }

    def in_backoff(self, now: float) -> bool:
        return self.backoff_until is not None and now < self.backoff_until

    def display_state(self) -> str:
        if self.ejected and self.state is ReplicaState.READY:
            return ReplicaState.EJECTED.value
        return self.state.value

    def requests(self) -> int:
        return sum(self.outcomes.values())

    def inventory(self, max_inflight: int, clock: Clock) -> JsonObject:
        """This replica's entry in the inventory document (docs/internals.md)."""
        p50, p99 = self.latency.percentiles(0.5, 0.99)
        ejected_until = None
        if self.ejected_until is not None:
            # Unix seconds for people; the pool itself runs on the monotonic clock.
            ejected_until = clock.time() + (self.ejected_until - clock.monotonic())
        return {
            "id": self.id,
            "deployment": self.deployment,
            "device": self.device,
            "pid": self.pid,
            "state": self.display_state(),
            "ready": self.serving,
            "inflight": self.inflight,
            "max_inflight": max_inflight,
            "outstanding_bytes": self.outstanding_bytes,
            "restarts": self.restarts,
            "limits": dict(self.limits) if self.limits is not None else None,
            "revision": self.revision,
            "dtype": (self.capabilities or {}).get("dtype"),
            "last_error": self.last_error,
            "ejected_until": ejected_until,
            "ejections": self.ejections,
            "consecutive_timeouts": self.consecutive_timeouts,
            "threads": self.threads,
            "requests": self.requests(),
            "requests_per_s": self.rate.rate(),
            "latency_p50_ms": p50 * 1000.0 if p50 is not None else None,
            "latency_p99_ms": p99 * 1000.0 if p99 is not None else None,
            "adaptive_threads": self.adaptive_threads,
            "result_cache_bytes": self.result_cache_bytes,
            "requests_by_kind": dict(self.by_kind),
            "retried_away": self.retried_away,
            "restart_reason": self.restart_reason,
            "supervision_failures": self.supervision_failures,
            "usage": self.usage,
        }


def lookup(replicas: dict[str, Replica], deployment: str, replica_id: str) -> Replica:
    """``replicas[replica_id]``, else ``NotFound`` naming the deployment's replicas."""
    try:
        return replicas[replica_id]
    except KeyError:
        raise NotFound(
            f"replica {replica_id!r} not found in deployment {deployment!r}; "
            f"replicas: {', '.join(replicas) or 'none'}",
            replica=replica_id,
        ) from None
