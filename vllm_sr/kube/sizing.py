"""A pod's resources from the canonical placement: GPU limits from the allocation ordinals, CPU
from the CPU budget rules of ``vllm_sr/placement/cpu.py``.

GPU: ``amd.com/gpu`` / ``nvidia.com/gpu`` = the number of distinct ordinals of the pod's one GPU
platform (``vllm_sr.placement.allocation.device_ordinals``: ordinals are dense from 0).
Refused (PlacementError, naming the replica): a reference that cannot be an ordinal (a host
ID) and two GPU platforms in one pod.

CPU: the pod's CPU budget is its cgroup quota, i.e. its CPU limit, so request = limit = one CPU
for the service (frontend, supervisor, tokenizing requests) + ``threads`` per CPU worker + one
per GPU worker (its HTTP loop and tokenizer). The pod's environment sets
``VLLM_SRUN_CPU_THREADS`` so each CPU worker gets exactly ``threads`` whatever the rounding of
the quota, and the budget then fits every CPU worker's threads on its own CPUs (pinned, not
shared), which the budget rules check here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vllm_sr.config.schema import RootConfig, device_platform
from vllm_sr.errors import PlacementError, UsageError
from vllm_sr.placement.allocation import device_ordinals
from vllm_sr.placement.cpu import THREADS_ENV, CpuBudget, assign_cpu_sets, threads_per_worker

GPU_RESOURCE = {"rocm": "amd.com/gpu", "cuda": "nvidia.com/gpu"}
SERVICE_CPUS = 1
GPU_WORKER_CPUS = 1
MAX_THREADS = 64


@dataclass(frozen=True)
class PodSizing:
    gpu_platform: str | None
    gpus: int
    cpu_workers: int
    gpu_workers: int
    attached: int
    threads: int
    cpus: int
    budget_note: str

    @property
    def platform(self) -> str:
        """The image flavour this pod needs: rocm, cuda or cpu."""
        return self.gpu_platform or "cpu"

    def limits(self) -> dict[str, str]:
        out = {"cpu": str(self.cpus)}
        if self.gpu_platform is not None and self.gpus:
            out[GPU_RESOURCE[self.gpu_platform]] = str(self.gpus)
        return out

    def env(self) -> dict[str, str]:
        return {THREADS_ENV: str(self.threads)} if self.cpu_workers else {}


_REF = re.compile(r"^(?P<dep>.+)\.replicas\[(?P<idx>\d+)\]\.device=(?P<dev>\S+)$")


def _replica_of(ref: str) -> tuple[str, str]:
    """``primary.replicas[1].device=rocm:3`` -> (``primary-1``, ``rocm:3``)."""
    m = _REF.match(ref)
    return (f"{m['dep']}-{m['idx']}", m["dev"]) if m else (ref, ref)


def _first_per_platform(config: RootConfig) -> list[tuple[str, str]]:
    """(replica, device) of the first GPU replica of each platform, in config order."""
    seen: dict[str, tuple[str, str]] = {}
    for name, dep in config.deployments.items():
        for i, r in enumerate(dep.effective_replicas()):
            if r.device is not None and r.device != "cpu":
                seen.setdefault(device_platform(r.device), (f"{name}-{i}", r.device))
    return list(seen.values())


def _refuse_auto(config: RootConfig) -> None:
    """``device: auto`` chooses when the service starts; a pod's GPU request is fixed when it is
    rendered, so there is nothing auto could choose from."""
    autos = [
        f"{name}-{i}"
        for name, dep in config.deployments.items()
        for i, r in enumerate(dep.effective_replicas())
        if r.device == "auto"
    ]
    if autos:
        raise PlacementError(
            f"replica {autos[0]}: device 'auto' cannot be rendered: a pod's GPU request is "
            "fixed in its manifest, so auto would have nothing to choose from; accepted: cpu, "
            "rocm:N or cuda:N (ordinals into the GPUs Kubernetes gives the pod)",
            replicas=autos,
        )


def _refuse_host_ids(config: RootConfig) -> dict[str, tuple[int, ...]]:
    ords = device_ordinals(config)
    if ords.not_ordinals:
        lines = []
        for ref in ords.not_ordinals:
            replica, dev = _replica_of(ref)
            platform = device_platform(dev)
            used = ", ".join(map(str, ords.ordinals.get(platform, ())))
            lines.append(
                f"replica {replica}: device {dev} cannot be an allocation ordinal (a pod given "
                f"k {platform} GPUs has ordinals 0..k-1; this config uses {used})"
            )
        raise PlacementError(
            "; ".join(lines) + "; the config names host GPU IDs, which mean nothing inside a "
            "pod; accepted: ordinals 0..k-1 into the GPUs Kubernetes gives the pod (e.g. "
            "replicas: [{device: rocm:0}, {device: rocm:1}] for two GPUs)",
            replicas=[_replica_of(ref)[0] for ref in ords.not_ordinals],
        )
    firsts = _first_per_platform(config)
    if len(firsts) > 1:
        (first, first_dev), (other, other_dev) = firsts[0], firsts[1]
        raise PlacementError(
            f"replica {other}: device {other_dev} is {device_platform(other_dev)} while "
            f"replica {first} is {device_platform(first_dev)} ({first_dev}); one pod runs one "
            "GPU platform (one image, one device plugin); accepted: render each platform's "
            "deployments from their own config",
            replica=other,
        )
    return dict(ords.ordinals)


def size_pod(config: RootConfig, threads: int) -> PodSizing:
    """The pod's GPUs and CPUs for ``config``; ``threads`` per CPU worker."""
    if not 1 <= threads <= MAX_THREADS:
        raise UsageError(f"--cpu-threads {threads}: accepted: 1..{MAX_THREADS}")
    _refuse_auto(config)
    by_platform = _refuse_host_ids(config)
    replicas = [r for dep in config.deployments.values() for r in dep.effective_replicas()]
    cpu_workers = sum(1 for r in replicas if r.device == "cpu")
    gpu_workers = sum(1 for r in replicas if r.device is not None and r.device != "cpu")
    attached = sum(1 for r in replicas if r.endpoint is not None)
    cpus = SERVICE_CPUS + cpu_workers * threads + gpu_workers * GPU_WORKER_CPUS
    budget = CpuBudget(cpus=cpus, affinity=tuple(range(cpus)), quota_cpus=cpus, machine_cpus=cpus)
    got, why = threads_per_worker(budget, {THREADS_ENV: str(threads)})
    _, shared = assign_cpu_sets(budget, cpu_workers, got)
    # Both hold by construction; a change to the budget rules that broke them would silently
    # oversubscribe the pod, so say so instead.
    if cpu_workers and (got != threads or shared is not None):
        raise PlacementError(
            f"the CPU budget rules give {got} thread(s) per CPU worker in a {cpus}-CPU pod, not "
            f"{threads}: {shared or why}"
        )
    platform = next(iter(by_platform), None)
    return PodSizing(
        gpu_platform=platform,
        gpus=len(by_platform.get(platform, ())) if platform else 0,
        cpu_workers=cpu_workers,
        gpu_workers=gpu_workers,
        attached=attached,
        threads=threads,
        cpus=cpus,
        budget_note=f"{budget.describe()}; {why}" if cpu_workers else budget.describe(),
    )
