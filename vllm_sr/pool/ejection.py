"""What an exchange's outcome and a /health probe do to a replica of one deployment: the
short failure backoff, outlier ejection and readmission (the rules are ``outlier``'s, on the
cluster's), the probes a failure or an ejection asks for, and the time-based transitions
(``tick``). The pool's ``outliers`` (:class:`Outliers`), as a model's ``OutlierDetector`` is
for LLM backends; like the rest of the pool, pure logic on an injected clock. It emits only
what it decides: ``replica_ejected``, ``replica_readmitted`` and
``replica_ejection_withheld``, each once per transition."""

from __future__ import annotations

from collections.abc import Callable

from vllm_sr import events as ev
from vllm_sr.clock import Clock
from vllm_sr.cluster.ejection import EjectionRules
from vllm_sr.errors import Conflict
from vllm_sr.events import Emit
from vllm_sr.plan import ReplicaState
from vllm_sr.pool import outlier
from vllm_sr.pool.replica import Replica, lookup


class Outliers:
    """One deployment's outlier detection and health probes over the pool's replica records
    (the pool's ``outliers``): the cluster rules (``vllm_sr.cluster``) applied to the outcomes
    ``ReplicaPool.release`` reports, to /health probes and to time, plus the control API's
    manual ``eject`` / ``readmit``. It shares the pool's record dict (the pool adds and
    removes members) and writes only the outlier, backoff and probe fields of a record, and a
    drained replica's state on ``readmit``."""

    def __init__(
        self,
        deployment: str,
        replicas: dict[str, Replica],
        policy: EjectionRules,
        *,
        clock: Clock,
        emit: Emit,
    ) -> None:
        self.deployment = deployment
        self.policy = policy
        self.withheld: dict[str, int] = dict.fromkeys(outlier.RULES, 0)
        self.on_wake: Callable[[], None] | None = None  # a probe was requested
        self._replicas = replicas
        self._probes: dict[str, None] = {}  # ordered set
        self._clock = clock
        self._emit = emit

    def _get(self, replica_id: str) -> Replica:
        return lookup(self._replicas, self.deployment, replica_id)

    def forget(self, replica_id: str) -> None:
        """A replica left the pool: no probe is asked for it any more."""
        self._probes.pop(replica_id, None)

    # ----------------------------------------------------------------- outcomes
    def on_success(self, r: Replica, now: float) -> None:
        r.last_success_at = now
        r.backoff_until, r.backoff_set_at = None, None
        r.failure_backoff.reset()
        r.timeouts.reset()
        r.withheld_rule = None
        r.ejection_level = 0  # "starts over": the next ejection is the base again
        if r.ejected:
            self._readmit(r, outlier.WHY_SUCCESS)

    def on_failure(self, r: Replica, started: float, now: float) -> None:
        # Only an exchange sent after the last step began doubles the backoff: the 32
        # exchanges in flight when a worker hung or died are one failure, not 32.
        if not r.failure_backoff.active or r.backoff_set_at is None or started >= r.backoff_set_at:
            r.failure_backoff.next_delay()
            r.backoff_set_at = now
        r.backoff_until = max(r.backoff_until or now, now + r.backoff_s)
        self._request_probe(r.id)

    def _request_probe(self, replica_id: str) -> None:
        self._probes[replica_id] = None
        if self.on_wake is not None:
            self.on_wake()

    def on_timeout(self, r: Replica, started: float) -> None:
        r.timeouts.fail(started)
        if r.ejected or r.state is not ReplicaState.READY or not self.policy.reached(r.timeouts):
            return
        decision = outlier.decide(self.policy, r, self._replicas.values())
        if decision.eject:
            r.ejection_level += 1
            self._eject(r, int(decision.duration), "consecutive_timeouts")
        elif decision.rule != r.withheld_rule:
            r.withheld_rule = decision.rule
            assert decision.rule is not None
            self.withheld[decision.rule] += 1
            self._emit(
                ev.REPLICA_EJECTION_WITHHELD,
                deployment=self.deployment,
                replica=r.id,
                rule=decision.rule,
                timeouts=r.consecutive_timeouts,
            )

    # ----------------------------------------------------------------- probes + time
    def take_probe_requests(self) -> list[str]:
        """Replica ids whose /health should be probed now (after a failed or timed-out
        exchange, at ejection); each id once until taken again."""
        ids = [rid for rid in self._probes if rid in self._replicas]
        self._probes.clear()
        return ids

    def probe_result(self, replica_id: str, healthy: bool, reason: str | None = None) -> None:
        """A /health probe's answer. An unhealthy replica leaves dispatch and is probed
        again (0.1 s doubling to 3.2 s, like the failure backoff) until a healthy answer or
        ``mark_ready``. A healthy answer does not readmit an ejected replica: a hung forward
        can still answer /health."""
        r = self._replicas.get(replica_id)
        if r is None:
            return
        if healthy:
            r.probe.record_success()
            return
        r.last_error = reason or "health probe failed"
        # Nothing else would probe it again: it gets no traffic, so no failures.
        r.probe.record_failure(r.last_error)
        self.restore_if_none_serve()

    def tick(self) -> float | None:
        """Apply time-based transitions (cool-downs ending). Returns seconds until the next
        one, or None when nothing is pending, so a caller can sleep exactly that long."""
        now = self._clock.monotonic()
        self.advance(now)
        pending = [
            t - now
            for r in self._replicas.values()
            for t in (r.ejected_until, r.backoff_until, r.probe.next_check_at)
            if t is not None and t > now
        ]
        return min(pending) if pending else None

    def advance(self, now: float) -> None:
        for r in self._replicas.values():
            if r.ejected_until is not None and now >= r.ejected_until:
                self._readmit(r, outlier.WHY_COOLDOWN)
            if r.backoff_until is not None and now >= r.backoff_until:
                r.backoff_until = None  # the doubling stays until a success
            if r.probe.next_check_at is not None and now >= r.probe.next_check_at:
                r.probe.taken()
                self._request_probe(r.id)

    # ----------------------------------------------------------------- manual ops (control API)
    def eject(
        self, replica_id: str, duration_ms: int | None = None, reason: str = "manual"
    ) -> None:
        """Take a replica out of dispatch for ``duration_ms`` (default: base_ejection_ms).
        Refused when no other replica could take its requests."""
        r = self._get(replica_id)
        if duration_ms is not None and duration_ms < 1:
            raise ValueError(f"duration_ms must be >= 1, got {duration_ms}")
        if not any(o.serving and not o.ejected for o in self._replicas.values() if o is not r):
            raise Conflict(
                f"replica {replica_id!r} cannot be ejected: no other replica of "
                f"{self.deployment!r} can take requests (drain it instead)",
                replica=replica_id,
            )
        self._eject(r, duration_ms or int(self.policy.base), reason)

    def readmit(self, replica_id: str) -> bool:
        """Return an ejected or drained replica to dispatch now; its record starts over.
        False when it was neither."""
        r = self._get(replica_id)
        r.backoff_until, r.backoff_set_at = None, None
        r.failure_backoff.reset()
        r.timeouts.reset()
        r.withheld_rule = None
        r.ejection_level = 0
        if r.state is ReplicaState.DRAINING and r.pid is not None:
            r.state = ReplicaState.READY  # `ctl drain` undone: the process never stopped
            self._emit(ev.REPLICA_READMITTED, **r.who(), why=outlier.WHY_UNDRAIN)
            return True
        if not r.ejected:
            return False
        self._readmit(r, outlier.WHY_MANUAL)
        return True

    # ----------------------------------------------------------------- transitions
    def _eject(self, r: Replica, duration_ms: int, reason: str) -> None:
        r.ejected_until = self._clock.monotonic() + duration_ms / 1000.0
        r.ejections += 1
        r.withheld_rule = None
        self._request_probe(r.id)
        self._emit(
            ev.REPLICA_EJECTED,
            **r.who(),
            timeouts=r.consecutive_timeouts,
            duration_ms=duration_ms,
            reason=reason,
        )

    def _readmit(self, r: Replica, why: str) -> None:
        r.ejected_until = None
        r.readmissions += 1
        self._emit(ev.REPLICA_READMITTED, **r.who(), why=why)

    def restore_if_none_serve(self) -> bool:
        """If no replica outside ejection can take requests, the ejected ones serve again.
        "Can take requests" is read as: ready, healthy and not in its short failure backoff;
        one that is merely full can (its slots free soon: callers keep the 429), while one
        backing off, starting, draining or unreachable cannot. Returns whether any was
        readmitted."""
        now = self._clock.monotonic()
        ejected = []
        for r in self._replicas.values():
            if not r.serving:
                continue
            if not r.ejected and not r.in_backoff(now):
                return False  # it can take requests (perhaps once a slot frees)
            if r.ejected:
                ejected.append(r)
        for r in ejected:
            self._readmit(r, outlier.WHY_NO_OTHER)
        return bool(ejected)
