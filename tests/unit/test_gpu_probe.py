"""The GPU token-budget probe's arithmetic on recorded figures, without a GPU: free/total as
``torch.cuda.mem_get_info`` reports them (the driver's figures, which nvidia-smi prints in MiB;
taken from the captures in shared/fixtures/gpu/), weights resident before each probe, and a
peak per probe that grows with its padded tokens."""

from __future__ import annotations

import csv
from typing import Any

import pytest

from tests.support.gpu_fixtures import FIXTURES, MISSING_REASON
from vllm_sr.worker.calibrate import GPU_HEADROOM, GPU_MAX_NUM_SEQS, calibrate
from vllm_sr.worker.gpu import FILLER_ID, free_bytes, make_probe

MIB = 1 << 20
WIDTH = 512  # d3-edge's maximum length: each probe row is this long
WEIGHTS = 87 * MIB  # resident before every probe (d3-edge's float32 weights)


def captured_memory(name: str) -> tuple[int, int]:
    """(free, total) bytes from a captured `nvidia-smi --query-gpu=...` CSV."""
    path = FIXTURES / name
    if not path.exists():
        pytest.skip(MISSING_REASON)
    header, values = list(csv.reader(path.open()))[:2]
    row = {k.strip(): v.strip() for k, v in zip(header, values, strict=False)}

    def mib(key: str) -> int:
        return int(row[key].removesuffix(" MiB")) * MIB

    return mib("memory.free [MiB]"), mib("memory.total [MiB]")


H100 = "nvidia-smi_query-gpu-allfields_csv_h100-80gb-hbm3-1gpu_drv590.48.01.csv"
H200 = "nvidia-smi_query-gpu-allfields_csv_h200-1gpu_drv590.48.01.csv"
L40S = "nvidia-smi_query-gpu-allfields_csv_l40s-1gpu_drv595.80.csv"


class FakeOOM(RuntimeError):
    """Stands for torch.cuda.OutOfMemoryError."""


class RecordedCuda:
    """Replays one card: mem_get_info's (free, total), the weights resident before a probe,
    and a forward's peak of ``WEIGHTS + per_token x padded tokens``; forwards over
    ``oom_above`` padded tokens raise FakeOOM. Records every call in order."""

    def __init__(self, free: int, total: int, per_token: int, oom_above: int | None = None):
        self.free, self.total, self.per_token, self.oom_above = free, total, per_token, oom_above
        self.calls: list[str] = []
        self.forwards: list[list[list[int]]] = []
        self._peak = WEIGHTS

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        self.calls.append("mem_get_info")
        return self.free, self.total

    def synchronize(self, device: Any = None) -> None:
        self.calls.append("synchronize")

    def empty_cache(self) -> None:
        self.calls.append("empty_cache")

    def memory_allocated(self, device: Any = None) -> int:
        return WEIGHTS

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        self.calls.append("reset_peak")
        self._peak = WEIGHTS

    def max_memory_allocated(self, device: Any = None) -> int:
        return self._peak

    def forward(self, rows: list[list[int]]) -> None:
        self.forwards.append(rows)
        tokens = len(rows) * max(map(len, rows))
        if self.oom_above is not None and tokens > self.oom_above:
            raise FakeOOM("CUDA out of memory")
        self._peak = WEIGHTS + self.per_token * tokens


def budget_on(cuda: RecordedCuda) -> tuple[int, list[tuple[int, int | None]]]:
    probe = make_probe(cuda.forward, WIDTH, "cuda:0", cuda, oom=(FakeOOM,))
    cal = calibrate(
        device_kind="cuda",
        max_length=WIDTH,
        max_num_seqs=None,
        max_num_batched_tokens=None,
        probe=probe,
        free_bytes=free_bytes("cuda:0", cuda),
    )
    assert cal.source["max_num_batched_tokens"] == "calibrated"
    assert cal.limits.max_num_seqs == GPU_MAX_NUM_SEQS
    return cal.limits.max_num_batched_tokens, cal.probes


def largest_doubling(free: int, per_token: int) -> int:
    tokens = WIDTH
    while per_token * tokens * 2 * (1 + GPU_HEADROOM) <= free:
        tokens *= 2
    return tokens


def test_h100_budget_is_the_largest_doubling_whose_peak_with_headroom_fits() -> None:
    free, total = captured_memory(H100)
    assert (free, total) == (81081 * MIB, 81559 * MIB)
    cuda = RecordedCuda(free, total, per_token=1_000_000)  # ~1 MB of activations per token
    budget, probes = budget_on(cuda)
    # 81081 MiB / 1.25 / 1 MB = 68015 tokens: 65536 fits, 131072 does not.
    assert budget == 65536 == largest_doubling(free, 1_000_000)
    assert [t for t, _ in probes] == [512 * 2**i for i in range(9)]
    assert all(peak == 1_000_000 * t for t, peak in probes)  # resident weights taken off
    _, last_peak = probes[-1]
    assert last_peak is not None and last_peak * (1 + GPU_HEADROOM) > free
    # Each probe is rows of the maximum length filled with one in-vocabulary id.
    assert [len(rows) for rows in cuda.forwards] == [t // WIDTH for t, _ in probes]
    assert cuda.forwards[3] == [[FILLER_ID] * WIDTH] * 8
    assert cuda.calls[0] == "mem_get_info"  # free memory read once, before probing


def test_a_card_with_more_free_memory_gets_a_larger_budget() -> None:
    h100, _ = captured_memory(H100)
    h200, total = captured_memory(H200)
    l40s, l40s_total = captured_memory(L40S)
    budgets = {
        name: budget_on(RecordedCuda(free, tot, per_token=600_000))[0]
        for name, free, tot in (
            ("l40s", l40s, l40s_total),
            ("h100", h100, 0),
            ("h200", h200, total),
        )
    }
    assert budgets == {
        "l40s": largest_doubling(l40s, 600_000),
        "h100": largest_doubling(h100, 600_000),
        "h200": largest_doubling(h200, 600_000),
    }
    assert budgets["l40s"] < budgets["h100"] < budgets["h200"]


def test_an_out_of_memory_probe_ends_probing_at_the_last_fit() -> None:
    free, total = captured_memory(H200)
    cuda = RecordedCuda(free, total, per_token=10_000, oom_above=16384)
    budget, probes = budget_on(cuda)
    assert budget == 16384
    assert probes[-1] == (32768, None)
    assert cuda.calls[-1] == "empty_cache"  # the failed forward's blocks are given back


def test_memory_another_worker_holds_shrinks_the_budget() -> None:
    """Two workers on one card: what the first took is gone from mem_get_info's free figure
    when the second calibrates (why the supervisor starts them one after another)."""
    free, total = captured_memory(H100)
    first, _ = budget_on(RecordedCuda(free, total, per_token=1_000_000))
    taken = int(first * 1_000_000 * (1 + GPU_HEADROOM)) + WEIGHTS
    second, _ = budget_on(RecordedCuda(free - taken, total, per_token=1_000_000))
    assert second < first
    assert (first + second) * 1_000_000 * (1 + GPU_HEADROOM) <= free  # together they fit


def test_probing_stops_at_the_cap_on_a_huge_card() -> None:
    free, total = captured_memory(H200)
    budget, probes = budget_on(RecordedCuda(free, total, per_token=1_000))
    assert budget == 262_144 and probes[-1][0] == 262_144


def test_free_bytes_is_the_free_figure_not_the_total() -> None:
    cuda = RecordedCuda(5 * MIB, 80 * MIB, per_token=1)
    assert free_bytes("cuda:0", cuda) == 5 * MIB
