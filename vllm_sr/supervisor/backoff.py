"""Restart backoff for worker processes (pure logic on an injected clock).

A worker that exits is restarted after 1 s, then 2, 4, ... up to 60 s, so a crash loop costs
little. Once a worker has stayed ready for ``reset_after_s`` the next crash starts again at the
initial delay: a worker that ran for an hour and then died is not a crash loop.
"""

from __future__ import annotations

from vllm_sr.clock import SYSTEM_CLOCK, Clock


class RestartBackoff:
    def __init__(
        self,
        initial_s: float = 1.0,
        max_s: float = 60.0,
        reset_after_s: float = 60.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if not 0 < initial_s <= max_s:
            raise ValueError(f"backoff needs 0 < initial_s <= max_s, got {initial_s}, {max_s}")
        self.initial_s = initial_s
        self.max_s = max_s
        self.reset_after_s = reset_after_s
        self._clock = clock
        self._next = initial_s
        self._ready_since: float | None = None

    def mark_ready(self) -> None:
        self._ready_since = self._clock.monotonic()

    def mark_down(self) -> None:
        """The worker stopped being ready (exited); a stable run before it resets the delay."""
        if (
            self._ready_since is not None
            and self._clock.monotonic() - self._ready_since >= self.reset_after_s
        ):
            self._next = self.initial_s
        self._ready_since = None

    def next_delay(self) -> float:
        """The delay before the next restart; each call doubles the one after, up to max_s."""
        delay = self._next
        self._next = min(self._next * 2, self.max_s)
        return delay

    @property
    def upcoming(self) -> float:
        return self._next
