"""The active health probe of one cluster member (a worker replica's ``/health``, an LLM
backend's ``GET /models``), on a clock.

``unknown`` until the first answer (the member may take requests), ``healthy`` after a good
answer, ``unhealthy`` after a failed one (the member leaves dispatch). A failed probe schedules
the next after a doubling backoff; a healthy member is probed again every ``every_s``, or, with
``every_s`` None (the pool: a replica is probed only after a failure), not until something asks.
"""

from __future__ import annotations

from typing import Literal

from vllm_sr.backoff import Backoff
from vllm_sr.clock import Clock

HealthState = Literal["unknown", "healthy", "unhealthy"]


class HealthProbe:
    def __init__(
        self,
        clock: Clock,
        *,
        backoff_s: float,
        backoff_max_s: float,
        every_s: float | None = None,
    ) -> None:
        self._clock = clock
        self.every_s = every_s
        self.backoff = Backoff(backoff_s, backoff_max_s, clock=clock)
        self.state: HealthState = "unknown"
        # A periodic probe is due at once; a passive one has nothing due until a failure.
        self.next_check_at: float | None = clock.monotonic() if every_s is not None else None
        self.last_error: str | None = None
        self.failures = 0

    @property
    def usable(self) -> bool:
        """Not known to be unhealthy (``unknown`` counts as usable)."""
        return self.state != "unhealthy"

    def due(self) -> bool:
        return self.next_check_at is not None and self._clock.monotonic() >= self.next_check_at

    def record_success(self) -> None:
        """A good answer (or the member reported ready): the backoff starts over."""
        self.state = "healthy"
        self.backoff.reset()
        self.next_check_at = (
            None if self.every_s is None else self._clock.monotonic() + self.every_s
        )

    def record_failure(self, reason: str) -> None:
        """A failed probe: unhealthy, probed again after the next backoff step."""
        self.state = "unhealthy"
        self.failures += 1
        self.last_error = reason
        self.next_check_at = self.backoff.fail()

    def taken(self) -> None:
        """The due probe was handed to a prober (a passive probe is not due again until the
        next failure)."""
        if self.every_s is None:
            self.next_check_at = None
