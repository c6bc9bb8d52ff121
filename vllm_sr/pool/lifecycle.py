"""Lifecycle transitions of a pool's replicas, set by the supervisor (``mark_*``): part of
``ReplicaPool``, kept in its own module. Each keeps dispatch consistent: when no replica outside
ejection could serve any more, the ejected ones serve again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_sr import events as ev
from vllm_sr.pool import compat
from vllm_sr.pool.replica import Replica, ReplicaState
from vllm_sr.pool.settings import PoolSettings


class Lifecycle:
    settings: PoolSettings
    _replicas: dict[str, Replica]
    _emit: Callable[..., Any]

    def _get(self, replica_id: str) -> Replica:
        raise NotImplementedError

    def _restore_if_none_serve(self) -> bool:
        raise NotImplementedError

    def _who(self, r: Replica) -> dict[str, Any]:
        raise NotImplementedError

    def mark_starting(self, replica_id: str, pid: int | None = None) -> None:
        r = self._get(replica_id)
        r.state, r.pid, r.healthy, r.restart_at = ReplicaState.STARTING, pid, True, None
        r.reprobe_at = None
        r.reprobe.reset()
        self._restore_if_none_serve()

    def mark_ready(
        self,
        replica_id: str,
        pid: int | None,
        limits: dict[str, Any] | None = None,
        threads: int | None = None,
        *,
        revision: str | None = None,
        capabilities: dict[str, Any] | None = None,
    ) -> bool:
        """The worker answered /health 200. Returns False (and marks it ``incompatible``)
        when its reported limits differ from the configured ones, or its revision or
        capabilities from the replicas already ready."""
        r = self._get(replica_id)
        r.pid, r.limits, r.threads, r.healthy, r.restart_at = pid, limits, threads, True, None
        r.revision, r.capabilities = revision, capabilities
        r.reprobe_at = None
        r.reprobe.reset()
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
        r = self._get(replica_id)
        r.state, r.pid, r.last_error = ReplicaState.STOPPED, None, reason
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

    def set_adaptive_threads(self, replica_id: str, value: Any) -> None:
        self._get(replica_id).adaptive_threads = value

    def set_last_error(self, replica_id: str, message: str | None) -> None:
        self._get(replica_id).last_error = message

    def idle(self, replica_id: str) -> bool:
        """Nothing in flight (a draining replica may be stopped)."""
        return self._get(replica_id).inflight == 0
