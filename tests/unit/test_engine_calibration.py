"""Calibration of unset limits: CPU defaults, configured values win, GPU probing with a fake
probe (peak bytes per token scripted) to the largest budget that fits with headroom."""

from __future__ import annotations

import pytest

from vllm_sr.errors import ArtifactError
from vllm_sr.worker.calibrate import (
    CPU_MAX_NUM_BATCHED_TOKENS,
    CPU_MAX_NUM_SEQS,
    GPU_HEADROOM,
    GPU_MAX_NUM_BATCHED_TOKENS,
    calibrate,
    gpu_token_budget,
)


class FakeProbe:
    """Peak bytes = base + per_token x tokens; MemoryError past ``oom_at`` tokens."""

    def __init__(self, per_token: int, base: int = 0, oom_at: int | None = None) -> None:
        self.per_token = per_token
        self.base = base
        self.oom_at = oom_at
        self.calls: list[int] = []

    def __call__(self, tokens: int) -> int:
        self.calls.append(tokens)
        if self.oom_at is not None and tokens > self.oom_at:
            raise MemoryError(tokens)
        return self.base + self.per_token * tokens


def test_cpu_uses_the_documented_defaults() -> None:
    cal = calibrate(
        device_kind="cpu", max_length=512, max_num_seqs=None, max_num_batched_tokens=None
    )
    assert cal.limits.max_num_seqs == CPU_MAX_NUM_SEQS
    assert cal.limits.max_num_batched_tokens == CPU_MAX_NUM_BATCHED_TOKENS
    assert cal.source == {"max_num_seqs": "cpu default", "max_num_batched_tokens": "cpu default"}


def test_cpu_budget_always_fits_one_longest_row() -> None:
    cal = calibrate(
        device_kind="cpu", max_length=16384, max_num_seqs=None, max_num_batched_tokens=None
    )
    assert cal.limits.max_num_batched_tokens == 16384


def test_configured_limits_are_kept_and_nothing_is_probed() -> None:
    probe = FakeProbe(per_token=1)
    cal = calibrate(
        device_kind="cuda",
        max_length=512,
        max_num_seqs=8,
        max_num_batched_tokens=1000,
        probe=probe,
        free_bytes=10,
    )
    assert (cal.limits.max_num_seqs, cal.limits.max_num_batched_tokens) == (8, 1000)
    assert probe.calls == []
    assert set(cal.source.values()) == {"configured"}


def test_gpu_picks_the_largest_doubling_that_fits_with_headroom() -> None:
    per_token = 1000
    free = 10_000_000
    probe = FakeProbe(per_token)
    budget = gpu_token_budget(probe, free, max_length=512)
    # The answer fits with headroom, and twice it would not.
    assert budget * per_token * (1 + GPU_HEADROOM) <= free
    assert 2 * budget * per_token * (1 + GPU_HEADROOM) > free
    assert probe.calls[0] == 512
    assert all(b == 2 * a for a, b in zip(probe.calls, probe.calls[1:], strict=False))


def test_gpu_stops_at_an_out_of_memory_probe() -> None:
    probe = FakeProbe(per_token=1, oom_at=4096)
    record: list[tuple[int, int | None]] = []
    budget = gpu_token_budget(probe, free_bytes=10**12, max_length=512, record=record)
    assert budget == 4096
    assert record[-1] == (8192, None)


def test_gpu_probing_is_capped() -> None:
    budget = gpu_token_budget(FakeProbe(per_token=1), free_bytes=10**15, max_length=512)
    assert budget <= GPU_MAX_NUM_BATCHED_TOKENS


def test_gpu_too_small_for_one_row_is_an_artifact_error() -> None:
    with pytest.raises(ArtifactError, match="cannot fit one forward of 512 tokens"):
        gpu_token_budget(FakeProbe(per_token=1000), free_bytes=1000, max_length=512)


def test_gpu_calibration_through_calibrate_reports_its_source() -> None:
    cal = calibrate(
        device_kind="rocm",
        max_length=256,
        max_num_seqs=None,
        max_num_batched_tokens=None,
        probe=FakeProbe(per_token=100, base=1000),
        free_bytes=1_000_000,
    )
    assert cal.source["max_num_batched_tokens"] == "calibrated"
    assert cal.limits.max_num_batched_tokens >= 256
    assert cal.probes and cal.probes[0][0] == 256
