"""The adaptive-thread learner's state on a real `vllm-sr serve` (real worker, tiny BERT):
the supervisor reads each worker's /health, so `vllm-sr ctl threads` and the inventory show
what the learner does (issue 12: nothing filled this outside the control fake)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.test_serve import free_port
from tests.integration.test_supervisor_fake import REPO_ROOT

pytestmark = pytest.mark.slow


async def _inventory(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(url + "/api/v1/inventory/model-runtime") as r:
        return dict(await r.json())


async def _until(what: str, cond: Any, timeout: float, log: Path) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError, KeyError, IndexError):
            value = await cond()
            if value:
                return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")


async def test_the_learner_reaches_ctl_threads_and_the_inventory(
    tmp_path: Path, tiny_bert_dir: Path
) -> None:
    port = free_port()
    run = Path("/tmp") / f"vsr-threads-{os.getpid()}-{port}"
    control = run / "control.sock"
    log = tmp_path / "serve.log"
    env = {**os.environ, "PYTHONPATH": REPO_ROOT, "VLLM_SRUN_CPU_ADAPTIVE_THREADS": "1"}
    env["VLLM_SR_THREADS_RECORD_DIR"] = str(tmp_path / "records")  # not the runner's home
    env.pop("VLLM_SR_WORKER_ARGV", None)
    argv = [sys.executable, "-m", "vllm_sr.cli", "serve", str(tiny_bert_dir), "-e"]
    argv += ["--platform", "cpu", "--config", str(tmp_path / "config.yaml")]
    argv += ["--listen", f"127.0.0.1:{port}", "--runtime-dir", str(run)]
    argv += ["--control-socket", str(control)]
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=out, stderr=out, env=env)
    try:

        async def ready() -> bool:
            inv = await _inventory(url)
            return bool(inv["deployments"][0]["ready_replicas"] == 1)

        await _until("ready", ready, 180, log)
        async with aiohttp.ClientSession() as s:
            for i in range(20):
                body = {"input": [f"row {i} {'word ' * (i % 7)}" for _ in range(3)]}
                async with s.post(url + "/v1/embeddings", json=body) as r:
                    assert r.status == 200

        async def reported() -> Any:
            inv = await _inventory(url)
            return inv["deployments"][0]["replicas"][0]["adaptive_threads"]

        report = await _until("a learner report", reported, 30, log)
        assert report["mode"] == 1 and report["state"] in ("exploring", "learned", "retired")
        out = subprocess.run(
            [sys.executable, "-m", "vllm_sr.cli", "ctl", "threads", "--socket",
             str(control), "--json"],
            capture_output=True, text=True, env=env, timeout=60, check=True,
        )  # fmt: skip
        rows = json.loads(out.stdout)
        ((rid, doc),) = rows.items()
        assert rid.endswith("-0") and doc["mode"] == 1 and doc["configured"] >= 1
        text = subprocess.run(
            [sys.executable, "-m", "vllm_sr.cli", "ctl", "threads", "--socket",
             str(control)],
            capture_output=True, text=True, env=env, timeout=60, check=True,
        ).stdout  # fmt: skip
        assert "mode 1" in text and "adaptive threads off" not in text, text
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 60)
            except TimeoutError:
                proc.kill()
                await proc.wait()
