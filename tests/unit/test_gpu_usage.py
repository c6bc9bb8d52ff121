"""gpu_usage(platform): per-GPU memory used/total and utilisation from the same tools as the
inventory, read off real captures through a fake rocm-smi / nvidia-smi on PATH. Expected
values were read off the captures themselves."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.gpu_fixtures import FIXTURES, MISSING_REASON, env_with, fake_tool
from vllm_sr.errors import PlacementError
from vllm_sr.placement.gpus import MIB, NVIDIA_SMI_ARGS, ROCM_SMI_ARGS, gpu_usage

pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason=MISSING_REASON)

RX7800 = (
    "rocm-smi_i-showmeminfo-vram-showpower-showserial-showuse-showtemp-showproductname-"
    "showuniqueid_rx7800xt-1gpu_rocm6.2.4.json"
)

# fixture -> {host id: (used bytes, total bytes, utilisation %)}
CASES: dict[str, dict[int, tuple[int | None, int | None, float | None]]] = {
    RX7800: {0: (11615076352, 17163091968, 100.0)},
    "rocm-smi_showproductname-showuse-showmeminfo-vram_rx7900xt-1gpu_rocm6.1+.json": {
        0: (27856896, 21458059264, 0.0)
    },
    "rocm-smi_showproductname-showuse-showmeminfo-vram_csv_rx7900xt-1gpu_rocm6.1+.csv": {
        0: (27856896, 21458059264, 0.0)
    },
    "rocm-smi_telegraf-flags_mi100-4gpu_rocm6.0.2.json": {
        i: (6750208, 34342961152, 0.0) for i in range(4)
    },
    # rocm-smi -a of ROCm 6.1.2 prints no VRAM section: memory unknown, utilisation known.
    "rocm-smi_a_mi250-1gcd_rocm6.1.2+.json": {0: (None, None, 0.0)},
    "nvidia-smi_q-x_rtx-a5000-2gpu_drv590.44.01.xml": {
        0: (22437 * MIB, 24564 * MIB, 0.0),
        1: (17253 * MIB, 24564 * MIB, 0.0),
    },
    "nvidia-smi_query-gpu-allfields_csv_h200-1gpu_drv590.48.01.csv": {0: (0, 143771 * MIB, 0.0)},
}


def _tool(name: str) -> tuple[str, str]:
    return ("cuda", "nvidia-smi") if name.startswith("nvidia-smi") else ("rocm", "rocm-smi")


@pytest.mark.parametrize("name", sorted(CASES))
def test_usage_per_host_id_from_a_capture(name: str, tmp_path: Path) -> None:
    platform, tool = _tool(name)
    fake_tool(tmp_path, tool, FIXTURES / name)
    usage = gpu_usage(platform, env=env_with(tmp_path))
    expected = {
        host: {"memory_used_bytes": u, "memory_total_bytes": t, "utilization_percent": p}
        for host, (u, t, p) in CASES[name].items()
    }
    assert usage == expected
    args = (tmp_path / f"{tool}.args").read_text().split()
    assert args == (ROCM_SMI_ARGS if platform == "rocm" else NVIDIA_SMI_ARGS)


def test_a_failing_tool_raises_placement_error(tmp_path: Path) -> None:
    name = "nvidia-smi_plain_ERROR-driver-communication-failed.txt"
    fake_tool(tmp_path, "nvidia-smi", FIXTURES / name, rc=9)
    with pytest.raises(PlacementError, match="NVIDIA driver is not reachable"):
        gpu_usage("cuda", env=env_with(tmp_path))


def test_short_timeout_for_periodic_calls(tmp_path: Path) -> None:
    """Called every few seconds from a thread: a hung tool costs 5 s, not the inventory's 20."""
    fake_tool(tmp_path, "rocm-smi", FIXTURES / RX7800)
    seen: dict[str, Any] = {}

    def runner(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        seen.update(kw)
        raise subprocess.TimeoutExpired(argv, kw["timeout"])

    with pytest.raises(PlacementError, match="did not answer within 5 s"):
        gpu_usage("rocm", env=env_with(tmp_path), runner=runner)
    assert seen["timeout"] == 5.0
