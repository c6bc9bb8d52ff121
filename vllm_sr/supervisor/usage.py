"""What each worker process uses as htop shows it: CPU % (of one core) and resident memory,
sampled by the supervisor every few seconds in a thread (psutil reads /proc; never on the event
loop). GPU memory and utilisation come from the inventory tools when a probe is given."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

import psutil

from vllm_sr.jsontypes import JsonObject

GpuProbe = Callable[[str], dict[str, JsonObject]]  # platform -> {host id: usage}


class SampledSpec(Protocol):
    @property
    def device(self) -> str | None: ...

    @property
    def host_device(self) -> str | None: ...


class Sampled(Protocol):
    """What the sampler reads of a worker (``ManagedReplica``)."""

    @property
    def pid(self) -> int | None: ...

    @property
    def spec(self) -> SampledSpec: ...


W = TypeVar("W", bound=Sampled)


class UsageSampler:
    def __init__(self, gpu_probe: GpuProbe | None = None) -> None:
        self._procs: dict[int, psutil.Process] = {}
        self.gpu_probe = gpu_probe

    def sample(self, pids: Iterable[int]) -> dict[int, JsonObject]:
        """{pid: {"cpu_percent", "rss_bytes"}} for the pids still alive. CPU % is over the
        time since this pid's previous sample (the first sample of a pid says 0.0)."""
        wanted = set(pids)
        for gone in set(self._procs) - wanted:
            del self._procs[gone]
        out: dict[int, JsonObject] = {}
        for pid in wanted:
            try:
                proc = self._procs.get(pid)
                if proc is None:
                    proc = self._procs[pid] = psutil.Process(pid)
                with proc.oneshot():
                    cpu = proc.cpu_percent(None)
                    rss = proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                self._procs.pop(pid, None)
                continue
            out[pid] = {"cpu_percent": round(cpu, 1), "rss_bytes": int(rss)}
        return out

    def gpus(self, platforms: Iterable[str]) -> dict[str, JsonObject]:
        """{"rocm:3": {...}} for every GPU of the given platforms; {} without a probe."""
        if self.gpu_probe is None:
            return {}
        out: dict[str, JsonObject] = {}
        for platform in set(platforms):
            try:
                found = self.gpu_probe(platform)
            except Exception:  # a tool that fails now is reported by placement, not here
                continue
            for host_id, usage in found.items():
                out[f"{platform}:{host_id}"] = usage
        return out

    def _take(self, workers: list[W]) -> tuple[dict[int, JsonObject], dict[str, JsonObject]]:
        pids = [w.pid for w in workers if w.pid is not None]
        platforms = {gpu.split(":")[0] for w in workers if (gpu := _gpu_of(w))}
        return self.sample(pids), self.gpus(platforms)

    async def run(
        self,
        workers: Callable[[], list[W]],
        every_s: float,
        report: Callable[[W, JsonObject], None],
    ) -> None:
        """Every ``every_s``: sample in a thread, then hand each worker's usage
        (``{"cpu_percent", "rss_bytes", "gpu"}``) to ``report`` on the loop (the supervisor
        gives it to the worker's pool, the one writer of its record)."""
        while True:
            await asyncio.sleep(every_s)
            current = [w for w in workers() if w.pid is not None]
            procs, gpus = await asyncio.to_thread(self._take, current)
            for w in current:
                usage = procs.get(w.pid) if w.pid is not None else None
                if usage is not None:
                    gpu = _gpu_of(w)
                    report(w, {**usage, "gpu": gpus.get(gpu) if gpu else None})


def _gpu_of(worker: Sampled) -> str | None:
    """The host GPU a worker runs on (``rocm:3``; placement's ``host_device`` when the config
    device is an allocation ordinal), None on CPU."""
    spec = worker.spec
    device = str(spec.device or "cpu")
    if device == "cpu":
        return None
    host: object = spec.host_device  # an int: a bare host index (older plans, tests)
    if isinstance(host, int):
        return f"{device.split(':')[0]}:{host}"
    return str(host) if host else device
