"""The Router's CPU budget and the thread count of each managed CPU worker.

Budget = the smallest of: the CPUs this process may run on (affinity), the cgroup CPU quota
(v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, rounded down, at least 1)
and the machine's CPU count. Containers commonly limit by quota while affinity still shows
every host CPU, so affinity alone would oversubscribe.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from vllm_sr.errors import ConfigError

THREADS_ENV = "VLLM_SRUN_CPU_THREADS"
MAX_DEFAULT_THREADS = 16


@dataclass(frozen=True)
class CpuBudget:
    """How many CPUs the Router may use, and which."""

    cpus: int
    affinity: tuple[int, ...]
    quota_cpus: int | None = None
    machine_cpus: int = 1
    limits: tuple[str, ...] = field(default_factory=tuple)

    def describe(self) -> str:
        parts = [f"affinity {len(self.affinity)}"]
        if self.quota_cpus is not None:
            parts.append(f"cgroup quota {self.quota_cpus}")
        parts.append(f"machine {self.machine_cpus}")
        return f"CPU budget {self.cpus} (smallest of {', '.join(parts)})"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _quota(quota: int, period: int) -> int | None:
    if quota <= 0 or period <= 0:
        return None
    return max(1, quota // period)


def _cgroup_paths(proc_cgroup: Path) -> tuple[str | None, dict[str, str]]:
    """(v2 path, {v1 controller: path}) of this process from /proc/self/cgroup."""
    v2: str | None = None
    v1: dict[str, str] = {}
    for line in (_read(proc_cgroup) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            v2 = path
        for c in controllers.split(","):
            if c:
                v1[c] = path
    return v2, v1


def _ancestors(root: Path, rel: str) -> list[Path]:
    """root/rel and each parent up to root: a limit on any ancestor applies too."""
    parts = [p for p in rel.strip("/").split("/") if p]
    return [root.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def cgroup_quota_cpus(
    cgroup_root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")
) -> int | None:
    """The tightest CPU quota over this process's cgroup and its ancestors, in whole CPUs."""
    v2, v1 = _cgroup_paths(proc_cgroup)
    found: list[int] = []
    if v2 is not None:
        for d in _ancestors(cgroup_root, v2):
            text = _read(d / "cpu.max")
            if text:
                q, _, p = text.partition(" ")
                if q != "max" and q.isdigit() and p.strip().isdigit():
                    n = _quota(int(q), int(p))
                    if n is not None:
                        found.append(n)
    if "cpu" in v1:
        for mount in ("cpu,cpuacct", "cpu", "cpuacct,cpu"):
            base = cgroup_root / mount
            if not base.is_dir():
                continue
            for d in _ancestors(base, v1["cpu"]):
                qt, pt = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
                if qt and pt and qt.lstrip("-").isdigit() and pt.isdigit():
                    n = _quota(int(qt), int(pt))
                    if n is not None:
                        found.append(n)
            break
    return min(found) if found else None


def current_affinity() -> tuple[int, ...]:
    try:
        return tuple(sorted(psutil.Process().cpu_affinity() or []))
    except (AttributeError, psutil.Error, OSError):
        return tuple(sorted(os.sched_getaffinity(0)))


def measure_cpu_budget(
    *,
    affinity: Sequence[int] | None = None,
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    machine_cpus: int | None = None,
) -> CpuBudget:
    aff = tuple(sorted(affinity)) if affinity is not None else current_affinity()
    machine = machine_cpus or psutil.cpu_count(logical=True) or os.cpu_count() or 1
    quota = cgroup_quota_cpus(cgroup_root, proc_cgroup)
    candidates = [len(aff) or machine, machine] + ([quota] if quota is not None else [])
    return CpuBudget(
        cpus=max(1, min(candidates)),
        affinity=aff or tuple(range(machine)),
        quota_cpus=quota,
        machine_cpus=machine,
    )


def threads_per_worker(budget: CpuBudget, env: Mapping[str, str]) -> tuple[int, str]:
    """(threads, why). Default: half the budget rounded down, at least 1, at most 16.
    VLLM_SRUN_CPU_THREADS (a positive integer) overrides it, capped at the budget."""
    raw = env.get(THREADS_ENV)
    if raw is None or raw.strip() == "":
        n = max(1, min(MAX_DEFAULT_THREADS, budget.cpus // 2))
        return n, f"{n} thread(s) per CPU worker (half of the {budget.cpus}-CPU budget, 1..16)"
    text = raw.strip()
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(
            f"{THREADS_ENV}={raw!r} is not accepted; accepted: a positive integer such as 4, "
            f"or unset it for the default (half the CPU budget)"
        )
    asked = int(text)
    if asked > budget.cpus:
        return budget.cpus, (f"{THREADS_ENV}={asked} capped at the {budget.cpus}-CPU budget")
    return asked, f"{asked} thread(s) per CPU worker from {THREADS_ENV}"


def deployment_threads(
    budget: CpuBudget, configured: int | None, default: int, env: Mapping[str, str]
) -> tuple[int, str | None]:
    """One deployment's threads per CPU worker and, when its ``threads`` setting decides, why.
    The setting wins over VLLM_SRUN_CPU_THREADS (it is the more specific of the two) and is
    capped at the budget like the variable."""
    if configured is None:
        return default, None
    over = f", over {THREADS_ENV}={env[THREADS_ENV].strip()}" if env.get(THREADS_ENV) else ""
    if configured > budget.cpus:
        return budget.cpus, f"threads {configured} capped at the {budget.cpus}-CPU budget{over}"
    return configured, f"{configured} thread(s) per CPU worker from its threads setting{over}"


def assign_cpu_sets(
    budget: CpuBudget, workers: int, threads: int | Sequence[int]
) -> tuple[list[list[int] | None], str | None]:
    """Disjoint CPU sets, one per CPU worker (``threads`` each: one count, or one per worker),
    when they fit the budget; else no pinning and a note saying the workers share its CPUs."""
    if workers == 0:
        return [], None
    counts = [threads] * workers if isinstance(threads, int) else list(threads)
    pool = list(budget.affinity)[: budget.cpus]
    if sum(counts) <= len(pool):
        starts = [sum(counts[:i]) for i in range(workers)]
        return [pool[a : a + n] for a, n in zip(starts, counts, strict=True)], None
    uniform = len(set(counts)) == 1
    shape = (
        f"{workers} CPU worker(s) x {counts[0]} thread(s)"
        if uniform
        else (f"{workers} CPU worker(s) with {sum(counts)} thread(s) in all")
    )
    note = (
        f"{shape} exceed the {budget.cpus}-CPU budget: they share CPUs (not pinned); set "
        "VLLM_SRUN_CPU_THREADS (or a deployment's threads) lower to give each its own"
    )
    return [None] * workers, note
