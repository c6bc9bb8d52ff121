"""The replica pool of one deployment: admission, dispatch, failure backoff, outlier ejection
and the deployment's inventory entry. Pure logic: no sockets, no tasks, an injected clock.

Driving it (one asyncio loop; the pool is not thread-safe and never awaits)::

    pool = ReplicaPool("primary", settings=PoolSettings.from_deployment(dep),
                       clock=SYSTEM_CLOCK, emit=bus.publish, artifact="vllm-sr/d3-edge")
    pool.add_replica("primary-0", "cpu", client=worker_client)  # supervisor: spawned
    pool.mark_ready("primary-0", pid, limits, threads)          # supervisor: /health said ready

    answer = await vllm_sr.pool.exchange.exchange(pool, "/v1/embeddings", body)  # the frontend

``exchange`` does acquire -> send with the deadline -> classify -> release (and a retry on
another replica when the worker broke before answering); ``acquire``/``release`` are the
pure steps it is built on. The pool's ``outliers`` (``ejection.Outliers``: the cluster rules
applied to these replicas, as a model's ``OutlierDetector`` is for LLM backends) run the rest:
``take_probe_requests`` + ``probe_result`` run /health probes, ``tick()`` applies time-based
transitions and says when the next one is due, ``on_wake`` is called when a probe is requested,
so a driver can sleep until then, and ``eject`` / ``readmit`` are the control API's.

Dispatch picks, among replicas that are ready, healthy, not ejected, not in failure backoff
and below ``max_inflight_per_replica``, the one with the fewest outstanding request bytes,
ties to the least recently assigned. There is no queue: all such replicas full raises
``Overloaded``; none that could serve raises ``Unavailable``.

The pool is the one writer of its replica records: the supervisor reports lifecycle
transitions through ``mark_*`` and emits their events itself; outcomes and probes drive backoff
and ejection (``outliers``). The pool emits only what it decides:
``replica_ejected``, ``replica_readmitted``, ``replica_ejection_withheld`` and
``replica_incompatible``, each once per transition.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from vllm_sr import events as ev
from vllm_sr.backoff import Backoff
from vllm_sr.clock import Clock
from vllm_sr.cluster.health import HealthProbe
from vllm_sr.cluster.picking import least_loaded
from vllm_sr.errors import Conflict, Overloaded, Unavailable
from vllm_sr.events import Emit
from vllm_sr.jsontypes import JsonObject
from vllm_sr.plan import ReplicaState
from vllm_sr.pool import compat, views
from vllm_sr.pool.ejection import Outliers
from vllm_sr.pool.replica import OUTCOMES, Client, Outcome, Replica, lookup
from vllm_sr.pool.result_caches import FRONTEND_CACHE_BYTES, cache_sizes
from vllm_sr.pool.settings import PoolSettings

__all__ = ["Emit", "Lease", "PoolSettings", "ReplicaPool"]


RETRY_EVENT_EVERY_S = 1.0  # exchange_retried events: at most one a second per deployment


@dataclass(eq=False)
class Lease:
    """One admitted exchange; give it back with ``ReplicaPool.release`` exactly once
    (a second release is ignored)."""

    replica_id: str
    nbytes: int
    started: float  # monotonic
    released: bool = False
    replica: Replica | None = None  # the record charged (it may leave the pool meanwhile)
    kind: str = "native"


class ReplicaPool:
    """Membership, lifecycle, admission and dispatch of one deployment's replicas; outlier
    ejection and health probes are its ``outliers``."""

    def __init__(
        self,
        deployment: str,
        *,
        settings: PoolSettings | None = None,
        clock: Clock,
        emit: Emit | None = None,
        artifact: str = "",
        desired_replicas: int | None = None,
    ) -> None:
        self.deployment = deployment
        self.artifact = artifact
        self.settings = settings or PoolSettings()
        self.desired_replicas = desired_replicas
        self._clock = clock
        self._emit: Emit = emit or _no_emit
        self._replicas: dict[str, Replica] = {}
        self._seq = 0
        # Outlier detection and health probes over the same records (``ejection``).
        self.outliers = Outliers(
            deployment, self._replicas, self.settings.policy(), clock=clock, emit=self._emit
        )
        self.rejected: dict[str, int] = {"overloaded": 0, "unavailable": 0}
        self.retries = 0
        self._retries_unreported = 0
        self._retry_reported_at: float | None = None
        self.frontend_cache_limit = FRONTEND_CACHE_BYTES  # its bound while the rule keeps one

    @property
    def frontend_cache_bytes(self) -> int:
        """The frontend result cache's bound for this deployment now: the limit with one
        desired replica, 0 otherwise (``vllm_sr.pool.result_caches``); it follows
        ``desired_replicas`` on every publish."""
        desired = self.desired_replicas if self.desired_replicas is not None else len(self)
        return cache_sizes(desired, frontend_bytes=self.frontend_cache_limit).frontend_bytes

    def apply_settings(self, settings: PoolSettings, desired_replicas: int | None) -> None:
        """A new generation's settings, swapped whole (records and their counters stay)."""
        self.settings = settings
        self.outliers.policy = settings.policy()
        self.desired_replicas = desired_replicas

    # ----------------------------------------------------------------- membership
    def add_replica(
        self,
        replica_id: str,
        device: str,
        pid: int | None = None,
        *,
        client: Client | None = None,
        served_model: str | None = None,
    ) -> Replica:
        if replica_id in self._replicas:
            raise Conflict(f"replica {replica_id!r} is already in deployment {self.deployment!r}")
        replica = Replica(replica_id, self.deployment, device, self._clock, pid=pid, client=client)
        replica.served_model = served_model
        lo, hi = self.settings.failure_backoff_s, self.settings.failure_backoff_max_s
        replica.failure_backoff = Backoff(lo, hi)
        replica.probe = HealthProbe(self._clock, backoff_s=lo, backoff_max_s=hi)
        self._replicas[replica_id] = replica
        return replica

    def remove_replica(self, replica_id: str) -> None:
        self._replicas.pop(self._get(replica_id).id)
        self.outliers.forget(replica_id)
        self.outliers.restore_if_none_serve()

    def replica(self, replica_id: str) -> Replica:
        return self._get(replica_id)

    def replicas(self) -> list[Replica]:
        return list(self._replicas.values())

    def __len__(self) -> int:
        return len(self._replicas)

    def __contains__(self, replica_id: object) -> bool:
        return replica_id in self._replicas

    # ----------------------------------------------------------------- admission + dispatch
    def acquire(
        self,
        nbytes: int,
        replica_id: str | None = None,
        *,
        exclude: Collection[str] = (),
        kind: str = "native",
    ) -> Lease:
        """Admit one exchange of ``nbytes`` request bytes and pick its replica.

        Raises ``Overloaded`` when every replica that could take it is full, ``Unavailable``
        when none could (all out, ejected or backing off after a failure). ``replica_id``
        pins the exchange to that replica under the same admission rules (debugging and
        tests; the frontend lets the pool pick); ``exclude`` leaves replicas out (a retry
        goes to another replica). ``kind`` ("native", "routing") is counted per replica."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        now = self._clock.monotonic()
        self.outliers.advance(now)
        candidates: Iterable[Replica]
        if replica_id is not None:
            candidates = [self._get(replica_id)]
        elif exclude:  # a retry: never the replica that just failed
            candidates = [r for r in self._replicas.values() if r.id not in exclude]
        else:  # the hot path: no copy
            candidates = self._replicas.values()
        best = self._pick(now, candidates)
        if best is None and self.outliers.restore_if_none_serve():
            best = self._pick(now, candidates)
        if best is None:
            raise self._refusal(now, candidates)
        self._seq += 1
        best.last_assigned = self._seq
        best.inflight += 1
        best.outstanding_bytes += nbytes
        best.admitted_requests += 1
        best.admitted_bytes += nbytes
        best.by_kind[kind] = best.by_kind.get(kind, 0) + 1
        return Lease(best.id, nbytes, now, replica=best, kind=kind)

    def _pick(self, now: float, candidates: Iterable[Replica]) -> Replica | None:
        """The least loaded replica that may take it: fewest outstanding request bytes, ties
        to the least recently assigned."""
        limit = self.settings.max_inflight_per_replica
        return least_loaded(
            (
                r
                for r in candidates
                if r.serving and not r.ejected and r.inflight < limit and not r.in_backoff(now)
            ),
            _load,
        )

    def _refusal(self, now: float, candidates: Iterable[Replica]) -> Overloaded | Unavailable:
        candidates = list(candidates)
        members = [r for r in candidates if r.serving and not r.ejected]
        full = [r for r in members if r.inflight >= self.settings.max_inflight_per_replica]
        if full:
            self.rejected["overloaded"] += 1
            return Overloaded(
                f"all {len(members)} ready replicas of {self.deployment!r} are full "
                f"({self.settings.max_inflight_per_replica} in flight each)",
                retry_after_s=1.0,
                deployment=self.deployment,
            )
        self.rejected["unavailable"] += 1
        if members:  # every one is in its short failure backoff
            wait = min((r.backoff_until or now) - now for r in members)
            return Unavailable(
                f"every ready replica of {self.deployment!r} is backing off after a failure",
                deployment=self.deployment,
                retry_after_s=round(max(wait, 0.0), 3),
            )
        states = {r.id: r.display_state() for r in self._replicas.values()}
        return Unavailable(
            f"no ready replica in deployment {self.deployment!r}",
            deployment=self.deployment,
            replicas=states,
            retry_after_s=1.0,
        )

    def release(self, lease: Lease, outcome: Outcome, latency_s: float | None = None) -> None:
        """Give back an exchange with how it ended: ``success`` (a forward produced the
        answer), ``timeout`` (ran out of its deadline, here or in the worker), ``failure``
        (the worker failed or died), ``cancelled`` (the caller went away), ``refused`` (the
        worker refused it) or ``no_forward`` (answered without a forward: a result-cache hit,
        a verdict on the input). ``latency_s`` defaults to now minus the lease's start."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")
        if lease.released:
            return
        lease.released = True
        current = self._replicas.get(lease.replica_id)
        r = lease.replica or current
        if r is None:
            return
        now = self._clock.monotonic()
        r.inflight = max(0, r.inflight - 1)
        r.outstanding_bytes = max(0, r.outstanding_bytes - lease.nbytes)
        if r.inflight == 0 and r.idle_waiters:
            waiters, r.idle_waiters = r.idle_waiters, []
            for wake in waiters:
                wake()
        if current is not r:
            # Removed while the exchange ran (a retired or replaced worker): its own record
            # is settled above; dispatch state of the pool (and a successor under the same
            # id) is not charged.
            return
        r.outcomes[outcome] += 1
        r.rate.add()
        if outcome == "success":
            r.latency.add(latency_s if latency_s is not None else now - lease.started)
            self.outliers.on_success(r, now)
        elif outcome == "timeout":
            self.outliers.on_failure(r, lease.started, now)
            self.outliers.on_timeout(r, lease.started)
        elif outcome == "failure":
            self.outliers.on_failure(r, lease.started, now)
        elif outcome == "no_forward":
            r.latency.add(latency_s if latency_s is not None else now - lease.started)
        # cancelled / refused / no_forward: neither counts nor resets the run of timeouts
        # (an answer no forward produced says nothing of whether the forward works).

    # ----------------------------------------------------------------- lifecycle
    # The supervisor never sets a record's field itself: these methods are how it tells the pool,
    # the one writer (docs/internals.md, "Replica state"). Each transition keeps dispatch
    # consistent: when no replica outside ejection could serve any more, the ejected ones serve
    # again.
    def mark_starting(self, replica_id: str, pid: int | None = None) -> None:
        r = self._get(replica_id)
        r.state, r.pid, r.restart_at = ReplicaState.STARTING, pid, None
        r.probe.record_success()
        self.outliers.restore_if_none_serve()

    def mark_ready(
        self,
        replica_id: str,
        pid: int | None,
        limits: JsonObject | None = None,
        threads: int | None = None,
        *,
        revision: str | None = None,
        capabilities: JsonObject | None = None,
    ) -> bool:
        """The worker answered /health 200. Returns False (and marks it ``incompatible``)
        when its reported limits differ from the configured ones, or its revision or
        capabilities from the replicas already ready."""
        r = self._get(replica_id)
        r.pid, r.limits, r.threads, r.restart_at = pid, limits, threads, None
        r.revision, r.capabilities = revision, capabilities
        r.probe.record_success()
        peers = [
            (o.id, o.revision, o.capabilities)
            for o in self._replicas.values()
            if o is not r and o.state is ReplicaState.READY
        ]
        reason = compat.limits_problem(self.settings, limits or {}) or compat.peer_problem(
            revision, capabilities, peers
        )
        if reason is not None:
            r.state, r.last_error = ReplicaState.INCOMPATIBLE, reason
            self._emit(ev.REPLICA_INCOMPATIBLE, **r.who(), reason=reason)
            self.outliers.restore_if_none_serve()
            return False
        r.state = ReplicaState.READY
        return True

    def mark_exited(self, replica_id: str, reason: str) -> None:
        """The process exited (``reason``: its exit, a hang, a restart asked for)."""
        r = self._get(replica_id)
        r.state, r.pid, r.last_error = ReplicaState.STOPPED, None, reason
        r.restart_reason = reason
        self.outliers.restore_if_none_serve()

    def mark_hung(self, replica_id: str, reason: str) -> None:
        """Its forward has run past the hang bound: out of dispatch now (a hung forward can
        still answer /health and its result cache), until its next process is ready."""
        r = self._get(replica_id)
        r.state, r.last_error = ReplicaState.HUNG, reason
        self.outliers.restore_if_none_serve()

    def mark_backoff_restart(self, replica_id: str, until: float) -> None:
        """The process exited and will be restarted at monotonic ``until``."""
        r = self._get(replica_id)
        r.state, r.pid, r.restart_at = ReplicaState.BACKOFF, None, until
        self.outliers.restore_if_none_serve()

    def mark_failed(self, replica_id: str, reason: str) -> None:
        r = self._get(replica_id)
        r.state, r.pid, r.last_error = ReplicaState.FAILED, None, reason
        self.outliers.restore_if_none_serve()

    def mark_draining(self, replica_id: str) -> None:
        self._get(replica_id).state = ReplicaState.DRAINING
        self.outliers.restore_if_none_serve()

    def mark_stopped(self, replica_id: str) -> None:
        r = self._get(replica_id)
        r.state, r.pid = ReplicaState.STOPPED, None
        self.outliers.restore_if_none_serve()

    def set_restarts(self, replica_id: str, restarts: int) -> None:
        self._get(replica_id).restarts = restarts

    def increment_restarts(self, replica_id: str) -> int:
        r = self._get(replica_id)
        r.restarts += 1
        return r.restarts

    def set_adaptive_threads(self, replica_id: str, value: object) -> None:
        self._get(replica_id).adaptive_threads = value

    def set_result_cache_bytes(self, replica_id: str, value: object) -> None:
        """The worker's result cache bound, as its /health or a resize answered (None: it
        did not say: an attached runtime)."""
        bound = value if isinstance(value, int) and not isinstance(value, bool) else None
        self._get(replica_id).result_cache_bytes = bound

    def set_last_error(self, replica_id: str, message: str | None) -> None:
        self._get(replica_id).last_error = message

    def set_usage(self, replica_id: str, usage: JsonObject) -> None:
        """The worker's sampled CPU %, RSS and GPU usage (the supervisor's usage sampler)."""
        self._get(replica_id).usage = usage

    def note_supervision_failed(self, replica_id: str, failures: int, error: str) -> None:
        """The supervisor's life loop for it raised (``failures`` times so far)."""
        r = self._get(replica_id)
        r.supervision_failures, r.last_error = failures, error

    def idle(self, replica_id: str) -> bool:
        """Nothing in flight (a draining replica may be stopped)."""
        return self._get(replica_id).inflight == 0

    # ----------------------------------------------------------------- retries
    def note_retry(self, failed_replica: str, error: str) -> None:
        """An exchange that failed on ``failed_replica`` before an answer goes to another
        replica. Counted always; ``exchange_retried`` is published at most once a second per
        deployment, with how many retries it stands for."""
        self.retries += 1
        self._retries_unreported += 1
        r = self._replicas.get(failed_replica)
        if r is not None:
            r.retried_away += 1
        now = self._clock.monotonic()
        last = self._retry_reported_at
        if last is not None and now - last < RETRY_EVENT_EVERY_S:
            return
        self._retry_reported_at = now
        count, self._retries_unreported = self._retries_unreported, 0
        self._emit(
            ev.EXCHANGE_RETRIED,
            deployment=self.deployment,
            replica=failed_replica,
            count=count,
            error=error,
        )

    def _get(self, replica_id: str) -> Replica:
        return lookup(self._replicas, self.deployment, replica_id)

    # ----------------------------------------------------------------- inventory + metrics
    def inventory(self) -> JsonObject:
        """This deployment's entry in the inventory document (docs/internals.md)."""
        self.outliers.advance(self._clock.monotonic())
        return views.inventory(self, self._clock)

    def metrics(self) -> JsonObject:
        """Counters for /metrics: per replica, withheld ejections by rule, refusals, retries."""
        return views.metrics(self)


def _load(r: Replica) -> tuple[float, float]:
    return (r.outstanding_bytes, r.last_assigned)


def _no_emit(name: str, **fields: object) -> None:
    """A pool built without an event bus (tests) publishes nothing."""
