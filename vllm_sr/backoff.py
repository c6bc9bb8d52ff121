"""One doubling backoff for the whole project (pure logic; an injected clock where time matters).

Used by the supervisor (worker restarts: 1 s doubling to 60 s, reset after a stable run), the
cluster rules (a replica's short failure backoff, the /health re-probes of replicas and LLM
backends: ``vllm_sr.cluster``), the replay writer's reconnects (1 s doubling to 60 s) and
vllm-sr-top (reconnects). ``next_delay`` returns the delay to wait now and doubles the one after,
up to ``max_s``; ``reset`` starts over at ``initial_s``. ``fail`` is the same step as a time on
the clock (``retry_at``), and ``due`` says whether that time has come.
"""

from __future__ import annotations

from vllm_sr.clock import SYSTEM_CLOCK, Clock


class Backoff:
    def __init__(
        self,
        initial_s: float,
        max_s: float,
        *,
        reset_after_s: float | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if not 0 < initial_s <= max_s:
            raise ValueError(f"backoff needs 0 < initial_s <= max_s, got {initial_s}, {max_s}")
        self.initial_s = initial_s
        self.max_s = max_s
        self.reset_after_s = reset_after_s
        self._clock = clock
        self._next = initial_s
        self.current = 0.0  # the delay last handed out; 0.0 = not backing off
        self.retry_at: float | None = None  # monotonic; set by ``fail``, cleared by ``reset``
        self._ready_since: float | None = None

    @property
    def active(self) -> bool:
        """A delay has been handed out since the last reset."""
        return self.current > 0.0

    @property
    def upcoming(self) -> float:
        return self._next

    def next_delay(self) -> float:
        """The delay to wait now; each call doubles the one after, up to ``max_s``."""
        self.current = self._next
        self._next = min(self._next * 2, self.max_s)
        return self.current

    def fail(self) -> float:
        """A failure now: the next try may start at the returned monotonic time (now plus
        ``next_delay()``), also kept in ``retry_at``."""
        self.retry_at = self._clock.monotonic() + self.next_delay()
        return self.retry_at

    def due(self) -> bool:
        """Whether a try may start now: no failure since the reset, or its delay is over."""
        return self.retry_at is None or self._clock.monotonic() >= self.retry_at

    def reset(self) -> None:
        self._next = self.initial_s
        self.current = 0.0
        self.retry_at = None

    # A restart loop's view: a run that stayed up ``reset_after_s`` is not a crash loop.
    def mark_ready(self) -> None:
        self._ready_since = self._clock.monotonic()

    def mark_down(self) -> None:
        """The worker stopped being ready; a stable run before it resets the delay."""
        since, self._ready_since = self._ready_since, None
        if (
            since is not None
            and self.reset_after_s is not None
            and self._clock.monotonic() - since >= self.reset_after_s
        ):
            self.reset()
