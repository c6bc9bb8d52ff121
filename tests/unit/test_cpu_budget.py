"""CPU budget (affinity, cgroup v2/v1 quota, machine count), thread defaults and the
VLLM_SRUN_CPU_THREADS override, with patched affinity and fake cgroup trees."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from vllm_sr.errors import ConfigError
from vllm_sr.placement import cpu
from vllm_sr.placement.cpu import (
    CpuBudget,
    assign_cpu_sets,
    cgroup_quota_cpus,
    deployment_threads,
    measure_cpu_budget,
    threads_per_worker,
)


def _v2(tmp_path: Path, rel: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for path, text in files.items():
        f = root / path / "cpu.max"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(f"0::{rel}\n")
    return root, proc


def _v1(tmp_path: Path, rel: str, quota: str, period: str, mount: str = "cpu,cpuacct"):
    root = tmp_path / "cgroup"
    d = root / mount / rel.strip("/")
    d.mkdir(parents=True)
    (d / "cpu.cfs_quota_us").write_text(quota + "\n")
    (d / "cpu.cfs_period_us").write_text(period + "\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(f"12:memory:{rel}\n4:cpu,cpuacct:{rel}\n1:name=systemd:{rel}\n")
    return root, proc


def test_v2_quota_rounds_down(tmp_path: Path) -> None:
    root, proc = _v2(
        tmp_path, "/svc.slice/vllm.service", {"svc.slice/vllm.service": "250000 100000"}
    )
    assert cgroup_quota_cpus(root, proc) == 2


def test_v2_max_means_no_quota(tmp_path: Path) -> None:
    root, proc = _v2(tmp_path, "/a", {"a": "max 100000"})
    assert cgroup_quota_cpus(root, proc) is None


def test_v2_parent_quota_applies(tmp_path: Path) -> None:
    root, proc = _v2(tmp_path, "/a/b", {"a": "300000 100000", "a/b": "max 100000"})
    assert cgroup_quota_cpus(root, proc) == 3


def test_v2_quota_below_one_cpu_is_one(tmp_path: Path) -> None:
    root, proc = _v2(tmp_path, "/a", {"a": "50000 100000"})
    assert cgroup_quota_cpus(root, proc) == 1


def test_v1_quota(tmp_path: Path) -> None:
    root, proc = _v1(tmp_path, "/docker/abc", "350000", "100000")
    assert cgroup_quota_cpus(root, proc) == 3


def test_v1_unlimited(tmp_path: Path) -> None:
    root, proc = _v1(tmp_path, "/docker/abc", "-1", "100000")
    assert cgroup_quota_cpus(root, proc) is None


def test_v1_plain_cpu_mount(tmp_path: Path) -> None:
    root, proc = _v1(tmp_path, "/x", "200000", "100000", mount="cpu")
    assert cgroup_quota_cpus(root, proc) == 2


def test_no_cgroup_files(tmp_path: Path) -> None:
    assert cgroup_quota_cpus(tmp_path / "none", tmp_path / "none-proc") is None


def test_budget_is_smallest_of_affinity_quota_machine(tmp_path: Path) -> None:
    root, proc = _v2(tmp_path, "/a", {"a": "400000 100000"})
    kw = {"cgroup_root": root, "proc_cgroup": proc}
    assert measure_cpu_budget(affinity=range(8), machine_cpus=16, **kw).cpus == 4
    assert measure_cpu_budget(affinity=[2, 3], machine_cpus=16, **kw).cpus == 2
    b = measure_cpu_budget(affinity=range(8), machine_cpus=3, **kw)
    assert b.cpus == 3 and b.quota_cpus == 4 and "cgroup quota 4" in b.describe()


def test_budget_uses_psutil_affinity(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    class FakeProcess:
        def cpu_affinity(self) -> list[int]:
            return [5, 1, 3]

    monkeypatch.setattr(cpu.psutil, "Process", FakeProcess)
    b = measure_cpu_budget(
        cgroup_root=tmp_path / "none", proc_cgroup=tmp_path / "none", machine_cpus=8
    )
    assert b.affinity == (1, 3, 5) and b.cpus == 3


def test_real_host_budget_is_within_machine() -> None:
    b = measure_cpu_budget()
    assert 1 <= b.cpus <= (psutil.cpu_count() or 1)


def _budget(n: int) -> CpuBudget:
    return CpuBudget(cpus=n, affinity=tuple(range(n)), machine_cpus=n)


# "Each managed CPU worker defaults to half the Router's available CPU budget, rounded down,
# with at least one thread and at most 16."
@pytest.mark.parametrize(
    ("cpus", "threads"), [(1, 1), (2, 1), (3, 1), (8, 4), (9, 4), (32, 16), (64, 16)]
)
def test_default_threads(cpus: int, threads: int) -> None:
    assert threads_per_worker(_budget(cpus), {})[0] == threads


# "set a positive integer before starting the stack" / "capped by the available CPU budget"
@pytest.mark.parametrize(
    ("value", "cpus", "threads"),
    [("8", 16, 8), ("8", 4, 4), ("1", 64, 1), (" 3 ", 8, 3), ("40", 64, 40)],
)
def test_env_override_capped(value: str, cpus: int, threads: int) -> None:
    n, why = threads_per_worker(_budget(cpus), {"VLLM_SRUN_CPU_THREADS": value})
    assert n == threads
    assert "VLLM_SRUN_CPU_THREADS" in why


@pytest.mark.parametrize("value", ["0", "-2", "auto", "1.5", "8x"])
def test_env_override_rejects_non_positive_integers(value: str) -> None:
    with pytest.raises(ConfigError) as exc:
        threads_per_worker(_budget(8), {"VLLM_SRUN_CPU_THREADS": value})
    assert f"VLLM_SRUN_CPU_THREADS={value!r}" in str(exc.value)
    assert "positive integer" in str(exc.value)


def test_disjoint_sets_when_budget_allows() -> None:
    sets, note = assign_cpu_sets(_budget(8), workers=2, threads=4)
    assert sets == [[0, 1, 2, 3], [4, 5, 6, 7]] and note is None


def test_sets_follow_affinity_not_cpu_numbers() -> None:
    b = CpuBudget(cpus=4, affinity=(2, 3, 6, 7), machine_cpus=8)
    assert assign_cpu_sets(b, 2, 2)[0] == [[2, 3], [6, 7]]


def test_share_when_budget_does_not_allow() -> None:
    sets, note = assign_cpu_sets(_budget(4), workers=3, threads=2)
    assert sets == [None, None, None]
    assert note is not None and "share" in note and "4-CPU budget" in note


def test_cpu_sets_of_different_sizes_per_worker() -> None:
    """Deployments with their own threads: each worker gets a disjoint set of its own size."""
    sets, note = assign_cpu_sets(_budget(8), workers=3, threads=[3, 3, 2])
    assert (sets, note) == ([[0, 1, 2], [3, 4, 5], [6, 7]], None)
    sets, note = assign_cpu_sets(_budget(8), workers=2, threads=[6, 4])
    assert sets == [None, None]
    assert note is not None and "2 CPU worker(s) with 10 thread(s) in all exceed" in note


def test_deployment_threads_precedence_and_cap() -> None:
    b = _budget(8)
    env = {"VLLM_SRUN_CPU_THREADS": "3"}
    assert deployment_threads(b, None, 3, env) == (3, None)
    assert deployment_threads(b, 2, 3, env) == (
        2,
        "2 thread(s) per CPU worker from its threads setting, over VLLM_SRUN_CPU_THREADS=3",
    )
    assert deployment_threads(b, 12, 4, {}) == (8, "threads 12 capped at the 8-CPU budget")
