"""A real `vllm-sr serve` in its own process for the Router-mode system-level tests: started
with the repository on its path (and the real worker), waited for until /health is 200,
stopped with SIGTERM (SIGKILL after a minute)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from tests.support.workers import short_socket_dir

REPO_ROOT = str(Path(__file__).resolve().parents[2])


@contextlib.asynccontextmanager
async def served(
    config: Path,
    url: str,
    *flags: str,
    log: Path,
    ready_s: float = 300,
    control: Path | None = None,
) -> AsyncIterator[Path]:
    """Serve ``config`` (``flags`` say where it listens, when not its listener) until the
    block ends; yields the log file. ``control``: where the control socket goes (default: in
    a fresh runtime dir). The repository comes first on the served process's path, then what
    the test's own PYTHONPATH had."""
    run = short_socket_dir(prefix="vsr-served-") / "run"
    argv = [sys.executable, "-m", "vllm_sr.cli", "serve", "--config", str(config), *flags]
    argv += ["--runtime-dir", str(run), "--control-socket", str(control or run / "c")]
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO_ROOT, *inherited])}
    env.pop("VLLM_SR_WORKER_ARGV", None)
    with open(log, "wb") as out:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=out, stderr=out, env=env)
    try:
        deadline = time.monotonic() + ready_s
        while not await _healthy(url):
            assert proc.returncode is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "not ready:\n" + log.read_text()[-3000:]
            await asyncio.sleep(0.2)
        yield log
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 60)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def _healthy(url: str) -> bool:
    with contextlib.suppress(aiohttp.ClientError, OSError):
        async with aiohttp.ClientSession() as s, s.get(url + "/health") as r:
            return r.status == 200
    return False
