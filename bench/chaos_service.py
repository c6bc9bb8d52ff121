"""The service under test in bench/chaos.py: a real `vllm-sr serve` (d3-edge workers, or the
stand-in worker with ``--stand-in``) and the steady load whose every answer is recorded and
classified (as expected, a timeout, or lost)."""

from __future__ import annotations

import asyncio
import glob
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import REPO, free_port, stand_in_serve_env

TIMEOUT_MS = 2000
LATE_S = TIMEOUT_MS / 1000 + 0.5
REQUEST_NUMBERS = itertools.count(1)

CONFIG = f"""\
global:
  router:
    enabled: false
  model_catalog:
    deployments:
      primary:
        provider: model_runtime
        artifact: vllm-sr/d3-edge
        timeout_ms: {TIMEOUT_MS}   # the deadline checked; the hang bound is then 10 s
    system:
      decision_model:
        deployment: primary
"""


@dataclass
class Record:
    t0: float
    t1: float
    status: int
    code: str = ""  # the error's code when the answer was not a 200
    expect: int = 200  # 400 for a request sent bad on purpose

    @property
    def timeout(self) -> bool:
        """It ran out of its own deadline (the pool's 504 or the worker's own)."""
        return self.status == 504 and self.code == "deadline_exceeded"

    @property
    def lost(self) -> bool:
        return self.status != self.expect and not self.timeout


@dataclass
class Service:
    proc: subprocess.Popen[bytes]
    url: str
    run: Path
    config: Path
    log: Path

    def inventory(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/api/v1/inventory/model-runtime", timeout=5) as r:
            return dict(json.load(r))

    def replicas(self) -> list[dict[str, Any]]:
        return list(self.inventory()["deployments"][0]["replicas"])

    def whole(self, n: int) -> bool:
        try:
            reps = self.replicas()
        except OSError:
            return False
        serving = [r for r in reps if r["state"] == "ready"]
        return len(reps) == n and len(serving) == n

    def ctl(self, *args: str) -> None:
        cmd = [sys.executable, "-m", "vllm_sr.cli", "ctl", *args, "--socket", str(self.run / "c")]
        subprocess.run(cmd, check=True, capture_output=True, timeout=900)

    def worker_socket(self, rid: str) -> str:
        paths = glob.glob(str(self.run / "workers" / f"{rid}*.sock"))
        return max(paths, key=os.path.getmtime)


@dataclass
class Load:
    url: str
    callers: int = 8
    records: list[Record] = field(default_factory=list)
    n: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn) as s:
            await asyncio.gather(*(self._caller(s, stop) for _ in range(self.callers)))

    async def _caller(self, s: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.one(s)

    def body(self) -> tuple[dict[str, Any], int]:
        """The next request and the status it should get."""
        n = next(REQUEST_NUMBERS)  # distinct across every load, so no worker cache answers
        return {"input": f"request {n}: where is my parcel number {n * 7919 % 10007}?"}, 200

    async def one(self, s: aiohttp.ClientSession) -> None:
        self.n += 1
        body, expect = self.body()
        t0 = time.monotonic()
        code = ""
        try:
            async with s.post(self.url + "/v1/embeddings", json=body) as r:
                data = await r.read()
                status = r.status
            if status != 200:
                try:
                    code = str(json.loads(data)["error"]["code"])
                except (ValueError, KeyError, TypeError):
                    code = "?"
        except aiohttp.ClientError:
            status = 0  # connection refused or reset: the service was not there
        self.records.append(Record(t0, time.monotonic(), status, code, expect))


@dataclass
class MixedLoad(Load):
    """What a hung replica can still answer beside the new texts: the same few texts again
    (each worker's result cache has them after its first answer) and bad requests (400 from
    the worker's HTTP loop); no forward produces either."""

    k: int = 0

    def body(self) -> tuple[dict[str, Any], int]:
        self.k += 1
        if self.k % 2:
            return {"input": f"a text every worker has cached {self.k % 6}"}, 200
        return {"input": 7}, 400


def start(tmp: Path, replicas: int, *, stand_in: bool = False) -> Service:
    port = free_port()
    run = Path(tempfile.mkdtemp(prefix="vsr-chaos-", dir="/tmp"))
    config = tmp / "config.yaml"
    config.write_text(CONFIG)  # the flags below add the replicas; timeout_ms stays
    env = {**os.environ, "VLLM_SR_ENABLE_FAULTS": "1", "HF_HUB_OFFLINE": "1"}
    if stand_in:
        env.update(stand_in_serve_env())
    argv = [sys.executable, "-m", "vllm_sr.cli", "serve", "vllm-sr/d3-edge", "-e"]
    argv += ["--platform", "cpu", "-dp", str(replicas), "--config", str(config)]
    argv += ["--listen", f"127.0.0.1:{port}", "--runtime-dir", str(run)]
    argv += ["--control-socket", str(run / "c")]
    log = open(tmp / "serve.log", "wb")  # noqa: SIM115 (lives as long as the service)
    proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env, cwd=REPO)
    svc = Service(proc, f"http://127.0.0.1:{port}", run, config, tmp / "serve.log")
    wait(lambda: svc.whole(replicas), 300, "the service ready")
    return svc


def wait(cond: Any, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if cond():
                return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"chaos: timed out after {timeout} s waiting for {what}")
