"""Supervision that heals itself (issue 25 part 1), on real processes with the stand-in worker:
a spawn that fails (EMFILE) backs off and is tried again, a life loop that raises is reported
and revived by the reconcile pass, a service task that raises runs again, and a real
open-file limit on a real `vllm-sr serve` (prlimit) does not leave a killed replica down. And
part 5's connection cap: a flood of idle connections leaves the control socket and worker
restarts working."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.integration.test_serve import serve, wait_for_ready
from tests.integration.test_supervisor_fake import fake_plan, replica_doc, start_service, wait_for
from tests.support.workers import short_socket_dir
from vllm_sr import events as ev
from vllm_sr.control.client import AsyncControlClient
from vllm_sr.control.server import ControlServer
from vllm_sr.supervisor import keeper, supervisor, usage
from vllm_sr.supervisor import process as process_module

pytestmark = pytest.mark.slow

FAST = {"backoff_initial_s": 0.05, "backoff_max_s": 0.2}


def events_named(sup: Any, name: str) -> list[dict[str, Any]]:
    return [e.fields for e in sup.events.since(0) if e.event == name]


async def test_a_spawn_that_fails_backs_off_and_a_later_spawn_brings_the_replica_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    svc = await start_service(lambda: fake_plan(1), **FAST)
    try:
        real = process_module.asyncio.create_subprocess_exec
        fails = {"left": 3}

        async def flaky(*args: Any, **kwargs: Any) -> Any:
            if fails["left"] > 0:
                fails["left"] -= 1
                raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
            return await real(*args, **kwargs)

        monkeypatch.setattr(process_module.asyncio, "create_subprocess_exec", flaky)
        old = svc.sup.replicas["primary-0"].pid
        assert old is not None
        os.kill(old, signal.SIGKILL)
        await wait_for(
            lambda: (
                replica_doc(svc.sup, "primary-0")["pid"] not in (None, old)
                and replica_doc(svc.sup, "primary-0")["ready"]
            ),
            30,
            "the replica back after three failed spawns",
            svc.sup.inventory,
        )
        backoffs = [
            b for b in events_named(svc.sup, ev.REPLICA_BACKOFF) if "spawn failed" in str(b)
        ]
        assert len(backoffs) == 3
        assert "OSError: [Errno 24]" in backoffs[0]["reason"]
        assert not svc.loop_task.done()  # never a crash of the service
        assert replica_doc(svc.sup, "primary-0")["restarts"] == 4  # the exit + three tries
    finally:
        await svc.stop()


async def test_a_life_loop_that_raises_is_reported_and_revived() -> None:
    svc = await start_service(lambda: fake_plan(2), **FAST)
    try:
        sup = svc.sup
        real_on_ready = sup.hooks.on_ready
        broke = {"once": True}

        def on_ready(rep: Any) -> None:
            if broke["once"] and rep.id == "primary-1":
                broke["once"] = False
                raise RuntimeError("a bug in a hook")
            real_on_ready(rep)

        sup.hooks.on_ready = on_ready  # type: ignore[method-assign]
        old = sup.replicas["primary-1"].pid
        assert old is not None
        os.kill(old, signal.SIGKILL)
        failed = await wait_for(
            lambda: events_named(sup, ev.REPLICA_SUPERVISION_FAILED), 20, "the failure reported"
        )
        assert failed[0]["replica"] == "primary-1"
        assert failed[0]["error"] == "supervision failed: RuntimeError: a bug in a hook"
        doc = replica_doc(sup, "primary-1")
        assert doc["supervision_failures"] == 1
        await wait_for(
            lambda: (
                replica_doc(sup, "primary-1")["ready"]
                and replica_doc(sup, "primary-1")["pid"] not in (None, old)
            ),
            30,
            "the replica revived by the reconcile pass",
            sup.inventory,
        )
        # Nothing of the lapsed life was left behind: one worker per replica.
        children = psutil.Process().children()
        assert sorted(c.pid for c in children if c.is_running() and c.status() != "zombie") == (
            sorted(r.pid for r in sup.replicas.values() if r.pid is not None)
        )
    finally:
        await svc.stop()


async def test_a_service_task_that_raises_runs_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor, "USAGE_EVERY_S", 0.05)
    monkeypatch.setattr(keeper.TaskKeeper, "initial_s", 0.05)
    real_take = usage.UsageSampler._take
    fails = {"left": 1}

    def take(self: Any, workers: list[Any]) -> Any:
        if fails["left"] > 0:
            fails["left"] -= 1
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_take(self, workers)

    monkeypatch.setattr(usage.UsageSampler, "_take", take)
    svc = await start_service(lambda: fake_plan(1), **FAST)
    try:
        failed = await wait_for(
            lambda: events_named(svc.sup, ev.SERVICE_TASK_FAILED), 20, "the task failure"
        )
        assert failed[0]["task"] == "usage" and "Errno 24" in failed[0]["error"]
        assert svc.sup.inventory()["service"]["task_failures"] == {"usage": 1}
        await wait_for(
            lambda: replica_doc(svc.sup, "primary-0")["usage"] is not None,
            20,
            "usage sampled again",
        )
    finally:
        await svc.stop()


async def test_an_open_file_limit_on_serve_does_not_keep_a_killed_replica_down(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path, 2) as served:
        pids = await served.pids()
        victim = pids["primary-1"]
        pid = served.proc.pid
        soft = psutil.Process(pid).rlimit(psutil.RLIMIT_NOFILE)[0]
        # Soft limit 3: every new descriptor of the service fails with EMFILE (pipes, sockets).
        subprocess.run(["prlimit", "--pid", str(pid), "--nofile=3:"], check=True)
        try:
            os.kill(victim, signal.SIGKILL)
            await wait_for(
                lambda: "spawn failed" in served.text(), 30, "a failed spawn", served.text
            )
        finally:
            subprocess.run(["prlimit", "--pid", str(pid), f"--nofile={soft}:"], check=True)
        await wait_for_ready(served, 2)
        after = await served.pids()
        assert after["primary-1"] not in (None, victim)
        assert served.proc.returncode is None
        assert "replica_backoff" in served.text()


async def test_a_connection_flood_leaves_the_control_socket_and_restarts_working() -> None:
    svc = await start_service(lambda: fake_plan(2), **FAST)
    svc.frontend.server.max_connections = 30
    sock = short_socket_dir(prefix="vsr-ctl-") / "control.sock"
    control = ControlServer(svc.sup, sock, group=None)
    await control.start()
    host, port = svc.url.removeprefix("http://").rsplit(":", 1)
    flood: list[asyncio.StreamWriter] = []
    try:
        for _ in range(300):  # idle connections, never a request
            _, writer = await asyncio.open_connection(host, int(port))
            flood.append(writer)
        await wait_for(lambda: svc.frontend.server.turned_away >= 270, 20, "the excess refused")
        assert len(svc.frontend.server.connections) <= 30
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        head = await asyncio.wait_for(reader.read(), 10)
        assert head.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in head
        writer.close()
        # The control socket answers, and a killed worker is spawned again, during the flood.
        async with AsyncControlClient(sock) as ctl:
            inv = await ctl.inventory()
        assert inv["deployments"][0]["ready_replicas"] == 2
        old = svc.sup.replicas["primary-0"].pid
        assert old is not None
        os.kill(old, signal.SIGKILL)
        await wait_for(
            lambda: (
                replica_doc(svc.sup, "primary-0")["ready"]
                and replica_doc(svc.sup, "primary-0")["pid"] not in (None, old)
            ),
            30,
            "the killed worker back during the flood",
        )
    finally:
        for writer in flood:
            writer.close()
        await control.stop()
        await svc.stop()
