"""Per-worker usage as htop shows it (issue 14 item 9): CPU % and resident memory of real
processes, GPU usage from a probe, handed per worker to a report callback by the sampling loop
(the supervisor's gives it to the worker's pool, the one writer of its record)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from vllm_sr.supervisor.usage import UsageSampler


def test_a_busy_process_shows_cpu_and_memory_and_a_dead_one_drops_out() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "x = bytearray(64 << 20)\nwhile True: pass"])
    try:
        sampler = UsageSampler()
        sampler.sample([busy.pid])
        deadline = time.monotonic() + 20
        usage: dict[str, Any] = {}
        while time.monotonic() < deadline:
            usage = sampler.sample([busy.pid])[busy.pid]
            if usage["cpu_percent"] > 20 and usage["rss_bytes"] > 64 << 20:
                break
            time.sleep(0.2)
        assert usage["cpu_percent"] > 20 and usage["rss_bytes"] > 64 << 20, usage
    finally:
        busy.kill()
        busy.wait()
    assert sampler.sample([busy.pid]) == {}


def test_gpu_usage_comes_from_the_probe_per_platform() -> None:
    calls: list[str] = []

    def probe(platform: str) -> dict[str, dict[str, Any]]:
        calls.append(platform)
        return {"3": {"memory_used_bytes": 1, "memory_total_bytes": 2, "utilization_percent": 5}}

    out = UsageSampler(probe).gpus(["rocm", "rocm"])
    assert calls == ["rocm"] and out["rocm:3"]["utilization_percent"] == 5
    assert UsageSampler().gpus(["rocm"]) == {}


@dataclass
class Spec:
    device: str = "cpu"
    host_device: str | None = None


@dataclass
class Worker:
    pid: int
    spec: Spec = field(default_factory=Spec)
    record: Any = None


@dataclass
class Record:
    usage: Any = None


def to_record(worker: Worker, usage: dict[str, object]) -> None:
    worker.record.usage = usage


def test_the_loop_reports_each_workers_usage() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        worker = Worker(sleeper.pid, record=Record())

        async def main() -> None:
            task = asyncio.ensure_future(UsageSampler().run(lambda: [worker], 0.01, to_record))
            deadline = time.monotonic() + 10
            while worker.record.usage is None and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            task.cancel()

        asyncio.run(main())
        assert worker.record.usage["rss_bytes"] > 0 and worker.record.usage["gpu"] is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_gpu_workers_record_carries_its_cards_usage() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    @dataclass
    class OrdinalSpec:
        device: str = "rocm:0"  # an allocation ordinal ...
        host_device: int = 3  # ... of host GPU 3

    def probe(platform: str) -> dict[str, dict[str, Any]]:
        return {"3": {"memory_used_bytes": 10, "memory_total_bytes": 20, "utilization_percent": 7}}

    try:
        worker = Worker(sleeper.pid, spec=OrdinalSpec(), record=Record())  # type: ignore[arg-type]

        async def main() -> None:
            task = asyncio.ensure_future(UsageSampler(probe).run(lambda: [worker], 0.01, to_record))
            deadline = time.monotonic() + 10
            while worker.record.usage is None and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            task.cancel()

        asyncio.run(main())
        assert worker.record.usage["gpu"]["utilization_percent"] == 7
    finally:
        sleeper.kill()
        sleeper.wait()
