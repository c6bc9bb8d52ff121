"""The adaptive thread learner's statistics (``learner`` holds its policy): which thread
counts a worker may try, the log2 token buckets forwards are grouped into, the bit-for-bit
comparison a shadow pass must pass, and what one bucket has measured (timed passes and their
ratios to the configured count, medians over the latest ``KEEP``)."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import numpy

KEEP = 64  # timing samples kept per count per bucket (medians over the latest)


def allowed_counts(configured: int, budget: int) -> list[int]:
    """Powers of two up to the CPU budget, plus the configured count."""
    counts = {configured}
    n = 1
    while n <= max(budget, 1):
        counts.add(n)
        n *= 2
    return sorted(counts)


def bucket_of(n_tokens: int) -> int:
    """log2 bucket: b holds sizes in (2**(b-1), 2**b]; 0 holds 0 and 1."""
    return max(0, (max(n_tokens, 1) - 1).bit_length())


def bucket_label(b: int) -> str:
    return "1" if b == 0 else f"{2 ** (b - 1) + 1}-{2**b}"


def identical(a: numpy.ndarray, b: numpy.ndarray) -> bool:
    """Bit for bit: same dtype, shape and raw bytes (a NaN equals only the same NaN)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def diff_summary(a: numpy.ndarray, b: numpy.ndarray) -> str:
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    av = a.reshape(-1).view(numpy.uint8).reshape(a.size, -1)
    bv = b.reshape(-1).view(numpy.uint8).reshape(b.size, -1)
    differ = int(numpy.count_nonzero((av != bv).any(axis=1)))
    detail = f"{differ} of {a.size} values differ"
    if numpy.issubdtype(a.dtype, numpy.floating):
        delta = float(numpy.nanmax(numpy.abs(a.astype(numpy.float64) - b.astype(numpy.float64))))
        detail += f", max |diff| {delta:.3g}"
    return detail


def median(xs: Any) -> float:
    s = sorted(xs)
    n = len(s)
    return float(s[n // 2]) if n % 2 else float((s[n // 2 - 1] + s[n // 2]) / 2)


@dataclass
class Bucket:
    """What one input-size range has seen. Phases: exploring -> learned (mode 1, or the
    configured count won) or exploring -> verifying -> serving (mode 2)."""

    index: int
    serving: int
    phase: str = "exploring"
    forwards: int = 0
    explored: int = 0
    best: int | None = None
    matches: int = 0
    times: dict[int, deque[float]] = field(default_factory=dict)  # seconds per timed pass
    ratios: dict[int, deque[float]] = field(default_factory=dict)  # t(count) / t(configured)
    samples: Counter[int] = field(default_factory=Counter)

    def add(self, count: int, seconds: float, ratio: float | None) -> None:
        self.times.setdefault(count, deque(maxlen=KEEP)).append(seconds)
        if ratio is not None:
            self.ratios.setdefault(count, deque(maxlen=KEEP)).append(ratio)
        self.samples[count] += 1

    def median_ratio(self, count: int, configured: int) -> float:
        return 1.0 if count == configured else median(self.ratios[count])


def recommend(
    buckets: list[Bucket], allowed: list[int], configured: int, margin: float
) -> int | None:
    """The one count to pin: least expected forward time over the learned buckets,
    each weighted by its forwards; the configured count unless another beats it."""
    learned = [b for b in buckets if b.best is not None and b.times]
    if not learned:
        return None
    if len(allowed) == 1:
        return configured

    def cost(c: int) -> float:
        total = 0.0
        for b in learned:
            base = median(b.times.get(configured) or [1.0])
            total += b.forwards * base * b.median_ratio(c, configured)
        return total

    base_cost = cost(configured)
    best = min(allowed, key=cost)
    return best if cost(best) < (1.0 - margin) * base_cost else configured
