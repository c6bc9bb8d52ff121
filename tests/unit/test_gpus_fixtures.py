"""GPU inventory on every real tool capture in shared/fixtures/gpu/, through a small executable
named rocm-smi / nvidia-smi put first on PATH that prints the capture (the fixtures' bytes are
only read). Expected values were read off the captures themselves (see the fixture README)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.gpu_fixtures import FIXTURES, MISSING_REASON, env_with, fake_tool
from vllm_sr.errors import PlacementError
from vllm_sr.placement.gpus import (
    MIB,
    NVIDIA_SMI_ARGS,
    ROCM_SMI_ARGS,
    parse_nvidia_csv,
    parse_tool_output,
    query_gpus,
)

pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason=MISSING_REASON)

# file -> (GPU count, first GPU's name, VRAM total MiB, VRAM free MiB, unique id, PCI bus)
# or an error text the PlacementError must contain.
N = None
EXPECTED: dict[
    str, tuple[int, str | None, int | None, int | None, str | None, str | None] | str
] = {
    "amd-smi_metric-p_json_unknown-gpu-1gpu_amdsmi-changelog-example.json": "unexpected shape",
    "amd-smi_metric-u_json_radeon-pro-w7700-1gpu_rocm6.x_PARTIAL.txt": "garbled JSON",
    "amd-smi_metric-w1_json_hp-z2-mini-g1a-apu_rocm7.x_PARTIAL.txt": "garbled JSON",
    "amd-smi_plain_ERROR-driver-not-initialized_builtin-amdgpu_amdsmi26.1.0.txt": "amdgpu driver is not loaded",  # noqa: E501
    "amd-smi_static-clock_json_mi355x_PARTIAL.txt": "garbled JSON",
    "amd-smi_static_json_rx7800xt-1gpu_rocm7.x_gpu_data-wrapper_PARTIAL.txt": "garbled JSON",
    "nvidia-smi_L_h100-mig-1gpu_drv590.48.01.txt": "printed a report, not CSV",
    "nvidia-smi_plain-table_h100-80gb-hbm3-1gpu_drv590.48.01.txt": "printed a report, not CSV",
    "nvidia-smi_plain-table_h100-80gb-hbm3-8gpu_drv565.57.01.txt": "printed a report, not CSV",
    "nvidia-smi_plain_ERROR-driver-communication-failed.txt": "NVIDIA driver is not reachable",
    "nvidia-smi_q-x_a100-sxm4-80gb-1gpu_drv535.54.03.xml": (
        1,
        "NVIDIA A100-SXM4-80GB",
        81920,
        80999,
        "GPU-513536b6-7d19-9063-b049-1e69664bb298",
        "00000000:01:00.0",
    ),
    "nvidia-smi_q-x_rtx-a5000-2gpu_drv590.44.01.xml": (
        2,
        "NVIDIA RTX A5000",
        24564,
        1678,
        "GPU-12345678-aaaa-bbbb-cccc-0123456789ab",
        "00000000:81:00.0",
    ),
    "nvidia-smi_q_rtx2080ti-4gpu_drv545.23.08_ANONYMIZED.txt": "printed a report, not CSV",
    "nvidia-smi_query-gpu-11fields_csv_rtx2060-1gpu_drv460.91.03.csv": (
        1,
        "GeForce RTX 2060",
        5934,
        5252,
        N,
        "00000000:09:00.0",
    ),
    "nvidia-smi_query-gpu-12fields_csv-noheader-nounits_gtx1070ti-1gpu_PARTIAL-single-line.csv": "line 1 has 12 fields, expected 8",  # noqa: E501
    "nvidia-smi_query-gpu-12fields_csv-noheader-nounits_tesla-p4-1gpu_PARTIAL-single-line.csv": "line 1 has 12 fields, expected 8",  # noqa: E501
    "nvidia-smi_query-gpu-15fields_csv_tesla-p100-pcie-16gb-1gpu.csv": (
        1,
        "Tesla P100-PCIE-16GB",
        N,
        16280,
        "GPU-ef1b2c9b-38d8-2090-2bd1-f567a3eb42a6",
        N,
    ),
    "nvidia-smi_query-gpu-allfields_csv_h100-80gb-hbm3-1gpu_drv590.48.01.csv": (
        1,
        "NVIDIA H100 80GB HBM3",
        81559,
        81081,
        "GPU-00000000-0000-0000-0000-000000000000",
        "00000000:00:09.0",
    ),
    "nvidia-smi_query-gpu-allfields_csv_h100-mig-1gpu_drv590.48.01.csv": (
        1,
        "NVIDIA H100 80GB HBM3",
        81559,
        81022,
        "GPU-00000000-0000-0000-0000-000000000000",
        "00000000:00:09.0",
    ),
    "nvidia-smi_query-gpu-allfields_csv_h200-1gpu_drv590.48.01.csv": (
        1,
        "NVIDIA H200",
        143771,
        143158,
        "GPU-00000000-0000-0000-0000-000000000000",
        "00000000:83:00.0",
    ),
    "nvidia-smi_query-gpu-allfields_csv_l40s-1gpu_drv595.80.csv": (
        1,
        "NVIDIA L40S",
        46068,
        45460,
        "GPU-00000000-0000-0000-0000-000000000000",
        "00000000:01:00.0",
    ),
    "nvidia-smi_query-gpu-allfields_csv_rtx4080super-1gpu_drv595.71.05.csv": (
        1,
        "NVIDIA GeForce RTX 4080 SUPER",
        16376,
        15348,
        "GPU-00000000-0000-0000-0000-000000000000",
        "00000000:01:00.0",
    ),
    "rocm-smi_a_json_ERROR-no-amd-gpus-specified_nvidia-only-allocation_rocm6.0.txt": (
        0,
        N,
        N,
        N,
        N,
        N,
    ),
    "rocm-smi_a_mi210-1gpu_rocm5.x_RECONSTRUCTED.json": (
        1,
        "GENERIC RM IMAGE",
        N,
        N,
        "0x43cc8cc8af246708",
        "0000:63:00.0",
    ),
    "rocm-smi_a_mi250-1gcd_rocm5.x.json": (
        1,
        "AMD INSTINCT MI250 (MCM) OAM AC MBA",
        N,
        N,
        "0x719d230578348e8c",
        "0000:2F:00.0",
    ),
    "rocm-smi_a_mi250-1gcd_rocm6.1.2+.json": (
        1,
        "AMD INSTINCT MI250 (MCM) OAM AC MBA",
        N,
        N,
        "0x1f9de0957d137942",
        "0000:29:00.0",
    ),
    "rocm-smi_i-showmeminfo-vram-showpower-showserial-showuse-showtemp-showproductname-"
    "showuniqueid_rx7800xt-1gpu_rocm6.2.4.json": (
        1,
        "Navi 32 [Radeon RX 7700 XT / 7800 XT]",
        16368,
        5291,
        "0x5c88007d760374f3",
        N,
    ),
    "rocm-smi_plain-a_mi300x-vf-4gpu_rocm6.0-6.1.0.txt": "text table, not JSON",
    "rocm-smi_plain-concise_mi300x-8gpu_rocm6.2.2.txt": "text table, not JSON",
    "rocm-smi_plain-concise_mi300x-vf-1gpu_rocm6.0-6.1.0.txt": "text table, not JSON",
    "rocm-smi_plain-concise_mi300x-vf-4gpu_rocm6.0-6.1.0.txt": "text table, not JSON",
    "rocm-smi_plain-showmeminfo-vram_apu-4gb-1gpu_rocm5.x_WHITESPACE-ALTERED.txt": "text table, not JSON",  # noqa: E501
    "rocm-smi_plain-showproductname_rx7900xtx-2gpu+raphael-igpu_rocm6.1+_PARTIAL.txt": "text table, not JSON",  # noqa: E501
    "rocm-smi_plain_ERROR-driver-not-initialized_vm-no-amdgpu_rocm5.2.3.txt": "amdgpu driver is not loaded",  # noqa: E501
    "rocm-smi_plain_ERROR-no-amd-gpus-specified_vm-no-gpu_rocm5.0.txt": "WARNING: No AMD GPUs specified",  # noqa: E501
    "rocm-smi_showdriverversion_csv_mi100-2gpu_rocm5.x.csv": (0, N, N, N, N, N),
    "rocm-smi_showmemuse_rx6800-2gpu_rocm5.x.json": (2, "AMD GPU", N, N, N, N),
    "rocm-smi_showproductname-showdriverversion-showid_mi300a-4gpu_rocm7.x.json": (
        4,
        "AMD Instinct MI300A",
        N,
        N,
        N,
        N,
    ),
    "rocm-smi_showproductname-showuse-showmeminfo-vram_csv_rx7900xt-1gpu_rocm6.1+.csv": (
        1,
        "Radeon RX 7900 XT",
        20464,
        20437,
        N,
        N,
    ),
    "rocm-smi_showproductname-showuse-showmeminfo-vram_rx7900xt-1gpu_rocm6.1+.json": (
        1,
        "Radeon RX 7900 XT",
        20464,
        20437,
        N,
        N,
    ),
    "rocm-smi_showproductname_csv_mi100-2gpu_rocm5.x.csv": (
        2,
        "Arcturus GL-XL [AMD Instinct MI100]",
        N,
        N,
        N,
        N,
    ),
    "rocm-smi_showproductname_mi250x-hpe-1gcd_rocm6.1+_PARTIAL.json": (
        1,
        "AMD INSTINCT MI200 (MCM) OAM LC MBA HPE C2",
        N,
        N,
        N,
        N,
    ),
    "rocm-smi_showrasinfo_json_ERROR-no-json-data_mi300a_rocm6.x.txt": "no JSON (WARNING: No JSON data to report)",  # noqa: E501
    "rocm-smi_showuniqueid-showproductname-showbus_mi100-4gpu_rocm4.x_REFORMATTED.json": (
        4,
        "AMD GPU 0x738c",
        N,
        N,
        "0x7ef570db1b346018",
        "0000:63:00.0",
    ),
    "rocm-smi_telegraf-flags_mi100-4gpu_rocm6.0.2.json": (
        4,
        "Arcturus GL-XL [Instinct MI100]",
        32752,
        32745,
        "0x79ccd55167a2124a",
        "0000:83:00.0",
    ),
    "rocm-smi_telegraf-flags_mi100-6gpu_rocm5.7.1.json": (
        6,
        "Arcturus GL-XL [Instinct MI100]",
        32752,
        32745,
        N,
        "0000:1E:00.0",
    ),
    "rocm-smi_telegraf-flags_mi50-32gb-card0-of-8_rocm4.x.json": (
        1,
        "Radeon Instinct MI50 32GB",
        32752,
        32741,
        "0x2f048617326b1ea",
        "0000:63:00.0",
    ),
    "rocm-smi_telegraf-flags_rx6700xt-1gpu_rocm4.3.0.json": (
        1,
        "AMD GPU 0x73df",
        12272,
        10724,
        N,
        "0000:07:00.0",
    ),
    "rocm-smi_telegraf-flags_rx6700xt-1gpu_rocm5.7.1.json": (
        1,
        "Navi 22 [Radeon RX 6700/6700 XT / 6800M]",
        12272,
        10779,
        N,
        "0000:07:00.0",
    ),
    "rocm-smi_telegraf-flags_rx6700xt-1gpu_rocm6.0.2.json": (
        1,
        "Navi 22 [Radeon RX 6700/6700 XT / 6800M]",
        12272,
        10772,
        N,
        "0000:07:00.0",
    ),
    "rocm-smi_telegraf-flags_rx6700xt-1gpu_rocm6.1.2.json": (
        1,
        "Navi 22 [Radeon RX 6700/6700 XT / 6800M]",
        12272,
        10772,
        N,
        "0000:07:00.0",
    ),
    "rocm-smi_telegraf-flags_vega10-xt-1gpu_rocm4.x.json": (
        1,
        "AMD GPU 0x6861",
        16368,
        16351,
        "0x2150e7d042a1124",
        "0000:04:00.0",
    ),
}


def _fixture_files() -> list[str]:
    if not FIXTURES.is_dir():
        return []
    return sorted(p.name for p in FIXTURES.iterdir() if p.name not in ("README.md", "SHA256SUMS"))


def _platform(name: str) -> str:
    return "cuda" if name.startswith("nvidia-smi") else "rocm"


def test_every_fixture_has_an_expectation() -> None:
    missing = [n for n in _fixture_files() if n not in EXPECTED]
    assert not missing, f"fixtures without an expected result: {missing}"


@pytest.mark.parametrize("name", _fixture_files())
def test_fixture_through_fake_tool_on_path(name: str, tmp_path: Path) -> None:
    platform = _platform(name)
    tool = "nvidia-smi" if platform == "cuda" else "rocm-smi"
    fake_tool(tmp_path, tool, FIXTURES / name)
    expected = EXPECTED[name]
    if isinstance(expected, str) or expected[0] == 0:
        with pytest.raises(PlacementError) as exc:
            query_gpus(platform, env=env_with(tmp_path))
        wanted = expected if isinstance(expected, str) else "found no GPUs"
        assert wanted in exc.value.message
        return
    gpus = query_gpus(platform, env=env_with(tmp_path))
    count, gpu_name, total, free, uid, bus = expected
    assert len(gpus) == count
    assert [g.index for g in gpus] == list(range(count))
    first = gpus[0]
    assert first.platform == platform
    assert first.name == gpu_name
    assert (first.vram_total // MIB if first.vram_total else None) == total
    assert (first.vram_free // MIB if first.vram_free is not None else None) == free
    assert first.unique_id == uid
    assert first.pci_bus == bus
    args = (tmp_path / f"{tool}.args").read_text().split()
    assert args == (ROCM_SMI_ARGS if platform == "rocm" else NVIDIA_SMI_ARGS)


@pytest.mark.parametrize("name", [n for n in _fixture_files() if "ERROR" in n])
def test_error_fixture_with_nonzero_exit_is_a_clear_error(name: str, tmp_path: Path) -> None:
    platform = _platform(name)
    fake_tool(tmp_path, "nvidia-smi" if platform == "cuda" else "rocm-smi", FIXTURES / name, rc=9)
    with pytest.raises(PlacementError) as exc:
        query_gpus(platform, env=env_with(tmp_path))
    msg = exc.value.message
    assert "exited with status 9" in msg or "driver" in msg
    last = [ln for ln in (FIXTURES / name).read_text().splitlines() if ln.strip()][-1].strip()
    assert last[:60] in msg


def test_missing_tool_names_it_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(PlacementError) as exc:
        query_gpus("rocm", env={"PATH": str(tmp_path)})
    assert "rocm-smi not found on PATH" in exc.value.message
    assert "--platform cpu" in exc.value.message


def test_garbled_output(tmp_path: Path) -> None:
    garbled = tmp_path / "garbled.txt"
    garbled.write_text('{"card0": {"Card Series": "MI100", ')
    fake_tool(tmp_path, "rocm-smi", garbled)
    with pytest.raises(PlacementError, match="garbled JSON"):
        query_gpus("rocm", env=env_with(tmp_path))


def test_multi_gpu_rocm_indices_and_memory() -> None:
    gpus = parse_tool_output(
        "rocm", (FIXTURES / "rocm-smi_telegraf-flags_mi100-6gpu_rocm5.7.1.json").read_text()
    )
    assert [g.index for g in gpus] == [0, 1, 2, 3, 4, 5]
    assert all(g.vram_total == 34342961152 for g in gpus)
    assert len({g.pci_bus for g in gpus}) == 6


def test_reformatted_card_order_is_sorted_by_card_index() -> None:
    name = "rocm-smi_showuniqueid-showproductname-showbus_mi100-4gpu_rocm4.x_REFORMATTED.json"
    gpus = parse_tool_output("rocm", (FIXTURES / name).read_text())
    assert [(g.index, g.pci_bus) for g in gpus] == [
        (0, "0000:63:00.0"),
        (1, "0000:43:00.0"),
        (2, "0000:26:00.0"),
        (3, "0000:03:00.0"),
    ]


def test_noheader_nounits_csv_with_its_own_field_list() -> None:
    fields = [
        "fan.speed",
        "memory.total",
        "memory.used",
        "memory.free",
        "pstate",
        "temperature.gpu",
        "name",
        "uuid",
        "compute_mode",
        "utilization.gpu",
        "utilization.memory",
        "index",
    ]
    name = (
        "nvidia-smi_query-gpu-12fields_csv-noheader-nounits_gtx1070ti-1gpu_PARTIAL-single-line.csv"
    )
    (gpu,) = parse_nvidia_csv((FIXTURES / name).read_text(), fields)
    assert (gpu.index, gpu.name, gpu.vram_total, gpu.vram_free, gpu.use_percent) == (
        1,
        "GeForce GTX 1070 Ti",
        8114 * MIB,
        7561 * MIB,
        100.0,
    )
    p4 = "nvidia-smi_query-gpu-12fields_csv-noheader-nounits_tesla-p4-1gpu_PARTIAL-single-line.csv"
    (gpu,) = parse_nvidia_csv((FIXTURES / p4).read_text(), fields)
    assert (gpu.name, gpu.unique_id, gpu.vram_used) == ("Tesla P4", "GPU-xxx", 0)


def test_multi_gpu_nvidia_csv_in_our_query_format() -> None:
    text = (
        "0, NVIDIA H100 80GB HBM3, GPU-a, 00000000:19:00.0, 81559, 59, 81022, 0\n"
        "1, NVIDIA H100 80GB HBM3, GPU-b, 00000000:3B:00.0, 81559, 80000, 1021, [N/A]\n"
    )
    gpus = parse_nvidia_csv(text)
    assert [(g.index, g.vram_free // MIB, g.use_percent) for g in gpus] == [
        (0, 81022, 0.0),
        (1, 1021, None),
    ]
