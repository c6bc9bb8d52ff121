"""Latency and rate windows behind the inventory's p50/p99 and requests_per_s."""

from __future__ import annotations

import pytest

from vllm_sr.clock import FakeClock
from vllm_sr.pool.stats import LatencyWindow, RateWindow


def test_percentiles_by_nearest_rank() -> None:
    w = LatencyWindow()
    assert w.percentile(0.5) is None
    for ms in range(100, 0, -1):  # 1..100 ms, out of order
        w.add(ms / 1000)
    assert w.percentile(0.5) == pytest.approx(0.050)
    assert w.percentile(0.99) == pytest.approx(0.099)
    assert w.percentile(1.0) == pytest.approx(0.100)
    assert w.percentiles(0.5, 0.99) == pytest.approx([0.050, 0.099])
    assert LatencyWindow().percentiles(0.5, 0.99) == [None, None]
    with pytest.raises(ValueError, match="q must be"):
        w.percentile(0.0)


def test_latency_window_keeps_only_the_last_values() -> None:
    w = LatencyWindow(size=10)
    for _ in range(100):
        w.add(5.0)  # a slow past
    for _ in range(10):
        w.add(0.01)  # a fast present
    assert len(w) == 10
    assert w.percentile(0.99) == pytest.approx(0.01)


def test_rate_counts_the_last_window_only() -> None:
    clock = FakeClock(start=0.0)
    rate = RateWindow(clock, window_s=10)
    for second in range(10):
        if second:
            clock.advance(1.0)
        rate.add(5)
    assert rate.rate() == pytest.approx(5.0)  # seconds 0..9 inclusive
    clock.advance(5.0)
    assert rate.rate() == pytest.approx(2.5)
    clock.advance(100.0)
    assert rate.rate() == 0.0
