"""The control API of a real `vllm-sr serve` (two real workers serving a tiny random BERT):
every endpoint through the clients, the CLI and curl; an ejection made through the API reaches
the event stream and takes the replica out of dispatch; a second server on the live socket is
refused; SIGTERM removes the socket and the CLI then says the service is not running."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.control_fake import FakeBackend
from tests.support.workers import short_socket_dir
from vllm_sr import errors
from vllm_sr.control.client import AsyncControlClient, ControlClient
from vllm_sr.control.server import ControlServer

pytestmark = pytest.mark.slow

READY_DEADLINE_S = 150.0


@dataclass
class Service:
    proc: subprocess.Popen[bytes]
    dir: Path
    socket: Path
    url: str
    config: Path
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait(cond: Callable[[], bool], deadline_s: float, what: str, svc: Service) -> None:
    end = time.monotonic() + deadline_s
    while not cond():
        if svc.proc.poll() is not None:
            raise AssertionError(f"vllm-sr serve exited early:\n{svc.log.read_text()[-3000:]}")
        assert time.monotonic() < end, f"{what} not reached in {deadline_s} s"
        time.sleep(0.1)


def _replica(inv: dict[str, Any], rid: str) -> dict[str, Any]:
    return next(r for d in inv["deployments"] for r in d["replicas"] if r["id"] == rid)


def _all_ready(client: ControlClient) -> bool:
    try:
        inv = client.inventory()
    except errors.VllmSrError:
        return False
    return all(r["ready"] for d in inv["deployments"] for r in d["replicas"])


@pytest.fixture
def service(tiny_bert_dir: Path) -> Iterator[Service]:
    d = short_socket_dir(prefix="vsr-svc-")
    settings = d / "vllm-sr.toml"
    settings.write_text("# test host settings: defaults, paths given as flags\n")
    sock = d / "control.sock"
    port = _free_port()
    log = d / "serve.log"
    argv = [
        sys.executable, "-m", "vllm_sr.cli", "serve", str(tiny_bert_dir), "-e",
        "--platform", "cpu", "-dp", "2", "--config", str(d / "config.yaml"),
        "--service-config", str(settings), "--runtime-dir", str(d / "run"),
        "--control-socket", str(sock), "--listen", f"127.0.0.1:{port}",
    ]  # fmt: skip
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    svc = Service(proc, d, sock, f"http://127.0.0.1:{port}", d / "config.yaml", log)
    try:
        _wait(lambda: _all_ready(ControlClient(sock)), READY_DEADLINE_S, "both workers ready", svc)
        yield svc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(d, ignore_errors=True)


def _cli(svc: Service, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vllm_sr.cli", *args, "--socket", str(svc.socket)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, COLUMNS="120"),
    )


async def _embed(url: str, text: str) -> int:
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{url}/v1/embeddings", json={"input": text}) as resp,
    ):
        await resp.read()
        return resp.status


async def _next_event(events: asyncio.Queue[dict[str, Any]], name: str) -> dict[str, Any]:
    while True:
        event = await asyncio.wait_for(events.get(), 60)
        if event["event"] == name:
            return event


async def _api_walkthrough(svc: Service) -> None:
    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    async with AsyncControlClient(svc.socket) as c:
        base = (await c.events())["last_seq"]

        async def follow() -> None:
            async for event in c.stream_events(since=base):
                events.put_nowait(event)

        task = asyncio.create_task(follow())
        assert (await c.health())["ready"] is True
        config = await c.config()
        assert len(config["global"]["model_catalog"]["deployments"]["primary"]["replicas"]) == 2

        # A manual ejection: on the stream, in the inventory, and out of dispatch.
        result = await c.eject("primary-0", 60_000)
        assert result["ok"] is True
        ejected = await _next_event(events, "replica_ejected")
        assert (ejected["replica"], ejected["reason"]) == ("primary-0", "manual")
        inv = await c.inventory()
        rep = _replica(inv, "primary-0")
        assert rep["state"] == "ejected" and rep["ejected_until"] > time.time() + 30
        before = _replica(inv, "primary-1")["requests"]
        assert [await _embed(svc.url, f"row {i}") for i in range(4)] == [200] * 4
        inv = await c.inventory()
        assert _replica(inv, "primary-1")["requests"] - before == 4
        assert _replica(inv, "primary-0")["requests"] == 0

        await c.readmit("primary-0")
        readmitted = await _next_event(events, "replica_readmitted")
        assert readmitted["replica"] == "primary-0"
        assert _replica(await c.inventory(), "primary-0")["state"] == "ready"

        with pytest.raises(errors.NotFound):
            await c.drain("primary-7")
        with pytest.raises(errors.InvalidRequest):
            await c.request("POST", "/v1/deployments/primary/scale", {"replicas": "two"})

        # Restart: the worker comes back with a new pid.
        old_pid = _replica(await c.inventory(), "primary-1")["pid"]
        await c.restart("primary-1")
        ready = await _next_event(events, "replica_ready")
        assert ready["replica"] == "primary-1" and ready["pid"] != old_pid

        # Scale through the planner: the canonical config is rewritten.
        result = await c.scale("primary", 1)
        assert result["ok"] is True
        inv = await c.inventory()
        assert inv["deployments"][0]["desired_replicas"] == 1
        task.cancel()
    assert svc.config.read_text().count("device: cpu") == 1


def test_control_api_of_the_real_service(service: Service) -> None:
    status = _cli(service, "status")
    assert status.returncode == 0, status.stderr
    # The header names the model's path; a long one wraps the line at 80 columns.
    assert "primary-0" in status.stdout and re.search(r"2/2\s+ready", status.stdout)

    asyncio.run(_api_walkthrough(service))

    if shutil.which("curl"):
        out = subprocess.run(
            ["curl", "-sS", "--unix-socket", str(service.socket), "http://localhost/v1/inventory"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert json.loads(out.stdout)["service"]["pid"] == service.proc.pid

    events = _cli(service, "ctl", "events", "--json")
    names = [json.loads(line)["event"] for line in events.stdout.splitlines()]
    assert {"replica_ejected", "replica_readmitted", "replica_ready"} <= set(names)

    # The live socket is refused, naming the service's pid.
    second = ControlServer(FakeBackend(), service.socket, group=None)
    with pytest.raises(errors.Conflict, match=f"pid {service.proc.pid}"):
        asyncio.run(second.start())

    service.proc.send_signal(signal.SIGTERM)
    assert service.proc.wait(90) == 0
    assert not service.socket.exists()
    gone = _cli(service, "status")
    assert gone.returncode == errors.EXIT_NOT_RUNNING
    assert "vllm-sr is not running" in gone.stderr
