"""Lifecycle transitions of a pool's replicas, reported by the supervisor (``mark_*``), and
what else the supervisor learns of a worker (restarts, its learner's report, its usage): part of
``ReplicaPool``, kept in its own module. The supervisor never sets a record's field itself;
these methods are how it tells the pool, the one writer (docs/internals.md, "Replica state").
Each transition keeps dispatch consistent: when no replica outside ejection could serve any
more, the ejected ones serve again."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_sr import events as ev
from vllm_sr.events import Emit
from vllm_sr.jsontypes import JsonObject
from vllm_sr.plan import ReplicaState
from vllm_sr.pool import compat
from vllm_sr.pool.replica import Replica
from vllm_sr.pool.settings import PoolSettings


class Lifecycle:
    settings: PoolSettings
    _replicas: dict[str, Replica]
    _emit: Emit

    if TYPE_CHECKING:

        def _get(self, replica_id: str) -> Replica: ...

        def _restore_if_none_serve(self) -> bool: ...

        def _who(self, r: Replica) -> dict[str, object]: ...

    def mark_starting(self, replica_id: str, pid: int | None = None) -> None:
        r = self._get(replica_id)
        r.state, r.pid, r.restart_at = ReplicaState.STARTING, pid, None
        r.probe.record_success()
        self._restore_if_none_serve()

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
            self._emit(ev.REPLICA_INCOMPATIBLE, **self._who(r), reason=reason)
            self._restore_if_none_serve()
            return False
        r.state = ReplicaState.READY
        return True

    def mark_exited(self, replica_id: str, reason: str) -> None:
        """The process exited (``reason``: its exit, a hang, a restart asked for)."""
        r = self._get(replica_id)
        r.state, r.pid, r.last_error = ReplicaState.STOPPED, None, reason
        r.restart_reason = reason
        self._restore_if_none_serve()

    def mark_hung(self, replica_id: str, reason: str) -> None:
        """Its forward has run past the hang bound: out of dispatch now (a hung forward can
        still answer /health and its result cache), until its next process is ready."""
        r = self._get(replica_id)
        r.state, r.last_error = ReplicaState.HUNG, reason
        self._restore_if_none_serve()

    def mark_backoff_restart(self, replica_id: str, until: float) -> None:
        """The process exited and will be restarted at monotonic ``until``."""
        r = self._get(replica_id)
        r.state, r.pid, r.restart_at = ReplicaState.BACKOFF, None, until
        self._restore_if_none_serve()

    def mark_failed(self, replica_id: str, reason: str) -> None:
        r = self._get(replica_id)
        r.state, r.pid, r.last_error = ReplicaState.FAILED, None, reason
        self._restore_if_none_serve()

    def mark_draining(self, replica_id: str) -> None:
        self._get(replica_id).state = ReplicaState.DRAINING
        self._restore_if_none_serve()

    def mark_stopped(self, replica_id: str) -> None:
        r = self._get(replica_id)
        r.state, r.pid = ReplicaState.STOPPED, None
        self._restore_if_none_serve()

    def set_restarts(self, replica_id: str, restarts: int) -> None:
        self._get(replica_id).restarts = restarts

    def increment_restarts(self, replica_id: str) -> int:
        r = self._get(replica_id)
        r.restarts += 1
        return r.restarts

    def set_adaptive_threads(self, replica_id: str, value: object) -> None:
        self._get(replica_id).adaptive_threads = value

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
