"""Ejection of a model's backends after consecutive 5xx (``reliability.consecutive_5xx``,
``base_ejection_time``, ``max_ejection_percent``: upstream's Envoy ``outlier_detection``),
on a clock, apart from I/O.

- A chat's outcome counts per backend: an answer 5xx, or a backend that could not be reached
  or broke before its first chunk (Envoy counts those locally-originated failures as 5xx too),
  adds one; any other answer sets the count back to 0.
- After ``consecutive_5xx`` in a row the backend is ejected (selection skips it) for
  ``base_ejection_time`` x the number of times it has been ejected, at most
  ``MAX_EJECTION_S`` or ``base_ejection_time`` if that is longer (Envoy's max_ejection_time);
  when that time is up it comes back with its count at 0.
- Never more than ``max_ejection_percent`` of the model's backends at once (rounded down) and
  never the last one: a backend that reaches the count when the cap is full stays in, and is
  ejected at its next 5xx once there is room.
- ``consecutive_5xx: 0`` (the default) or a model with one backend: no ejection, as upstream
  renders it.

The rules are the cluster's (:mod:`vllm_sr.cluster.ejection`, shared with the pool's
replicas); this module holds the backends' settings and their per-backend state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_sr.clock import Clock
from vllm_sr.cluster.ejection import EjectionRules, Streak, decide
from vllm_sr.config.routing_providers import ProviderModel, seconds_or

DEFAULT_BASE_EJECTION_S = 30.0
DEFAULT_MAX_EJECTION_PERCENT = 50
MAX_EJECTION_S = 300.0


@dataclass
class OutlierState:
    """One backend's ejection state."""

    streak: Streak = field(default_factory=Streak)  # 5xx in a row
    times_ejected: int = 0
    ejected_until: float | None = None


class OutlierDetector:
    """The ejections of one model's ``size`` backends (indexes 0..size-1): the cluster's
    consecutive-failure rules (:mod:`vllm_sr.cluster.ejection`) with Envoy's linear growth,
    in seconds."""

    def __init__(
        self,
        clock: Clock,
        size: int,
        consecutive_5xx: int = 0,
        base_ejection_s: float = DEFAULT_BASE_EJECTION_S,
        max_ejection_percent: int = DEFAULT_MAX_EJECTION_PERCENT,
    ) -> None:
        self._clock = clock
        self.rules = EjectionRules(
            threshold=consecutive_5xx if size > 1 else 0,
            base=base_ejection_s,
            cap=max(MAX_EJECTION_S, base_ejection_s),
            max_percent=max_ejection_percent,
            growth="linear",
        )
        self.states = [OutlierState() for _ in range(size)]

    @classmethod
    def of(cls, model: ProviderModel, clock: Clock) -> OutlierDetector:
        rel = model.reliability
        if rel is None:
            return cls(clock, len(model.backend_refs))
        return cls(
            clock,
            len(model.backend_refs),
            rel.consecutive_5xx,
            seconds_or(rel.base_ejection_time, DEFAULT_BASE_EJECTION_S),
            rel.max_ejection_percent,
        )

    @property
    def enabled(self) -> bool:
        return self.rules.enabled

    def ejected(self, index: int) -> bool:
        """Whether backend ``index`` is out now (an ejection whose time is up ends here)."""
        state = self.states[index]
        if state.ejected_until is None:
            return False
        if self._clock.monotonic() < state.ejected_until:
            return True
        state.ejected_until = None
        state.streak.reset()
        return False

    def ejected_count(self) -> int:
        return sum(self.ejected(i) for i in range(len(self.states)))

    def record(self, index: int, failed_5xx: bool) -> bool:
        """One chat's outcome on backend ``index`` -> whether it was ejected by it."""
        if not self.enabled:
            return False
        state = self.states[index]
        if not failed_5xx:
            state.streak.reset()
            return False
        state.streak.fail()
        if not self.rules.reached(state.streak) or self.ejected(index):
            return False
        decision = decide(
            self.rules,
            members=len(self.states),
            out=self.ejected_count(),
            nth=state.times_ejected + 1,
        )
        if not decision.eject:
            return False
        state.times_ejected += 1
        state.ejected_until = self._clock.monotonic() + decision.duration
        return True

    def ejected_for(self, index: int) -> float | None:
        """Seconds left of backend ``index``'s ejection (None: not ejected)."""
        if not self.ejected(index):
            return None
        until = self.states[index].ejected_until
        return None if until is None else until - self._clock.monotonic()
