"""Clocks. Timing logic takes a ``Clock`` so tests can drive it with ``FakeClock``."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for durations and deadlines)."""
        ...

    def time(self) -> float:
        """Wall-clock Unix seconds (for timestamps shown to people)."""
        ...


class SystemClock:
    # the functions themselves (no Python frame per call: routing reads the clock several
    # times per chat)
    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 1000.0, wall_offset: float = 1_700_000_000.0) -> None:
        self._now = start
        self._wall_offset = wall_offset

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return self._now + self._wall_offset

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self._now += seconds


SYSTEM_CLOCK = SystemClock()
