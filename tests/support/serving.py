"""A real `vllm-sr serve` in its own process for the system-level tests, and what the tests
around one share:

- :func:`running`: the process, with the repository first on its path, stopped with SIGTERM
  (SIGKILL after a minute) however the test ends;
- :func:`served`: ready once /health is 200 (the log file yielded);
- :func:`serve`: ready once every replica of its deployments is (a :class:`Served` yielded:
  its inventory, a wait on it with a deadline, the routing exchanges per deployment);
- :func:`stand_ins`: stand-in LLM backends, started and stopped around the block;
- :func:`two_models` / :func:`one_deployment`: the providers block (``general``, the default
  model, and ``coder``, each on one backend) and the model catalog the Router-mode tests serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from tests.support.backends import StandInBackend
from tests.support.workers import short_socket_dir

REPO_ROOT = str(Path(__file__).resolve().parents[2])
STOP_S = 60.0  # SIGTERM, then SIGKILL after this
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the repository first on PYTHONPATH (then what the
    test's own PYTHONPATH had), the real worker (no VLLM_SR_WORKER_ARGV), then ``extra``."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO_ROOT, *inherited])}
    env.pop("VLLM_SR_WORKER_ARGV", None)
    env.update(extra or {})
    return env


@contextlib.asynccontextmanager
async def running(
    argv: Sequence[str], env: Mapping[str, str], log: Path, cwd: str | None = None
) -> AsyncIterator[asyncio.subprocess.Process]:
    """``argv`` as a process writing to ``log`` until the block ends: then SIGTERM, and
    SIGKILL when it has not exited within ``STOP_S``."""
    with open(log, "wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=out, stderr=out, env=dict(env), cwd=cwd
        )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), STOP_S)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def serve_argv(config: Path, *flags: str, run: Path, control: Path | None = None) -> list[str]:
    """``vllm-sr serve FLAGS --config CONFIG`` with its runtime dir ``run`` and its control
    socket ``control`` (default: in ``run``)."""
    argv = [sys.executable, "-m", "vllm_sr.cli", "serve", *flags, "--config", str(config)]
    return [*argv, "--runtime-dir", str(run), "--control-socket", str(control or run / "c")]


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
    block ends, ready once ``url``'s /health is 200; yields the log file. ``control``: where
    the control socket goes (default: in a fresh runtime dir)."""
    run = short_socket_dir(prefix="vsr-served-") / "run"
    argv = serve_argv(config, *flags, run=run, control=control)
    async with running(argv, serve_env(), log) as proc:
        deadline = time.monotonic() + ready_s
        while not await _healthy(url):
            assert proc.returncode is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "not ready:\n" + log.read_text()[-3000:]
            await asyncio.sleep(0.2)
        yield log


class Served:
    """A served `vllm-sr serve`: its process, URL, log and control socket."""

    def __init__(
        self, proc: asyncio.subprocess.Process, url: str, log: Path, control: Path
    ) -> None:
        self.proc, self.url, self.log, self.control = proc, url, log, control

    async def inventory(self) -> dict[str, Any]:
        url = self.url + "/api/v1/inventory/model-runtime"
        async with aiohttp.ClientSession() as s, s.get(url) as r:
            return dict(await r.json())

    async def until(
        self, check: Callable[[dict[str, Any]], T | None], timeout_s: float = 120.0
    ) -> T:
        """Polls the inventory until ``check`` gives something (not None, not False) and
        returns it; fails with the inventory and the log's tail past ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        inventory: dict[str, Any] = {}
        while True:
            with contextlib.suppress(aiohttp.ClientError, KeyError, IndexError):
                inventory = await self.inventory()
                got = check(inventory)
                if got is not None and got is not False:
                    return got
            assert self.proc.returncode is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, (inventory, self.log.read_text()[-3000:])
            await asyncio.sleep(0.05)

    async def routing_exchanges(self) -> dict[str, int]:
        """The routing exchanges each deployment's replicas have served, by deployment."""
        inv = await self.inventory()
        return {
            dep["name"]: sum(r["requests_by_kind"].get("routing", 0) for r in dep["replicas"])
            for dep in inv["deployments"]
        }


def all_ready(deployments: int) -> Callable[[dict[str, Any]], bool]:
    """Whether an inventory lists ``deployments`` deployments, each with every replica ready."""

    def check(inventory: dict[str, Any]) -> bool:
        deps = inventory["deployments"]
        return len(deps) == deployments and all(
            d["ready_replicas"] == len(d["replicas"]) > 0 for d in deps
        )

    return check


@contextlib.asynccontextmanager
async def serve(
    config: Path,
    *flags: str,
    env: dict[str, str] | None = None,
    deployments: int = 1,
    ready_s: float = 180.0,
) -> AsyncIterator[Served]:
    """A real `vllm-sr serve` of ``config`` with the real worker on a free port, yielded once
    its ``deployments`` deployments have every replica ready (its log: ``config`` with the
    suffix ``.log``)."""
    port = free_port()
    run = short_socket_dir(prefix="vsr-router-") / "run"
    log = config.with_suffix(".log")
    argv = serve_argv(config, *flags, "--listen", f"127.0.0.1:{port}", run=run)
    async with running(argv, serve_env(env), log) as proc:
        svc = Served(proc, f"http://127.0.0.1:{port}", log, run / "c")
        await svc.until(all_ready(deployments), ready_s)
        yield svc


@contextlib.asynccontextmanager
async def stand_ins(*names: str) -> AsyncIterator[list[StandInBackend]]:
    """A stand-in LLM backend per name, started; all stopped when the block ends."""
    started: list[StandInBackend] = []
    try:
        for name in names:
            started.append(await StandInBackend(name).start())
        yield started
    finally:
        for backend in started:
            await backend.stop()


def two_models(coder: str, general: str, general_id: str | None = None) -> str:
    """The providers block (YAML) of the Router-mode tests: ``general`` (the default model;
    ``general_id`` its provider_model_id) and ``coder``, on the backends at those endpoints."""
    model_id = f"\n      provider_model_id: {general_id}" if general_id else ""
    return f"""\
providers:
  defaults: {{default_model: general}}
  models:
    - name: general{model_id}
      backend_refs: [{{endpoint: "{general}"}}]
    - name: coder
      backend_refs: [{{endpoint: "{coder}"}}]
"""


def one_deployment(artifact: Path, replicas: int = 1) -> str:
    """The global block (YAML) serving ``artifact`` as deployment ``primary`` on CPU."""
    devices = ", ".join(["{device: cpu}"] * replicas)
    return f"""\
global:
  model_catalog:
    deployments:
      primary:
        artifact: {artifact}
        replicas: [{devices}]
"""


async def _healthy(url: str) -> bool:
    with contextlib.suppress(aiohttp.ClientError, OSError):
        async with aiohttp.ClientSession() as s, s.get(url + "/health") as r:
            return r.status == 200
    return False
