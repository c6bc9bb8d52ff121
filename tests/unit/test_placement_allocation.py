"""Allocation ordinals: with a visible-devices variable set (a pod, a container, a systemd unit
with DeviceAllow) every rocm:N / cuda:N is an ordinal into it, for flags and config alike. Run
on real tool captures through a fake rocm-smi / nvidia-smi on PATH (the real inventory code)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.gpu_fixtures import FIXTURES, MISSING_REASON, env_with, fake_tool
from vllm_sr.cli import main
from vllm_sr.config.files import load_config, parse_config
from vllm_sr.config.flags import DeploymentFlags
from vllm_sr.errors import PlacementError, UsageError
from vllm_sr.placement.allocation import device_ordinals, locate, read_allocation
from vllm_sr.placement.apply import apply_flags
from vllm_sr.placement.cpu import CpuBudget
from vllm_sr.placement.planner import plan

pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason=MISSING_REASON)

BUDGET = CpuBudget(cpus=4, affinity=(0, 1, 2, 3), machine_cpus=4)
MI100_6 = "rocm-smi_telegraf-flags_mi100-6gpu_rocm5.7.1.json"
MI100_4_UUID = "rocm-smi_showuniqueid-showproductname-showbus_mi100-4gpu_rocm4.x_REFORMATTED.json"
A5000_2 = "nvidia-smi_q-x_rtx-a5000-2gpu_drv590.44.01.xml"
A5000_UUIDS = (
    "GPU-12345678-aaaa-bbbb-cccc-0123456789ab",
    "GPU-12345678-aaaa-bbbb-cccc-0123456789cd",
)
H200_1 = "nvidia-smi_query-gpu-allfields_csv_h200-1gpu_drv590.48.01.csv"


def _config(*devices: str) -> str:
    items = "".join(f"          - device: {d}\n" for d in devices)
    return (
        f"global:\n  model_catalog:\n    deployments:\n      primary:\n        replicas:\n{items}"
    )


def _tool_env(tmp_path: Path, fixture: str, **variables: str) -> dict[str, str]:
    tool = "nvidia-smi" if fixture.startswith("nvidia") else "rocm-smi"
    fake_tool(tmp_path, tool, FIXTURES / fixture)
    env = env_with(tmp_path, **variables)
    for name in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        if name not in variables:
            env.pop(name, None)
    for name in ("NVIDIA_VISIBLE_DEVICES", "KUBERNETES_SERVICE_HOST"):
        if name not in variables:
            env.pop(name, None)
    return env


def _plan(text: str, env: dict[str, str]):  # type: ignore[no-untyped-def]
    return plan(parse_config(text), env=env, cpu_budget=BUDGET).replicas


def test_rocr_3_5_places_ordinals_0_and_1_on_host_gpus_3_and_5(tmp_path: Path) -> None:
    env = _tool_env(tmp_path, MI100_6, ROCR_VISIBLE_DEVICES="3,5")
    specs = _plan(_config("rocm:0", "rocm:1"), env)
    assert [(s.device, s.host_device) for s in specs] == [
        ("rocm:0", "rocm:3"),
        ("rocm:1", "rocm:5"),
    ]
    # each worker is shown exactly its one GPU
    assert [s.env for s in specs] == [
        {"ROCR_VISIBLE_DEVICES": "3", "HIP_VISIBLE_DEVICES": "0"},
        {"ROCR_VISIBLE_DEVICES": "5", "HIP_VISIBLE_DEVICES": "0"},
    ]
    assert [s.to_json()["host_device"] for s in specs] == ["rocm:3", "rocm:5"]


def test_without_an_allocation_n_is_the_host_index(tmp_path: Path) -> None:
    env = _tool_env(tmp_path, MI100_6)
    (spec,) = _plan(_config("rocm:3"), env)
    assert (spec.host_device, spec.env["ROCR_VISIBLE_DEVICES"]) == ("rocm:3", "3")


def test_an_ordinal_past_the_allocation_is_refused_naming_it(tmp_path: Path) -> None:
    """A host ID written under an allocation is just an ordinal out of range."""
    env = _tool_env(tmp_path, MI100_6, ROCR_VISIBLE_DEVICES="3,5")
    with pytest.raises(PlacementError) as exc:
        _plan(_config("rocm:3"), env)
    msg = exc.value.message
    assert "deployment primary: device rocm:3: ordinal 3 is outside the allocation" in msg
    assert "ROCR_VISIBLE_DEVICES=3,5, 2 GPU(s): rocm:0 = host 3, rocm:1 = host 5" in msg
    assert "accepted: rocm:0..rocm:1" in msg


def test_dp_under_an_allocation_writes_ordinals(tmp_path: Path) -> None:
    env = _tool_env(tmp_path, MI100_6, ROCR_VISIBLE_DEVICES="3,5")
    cfg = tmp_path / "config.yaml"
    flags = DeploymentFlags(platform="rocm", data_parallel_size=2)
    result = apply_flags(cfg, flags, dry_run=False, env=env, cpu_budget=BUDGET)
    devices = [r.device for r in load_config(cfg).deployments["primary"].effective_replicas()]
    assert devices == ["rocm:0", "rocm:1"]
    assert [s.host_device for s in result.plan.replicas] == ["rocm:3", "rocm:5"]
    with pytest.raises(PlacementError, match=r"in the allocation \(ROCR_VISIBLE_DEVICES=3,5\)"):
        apply_flags(cfg, DeploymentFlags(data_parallel_size=3), dry_run=False, env=env)


def test_device_ids_under_an_allocation_are_ordinals(tmp_path: Path) -> None:
    env = _tool_env(tmp_path, MI100_6, ROCR_VISIBLE_DEVICES="3,5")
    cfg = tmp_path / "config.yaml"
    flags = DeploymentFlags(platform="rocm", data_parallel_size=2, device_ids=(1,))
    result = apply_flags(cfg, flags, dry_run=False, env=env, cpu_budget=BUDGET)
    assert [s.env["ROCR_VISIBLE_DEVICES"] for s in result.plan.replicas] == ["5", "5"]
    with pytest.raises(UsageError, match="ordinal 5 is outside the allocation"):
        apply_flags(cfg, DeploymentFlags(device_ids=(5,)), dry_run=False, env=env)


def test_hip_indexes_the_view_rocr_left(tmp_path: Path) -> None:
    env = _tool_env(tmp_path, MI100_6, ROCR_VISIBLE_DEVICES="1,3,5", HIP_VISIBLE_DEVICES="2,0")
    specs = _plan(_config("rocm:0", "rocm:1"), env)
    assert [s.host_device for s in specs] == ["rocm:5", "rocm:1"]
    alloc = read_allocation(env, "rocm")
    assert alloc is not None and alloc.source == (
        "HIP_VISIBLE_DEVICES=2,0 over ROCR_VISIBLE_DEVICES=1,3,5"
    )


def test_rocm_uuid_entry_resolves_through_the_tools_unique_id(tmp_path: Path) -> None:
    env = _tool_env(tmp_path, MI100_4_UUID, ROCR_VISIBLE_DEVICES="GPU-a8a0e90b7ea1c0ad")
    (spec,) = _plan(_config("rocm:0"), env)
    assert spec.host_device == "rocm:2"
    assert spec.env["ROCR_VISIBLE_DEVICES"] == "GPU-a8a0e90b7ea1c0ad"


def test_cuda_visible_devices_and_nvidia_uuid(tmp_path: Path) -> None:
    env = _tool_env(tmp_path, A5000_2, CUDA_VISIBLE_DEVICES="1")
    (spec,) = _plan(_config("cuda:0"), env)
    assert (spec.host_device, spec.env["CUDA_VISIBLE_DEVICES"]) == ("cuda:1", "1")
    env = _tool_env(tmp_path, A5000_2, NVIDIA_VISIBLE_DEVICES=A5000_UUIDS[1])
    (spec,) = _plan(_config("cuda:0"), env)
    assert spec.host_device == "cuda:1"
    assert spec.env == {"CUDA_VISIBLE_DEVICES": A5000_UUIDS[1], "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_cuda_visible_devices_wins_over_the_runtime_variable(tmp_path: Path) -> None:
    env = _tool_env(tmp_path, A5000_2, CUDA_VISIBLE_DEVICES="0", NVIDIA_VISIBLE_DEVICES="1")
    (spec,) = _plan(_config("cuda:0"), env)
    assert spec.host_device == "cuda:0"


def test_container_that_renumbered_its_gpus(tmp_path: Path) -> None:
    """NVIDIA_VISIBLE_DEVICES=5,3 names host GPUs, but inside the container nvidia-smi lists
    only the two it was given, as 0 and 1 in bus order: host 3 is listed 0, host 5 listed 1.
    The worker gets the UUID, which means the same GPU inside and outside."""
    env = _tool_env(tmp_path, A5000_2, NVIDIA_VISIBLE_DEVICES="5,3")
    specs = _plan(_config("cuda:0", "cuda:1"), env)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs] == [A5000_UUIDS[1], A5000_UUIDS[0]]


@pytest.mark.parametrize("value", ["all", "ALL"])
def test_all_is_no_restriction(tmp_path: Path, value: str) -> None:
    env = _tool_env(tmp_path, A5000_2, NVIDIA_VISIBLE_DEVICES=value)
    assert read_allocation(env, "cuda") is None
    (spec,) = _plan(_config("cuda:1"), env)
    assert spec.host_device == "cuda:1"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("NVIDIA_VISIBLE_DEVICES", "none"),
        ("NVIDIA_VISIBLE_DEVICES", "void"),
        ("CUDA_VISIBLE_DEVICES", ""),
    ],
)
def test_none_gives_no_gpu(tmp_path: Path, name: str, value: str) -> None:
    env = _tool_env(tmp_path, A5000_2, **{name: value})
    with pytest.raises(
        PlacementError, match="gives this process no cuda GPU; accepted: --platform cpu"
    ):
        _plan(_config("cuda:0"), env)


@pytest.mark.parametrize(
    ("value", "wanted"),
    [
        (
            "MIG-4b3e5b7c-9b1f-5d0a-8c3e-2f1a6b7c8d9e",
            "is a MIG instance; vllm-sr places whole GPUs",
        ),
        ("0,gpu1", "entry 'gpu1' is not accepted; accepted: comma-separated device indices"),
        ("1,1", "1 listed twice"),
    ],
)
def test_malformed_allocations_are_refused_clearly(value: str, wanted: str) -> None:
    with pytest.raises(PlacementError, match=wanted):
        read_allocation({"CUDA_VISIBLE_DEVICES": value}, "cuda")


def test_uuid_that_matches_no_listed_gpu(tmp_path: Path) -> None:
    env = _tool_env(tmp_path, A5000_2, NVIDIA_VISIBLE_DEVICES="GPU-deadbeef")
    with pytest.raises(
        PlacementError, match="entry GPU-deadbeef matches none of the GPUs nvidia-smi"
    ):
        _plan(_config("cuda:0"), env)


def test_a_pod_without_a_variable_indexes_what_the_tool_lists(tmp_path: Path) -> None:
    env = _tool_env(tmp_path, H200_1, KUBERNETES_SERVICE_HOST="10.96.0.1")
    (spec,) = _plan(_config("cuda:0"), env)
    assert spec.host_device == "cuda:0"
    with pytest.raises(PlacementError, match="the GPUs nvidia-smi lists in this Kubernetes pod"):
        _plan(_config("cuda:1"), env)


def test_locate_without_an_inventory_uses_the_entries() -> None:
    where = locate("rocm:1", {"ROCR_VISIBLE_DEVICES": "3,5"})
    assert (where.ordinal, where.entry, where.host_device) == (1, "5", "rocm:5")


# The Kubernetes renderer's question ---------------------------------------------------------


def test_device_ordinals_per_platform() -> None:
    text = _config("rocm:0", "rocm:1", "rocm:1")
    found = device_ordinals(parse_config(text))
    assert found.ordinals == {"rocm": (0, 1)}
    assert found.gpus_needed == {"rocm": 2}
    assert found.all_ordinals and found.not_ordinals == ()


def test_device_ordinals_flags_host_ids() -> None:
    """rocm:3 with no rocm:1..2 cannot be an ordinal of a dense allocation."""
    found = device_ordinals(parse_config(_config("rocm:0", "rocm:3")))
    assert found.ordinals == {"rocm": (0, 3)}
    assert not found.all_ordinals
    assert found.not_ordinals == ("primary.replicas[1].device=rocm:3",)
    assert device_ordinals(parse_config(_config("cpu"))).ordinals == {}


# config show ---------------------------------------------------------------------------------


def test_config_show_prints_ordinal_and_host_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = _tool_env(tmp_path, MI100_6, ROCR_VISIBLE_DEVICES="3,5")
    for name in ("HIP_VISIBLE_DEVICES", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
    for name in ("PATH", "ROCR_VISIBLE_DEVICES"):
        monkeypatch.setenv(name, env[name])
    cfg = tmp_path / "config.yaml"
    cfg.write_text(_config("rocm:0", "rocm:1"))
    out = _cli(["config", "show", "--config", str(cfg)], capsys)
    assert "#   primary-1: rocm:1 = ordinal 1 of ROCR_VISIBLE_DEVICES=3,5 = host rocm:5" in out
    parse_config(out)  # still loadable config
    rows = json.loads(_cli(["config", "show", "--config", str(cfg), "--json"], capsys))["devices"]
    assert rows[0] == {
        "replica": "primary-0",
        "device": "rocm:0",
        "ordinal": 0,
        "host_device": "rocm:3",
        "allocation": "ROCR_VISIBLE_DEVICES=3,5",
    }


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert not exc.value.code
    return capsys.readouterr().out
