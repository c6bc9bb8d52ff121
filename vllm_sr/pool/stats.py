"""Small bounded statistics the pool keeps per replica: a latency window for p50/p99 and a
request-rate window. Both are O(1) to update so they stay off the request path's budget."""

from __future__ import annotations

import collections
import math

from vllm_sr.clock import Clock


class LatencyWindow:
    """The last ``size`` latencies (seconds); percentiles by nearest rank.

    A bounded window rather than a histogram: inventory wants "how is it doing now", and a
    hung replica's recovery should show within a few hundred requests, not never."""

    def __init__(self, size: int = 1024) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self._values: collections.deque[float] = collections.deque(maxlen=size)

    def __len__(self) -> int:
        return len(self._values)

    def add(self, seconds: float) -> None:
        self._values.append(max(0.0, seconds))

    def percentile(self, q: float) -> float | None:
        """Nearest-rank percentile for ``q`` in (0, 1]; None while empty."""
        return self.percentiles(q)[0]

    def percentiles(self, *qs: float) -> list[float | None]:
        """Several nearest-rank percentiles from one sort (inventory asks for p50 and p99)."""
        for q in qs:
            if not 0.0 < q <= 1.0:
                raise ValueError(f"q must be in (0, 1], got {q}")
        if not self._values:
            return [None for _ in qs]
        ordered = sorted(self._values)
        return [ordered[max(1, math.ceil(q * len(ordered))) - 1] for q in qs]


class RateWindow:
    """Events per second over the last ``window_s`` seconds, in one-second buckets."""

    def __init__(self, clock: Clock, window_s: int = 10) -> None:
        if window_s < 1:
            raise ValueError(f"window_s must be >= 1, got {window_s}")
        self._clock = clock
        self._window_s = window_s
        # (whole second, count), oldest first; at most window_s + 1 entries.
        self._buckets: collections.deque[list[int]] = collections.deque()

    def add(self, n: int = 1) -> None:
        second = math.floor(self._clock.monotonic())
        if self._buckets and self._buckets[-1][0] == second:
            self._buckets[-1][1] += n
        else:
            self._buckets.append([second, n])
        self._trim(second)

    def rate(self) -> float:
        second = math.floor(self._clock.monotonic())
        self._trim(second)
        return sum(count for _, count in self._buckets) / self._window_s

    def _trim(self, second: int) -> None:
        oldest = second - self._window_s + 1
        while self._buckets and self._buckets[0][0] < oldest:
            self._buckets.popleft()
