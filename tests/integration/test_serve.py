"""`vllm-sr serve` as a real process, with the stand-in worker (VLLM_SR_WORKER_ARGV) so that
the test is about the service: SIGHUP reload 2 -> 3 -> 1 under steady load, a bad config that
keeps the old generation serving, SIGTERM under load that drains, and no orphan workers when
the supervisor is killed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from tests.integration.test_supervisor_fake import FAKE_MODULE, REPO_ROOT, wait_for
from tests.support.serving import free_port
from tests.support.workers import short_socket_dir
from vllm_sr.control.client import ControlClient
from vllm_sr.placement.apply import apply_scale

pytestmark = pytest.mark.slow


@dataclass
class Served:
    proc: asyncio.subprocess.Process
    url: str
    config: Path
    log: Path
    control: Path

    async def get(self, path: str) -> Any:
        async with aiohttp.ClientSession() as s, s.get(self.url + path) as r:
            return await r.json()

    async def inventory(self) -> dict[str, Any]:
        doc = await self.get("/api/v1/inventory/model-runtime")
        return dict(doc)

    async def pids(self) -> dict[str, int]:
        inv = await self.inventory()
        return {r["id"]: r["pid"] for r in inv["deployments"][0]["replicas"]}

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.asynccontextmanager
async def serve(
    tmp: Path, replicas: int, env: dict[str, str] | None = None
) -> AsyncIterator[Served]:
    port = free_port()
    config = tmp / "config.yaml"
    log = tmp / "serve.log"
    run = short_socket_dir(prefix="vsr-serve-") / "run"
    argv = [
        sys.executable,
        "-m",
        "vllm_sr.cli",
        "serve",
        "fake/artifact",
        "-e",
        "--platform",
        "cpu",
    ]
    argv += ["-dp", str(replicas), "--config", str(config), "--listen", f"127.0.0.1:{port}"]
    argv += ["--runtime-dir", str(run), "--control-socket", str(run / "control.sock")]
    full_env = {
        **os.environ,
        "PYTHONPATH": REPO_ROOT,
        "VLLM_SR_WORKER_ARGV": f"{sys.executable} -m {FAKE_MODULE} worker",
        **(env or {}),
    }
    with open(log, "wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=out, stderr=out, env=full_env, cwd=REPO_ROOT
        )
    served = Served(proc, f"http://127.0.0.1:{port}", config, log, run / "control.sock")
    try:
        await wait_for(
            lambda: "serving on" in served.text() or proc.returncode is not None,
            60,
            "listening",
            served.text,
        )
        assert proc.returncode is None, served.text()
        await wait_for_ready(served, replicas)
        yield served
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
        await proc.wait()


async def wait_for_ready(served: Served, n: int, generation: int | None = None) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError):
            inv = await served.inventory()
            dep = inv["deployments"][0]
            gen_ok = generation is None or inv["service"]["generation"] == generation
            if gen_ok and dep["ready_replicas"] == n and len(dep["replicas"]) == n:
                return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not {n} ready replicas in time:\n{served.text()[-3000:]}")


class Load:
    def __init__(self, url: str, tasks: int = 4) -> None:
        self.url = url
        self.statuses: list[int] = []
        self.stop = asyncio.Event()
        self.tasks = [asyncio.ensure_future(self._run()) for _ in range(tasks)]

    async def _run(self) -> None:
        async with aiohttp.ClientSession() as s:
            while not self.stop.is_set():
                async with s.post(f"{self.url}/v1/embeddings", json={"input": "load"}) as r:
                    await r.read()
                    self.statuses.append(r.status)

    async def finish(self) -> list[int]:
        self.stop.set()
        await asyncio.gather(*self.tasks)
        return self.statuses


async def test_sighup_reload_2_3_1_under_load_and_a_bad_config(tmp_path: Path) -> None:
    async with serve(tmp_path, 2) as served:
        before = await served.pids()
        load = Load(served.url)
        await wait_for(lambda: len(load.statuses) > 20, 20, "load")
        apply_scale(served.config, "primary", 3)
        served.proc.send_signal(signal.SIGHUP)
        await wait_for_ready(served, 3, generation=1)
        grown = await served.pids()
        assert {k: grown[k] for k in before} == before and set(grown) == {*before, "primary-2"}
        mark = len(load.statuses)
        await wait_for(lambda: len(load.statuses) > mark + 20, 20, "load on 3")
        apply_scale(served.config, "primary", 1)
        served.proc.send_signal(signal.SIGHUP)
        await wait_for_ready(served, 1, generation=2)
        assert await served.pids() == {"primary-0": before["primary-0"]}
        # A config that does not parse: the generation keeps serving and the log says why.
        good = served.config.read_text()
        served.config.write_text(good.replace("replicas:", "replicas: [oops", 1))
        served.proc.send_signal(signal.SIGHUP)
        await wait_for(lambda: "reload_failed" in served.text(), 20, "reload_failed logged")
        mark = len(load.statuses)
        await wait_for(lambda: len(load.statuses) > mark + 20, 20, "load after bad reload")
        statuses = await load.finish()
        assert set(statuses) == {200}, [s for s in statuses if s != 200][:5]
        inv = await served.inventory()
        assert inv["service"]["generation"] == 2
        assert not any(psutil.pid_exists(before[k]) for k in ("primary-1",))


async def test_sigterm_under_load_drains_and_leaves_no_worker(tmp_path: Path) -> None:
    env = {"VLLM_SR_FAULT_FORWARD_DELAY_MS": "700"}
    async with serve(tmp_path, 2, env) as served:
        pids = list((await served.pids()).values())
        async with aiohttp.ClientSession() as s:

            async def one() -> int:
                async with s.post(f"{served.url}/v1/embeddings", json={"input": "x"}) as r:
                    return r.status

            calls = [asyncio.ensure_future(one()) for _ in range(10)]
            inflight = 0
            deadline = time.monotonic() + 10
            while inflight < 10 and time.monotonic() < deadline:
                inv = await served.inventory()
                inflight = sum(r["inflight"] for r in inv["deployments"][0]["replicas"])
            assert inflight == 10
            served.proc.send_signal(signal.SIGTERM)
            statuses = await asyncio.gather(*calls)
        code = await asyncio.wait_for(served.proc.wait(), 30)
        assert statuses == [200] * 10 and code == 0
        assert "service_stopping" in served.text()
        assert not [p for p in pids if psutil.pid_exists(p)]


async def test_killed_supervisor_leaves_no_orphans(tmp_path: Path) -> None:
    async with serve(tmp_path, 2) as served:
        pids = list((await served.pids()).values())
        served.proc.send_signal(signal.SIGKILL)
        await served.proc.wait()
        await wait_for(lambda: not [p for p in pids if psutil.pid_exists(p)], 10, "workers gone")


async def test_control_api_drives_the_supervisor(tmp_path: Path) -> None:
    async with serve(tmp_path, 2) as served:
        sock = Path(served.control)
        client = ControlClient(sock)

        def call(method: str, *args: Any) -> dict[str, Any]:
            return dict(getattr(client, method)(*args))

        before = await served.pids()
        out = await asyncio.to_thread(call, "eject", "primary-1", 60_000)
        assert out["ok"] and out["state"] == "ejected"
        out = await asyncio.to_thread(call, "readmit", "primary-1")
        assert out["state"] == "ready"
        out = await asyncio.to_thread(call, "restart", "primary-1")
        assert out["old_pid"] == before["primary-1"] and out["pid"] != before["primary-1"]
        await wait_for_ready(served, 2)
        inv = await served.inventory()
        assert [r["restarts"] for r in inv["deployments"][0]["replicas"]] == [0, 1]
        out = await asyncio.to_thread(call, "drain", "primary-0")
        assert out["ok"]
        inv = await served.inventory()
        assert inv["deployments"][0]["replicas"][0]["state"] == "draining"
        out = await asyncio.to_thread(call, "scale", "primary", 3)
        assert out["kept"] == ["primary-0", "primary-1"] and out["started"] == ["primary-2"]
        assert "- device: cpu" in served.config.read_text()
        health = await asyncio.to_thread(call, "health")
        assert health["ready"] is True
        names = [e["event"] for e in (await asyncio.to_thread(call, "events", 0))["events"]]
        for name in (
            "replica_ejected",
            "replica_readmitted",
            "replica_restarted",
            "pool_published",
        ):
            assert name in names


async def test_second_signal_stops_quickly(tmp_path: Path) -> None:
    env = {"VLLM_SR_FAULT_FORWARD_DELAY_MS": "30000"}
    async with serve(tmp_path, 1, env) as served:
        pids = list((await served.pids()).values())
        async with aiohttp.ClientSession() as s:
            call = asyncio.ensure_future(s.post(f"{served.url}/v1/embeddings", json={"input": "x"}))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                inv = await served.inventory()
                if inv["deployments"][0]["replicas"][0]["inflight"] == 1:
                    break
            served.proc.send_signal(signal.SIGTERM)
            await wait_for(lambda: "service_stopping" in served.text(), 10, "stopping")
            t0 = time.monotonic()
            served.proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(served.proc.wait(), 15)
            elapsed = time.monotonic() - t0
            with contextlib.suppress(aiohttp.ClientError):
                (await call).close()
        assert code == 0 and elapsed < 8, elapsed  # not the 30 s drain nor the forward
        assert not [p for p in pids if psutil.pid_exists(p)]
