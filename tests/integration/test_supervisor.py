"""The supervisor and frontend on real processes and real sockets, with the stand-in worker
(tests/integration/test_supervisor_fake.py): spawn, readiness, dispatch, death mid-request,
restart with backoff, do-not-restart, admission, reload, drain on stop."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import stat
import sys
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from tests.integration.test_supervisor_fake import (
    FAKE_MODULE,
    REPO_ROOT,
    fake_plan,
    fake_spec,
    replica_doc,
    spec_of,
    start_service,
    wait_for,
)
from vllm_sr import events as ev
from vllm_sr.control.commands import Command
from vllm_sr.errors import ConfigError, VllmSrError
from vllm_sr.plan import DeploymentPlan, ServicePlan
from vllm_sr.pool.settings import PoolSettings
from vllm_sr.supervisor.reconfigure import RELOAD_MARGIN_S


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


pytestmark = pytest.mark.slow


async def post(
    session: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with session.post(url, json=body, headers=headers) as resp:
        return resp.status, await resp.json(), dict(resp.headers)


async def test_serves_through_one_worker_and_describes_itself() -> None:
    svc = await start_service(lambda: fake_plan(1))
    try:
        rep = svc.sup.replicas["primary-0"]
        sock = Path(rep.socket_path)
        assert sock.parent.name == "workers" and sock.name == "primary-0.sock"
        assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
        async with aiohttp.ClientSession() as s:
            status, doc, _ = await post(s, f"{svc.url}/v1/embeddings", {"input": ["abc", "de"]})
            assert status == 200
            assert doc["pid"] == rep.pid and [d["embedding"][0] for d in doc["data"]] == [3.0, 2.0]
            async with s.get(f"{svc.url}/health") as r:
                assert r.status == 200
            async with s.get(f"{svc.url}/v1/models") as r:
                models = await r.json()
            assert [m["id"] for m in models["data"]] == ["primary"]
            async with s.get(f"{svc.url}/api/v1/inventory/model-runtime") as r:
                inv = await r.json()
            dep = inv["deployments"][0]
            assert (dep["name"], dep["state"], dep["desired_replicas"], dep["ready_replicas"]) == (
                "primary",
                "ready",
                1,
                1,
            )
            assert dep["replicas"][0]["pid"] == rep.pid
            status, doc, _ = await post(
                s, f"{svc.url}/v1/embeddings", {"model": "nope", "input": "x"}
            )
            assert status == 404 and doc["error"]["code"] == "model_not_found"
            async with s.get(f"{svc.url}/metrics") as r:
                text = await r.text()
            series = 'deployment="primary",outcome="success",replica="primary-0"'
            assert f"vllm_sr_replica_requests_total{{{series}}} 1.0" in text
    finally:
        await svc.stop()
    assert (
        not psutil.pid_exists(rep.process.pid if rep.process else -1)
        or psutil.Process(
            rep.process.pid  # type: ignore[union-attr]
        ).status()
        == psutil.STATUS_ZOMBIE
    )


async def test_kill_9_mid_request_gives_502_and_the_worker_comes_back() -> None:
    svc = await start_service(
        lambda: fake_plan(1, env={"VLLM_SR_ENABLE_FAULTS": "1"}), backoff_initial_s=0.2
    )
    try:
        rep = svc.sup.replicas["primary-0"]
        old_pid = rep.pid
        assert old_pid is not None
        assert (await rep.client.set_faults(5000)).status == 200
        async with aiohttp.ClientSession() as s:
            call = asyncio.ensure_future(post(s, f"{svc.url}/v1/embeddings", {"input": "x"}))
            await wait_for(
                lambda: replica_doc(svc.sup, "primary-0")["inflight"] == 1, 10, "in flight"
            )
            os.kill(old_pid, signal.SIGKILL)
            status, doc, _ = await asyncio.wait_for(call, 10)
        assert status == 502 and doc["error"]["code"] == "worker_failed"
        doc = replica_doc(svc.sup, "primary-0")
        assert doc["inflight"] == 0 and doc["outstanding_bytes"] == 0
        await wait_for(
            lambda: (
                replica_doc(svc.sup, "primary-0")["pid"] not in (None, old_pid)
                and replica_doc(svc.sup, "primary-0")["ready"]
            ),
            20,
            "a new ready worker",
        )
        assert replica_doc(svc.sup, "primary-0")["restarts"] == 1
        names = [e.event for e in svc.sup.events.since(0)]
        assert ev.REPLICA_EXITED in names and ev.REPLICA_RESTARTED in names
    finally:
        await svc.stop()


async def test_do_not_restart_exit_marks_failed_with_reason() -> None:
    svc = await start_service(
        lambda: fake_plan(1, env={"FAKE_EXIT_CODE": "78"}), wait_ready=False, backoff_initial_s=0.05
    )
    try:
        await wait_for(lambda: replica_doc(svc.sup, "primary-0")["state"] == "failed", 20, "failed")
        doc = replica_doc(svc.sup, "primary-0")
        assert "refusing artifact" in doc["last_error"] and doc["restarts"] == 0
        assert svc.sup.health()["ready"] is False
    finally:
        await svc.stop()


async def test_two_full_workers_refuse_exactly_the_excess_with_429() -> None:
    svc = await start_service(
        lambda: fake_plan(2, env={"VLLM_SR_FAULT_FORWARD_DELAY_MS": "1500"}, timeout_ms=10000)
    )
    extra = 5
    try:
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn) as s:
            calls = [
                asyncio.ensure_future(post(s, f"{svc.url}/v1/embeddings", {"input": f"t{i}"}))
                for i in range(64)
            ]
            await wait_for(
                lambda: (
                    sum(r["inflight"] for r in svc.sup.inventory()["deployments"][0]["replicas"])
                    == 64
                ),
                20,
                "64 in flight",
            )
            more = await asyncio.gather(
                *(post(s, f"{svc.url}/v1/embeddings", {"input": "x"}) for _ in range(extra))
            )
            results = await asyncio.gather(*calls)
        assert [m[0] for m in more] == [429] * extra
        assert all(m[1]["error"]["code"] == "overloaded" and "Retry-After" in m[2] for m in more)
        assert [r[0] for r in results] == [200] * 64
    finally:
        await svc.stop()


class SteadyLoad:
    """Requests in a loop from a few tasks; records every status."""

    def __init__(self, url: str, tasks: int = 4) -> None:
        self.url, self.statuses, self.stop = url, [], asyncio.Event()
        self.statuses: list[int] = []
        self._tasks = [asyncio.ensure_future(self._run()) for _ in range(tasks)]

    async def _run(self) -> None:
        async with aiohttp.ClientSession() as s:
            while not self.stop.is_set():
                status, _, _ = await post(s, f"{self.url}/v1/embeddings", {"input": "load"})
                self.statuses.append(status)

    async def finish(self) -> list[int]:
        self.stop.set()
        await asyncio.gather(*self._tasks)
        return self.statuses


async def test_reload_2_3_1_under_load_keeps_ids_and_fails_nothing() -> None:
    wanted = {"n": 2}
    svc = await start_service(lambda: fake_plan(wanted["n"]))
    try:
        pids = {rid: svc.sup.replicas[rid].pid for rid in ("primary-0", "primary-1")}
        load = SteadyLoad(svc.url)
        await wait_for(lambda: len(load.statuses) > 20, 10, "load running")
        wanted["n"] = 3
        result = await svc.sup.submit(Command("reload"))
        assert result["kept"] == ["primary-0", "primary-1"] and result["started"] == ["primary-2"]
        assert {rid: svc.sup.replicas[rid].pid for rid in pids} == pids
        inv = svc.sup.inventory()["deployments"][0]
        assert inv["desired_replicas"] == 3 and inv["ready_replicas"] == 3
        mark = len(load.statuses)
        await wait_for(lambda: len(load.statuses) > mark + 20, 10, "load after reload")
        wanted["n"] = 1
        retired_pid = svc.sup.replicas["primary-2"].pid
        result = await svc.sup.submit(Command("reload"))
        assert result["kept"] == ["primary-0"] and sorted(result["retired"]) == [
            "primary-1",
            "primary-2",
        ]
        assert svc.sup.replicas["primary-0"].pid == pids["primary-0"]
        await wait_for(
            lambda: len(svc.sup.inventory()["deployments"][0]["replicas"]) == 1, 20, "retired gone"
        )
        await wait_for(
            lambda: not psutil.pid_exists(retired_pid or -1), 20, "retired worker exited"
        )
        statuses = await load.finish()
        assert statuses and set(statuses) == {200}
        # A retry would hide a retired worker killed mid-request (its 200 came from another).
        assert svc.sup.pools["primary"].retries == 0
        assert svc.sup.generation == 2
    finally:
        await svc.stop()


async def test_caches_follow_the_replica_count_on_every_reload() -> None:
    """Issue 39 item 2: 1 -> 2 gives each replica (the kept one too, same process) its worker
    cache and turns the frontend's off; 2 -> 1 drops the kept worker's and the frontend's is
    back. The inventory says both."""
    wanted = {"n": 1}
    worker_bytes = 1 << 20
    svc = await start_service(lambda: fake_plan(wanted["n"]), worker_cache_bytes=worker_bytes)

    def caches() -> tuple[int | None, dict[str, int | None]]:
        (dep,) = svc.sup.inventory()["deployments"]
        return dep["frontend_cache_bytes"], {
            r["id"]: r["result_cache_bytes"] for r in dep["replicas"]
        }

    async def second_is_a_hit(text: str) -> bool:
        async with aiohttp.ClientSession() as s:
            for _ in range(2):
                status, _, headers = await post(s, f"{svc.url}/v1/embeddings", {"input": text})
                assert status == 200
        return headers.get("X-Cache") == "hit"

    try:
        pid = svc.sup.replicas["primary-0"].pid
        assert caches() == (64 * 1024 * 1024, {"primary-0": 0})
        assert await second_is_a_hit("one")
        wanted["n"] = 2
        result = await svc.sup.submit(Command("reload"))
        assert result["kept"] == ["primary-0"] and svc.sup.replicas["primary-0"].pid == pid
        assert caches() == (0, {"primary-0": worker_bytes, "primary-1": worker_bytes})
        assert not await second_is_a_hit("two")
        wanted["n"] = 1
        await svc.sup.submit(Command("reload"))
        await wait_for(lambda: len(caches()[1]) == 1, 20, "primary-1 retired")
        assert svc.sup.replicas["primary-0"].pid == pid
        assert caches() == (64 * 1024 * 1024, {"primary-0": 0})
        assert await second_is_a_hit("three")
    finally:
        await svc.stop()


async def test_a_kept_worker_starting_during_a_scale_takes_its_new_cache_when_ready() -> None:
    """primary-0's process was spawned (restarting, with no cache) before a scale to 2 was
    published: as it gets ready it is told its worker cache, and the inventory says so."""
    wanted = {"n": 1}
    worker_bytes = 1 << 20

    def planner() -> ServicePlan:
        plan = fake_plan(wanted["n"])
        plan.deployments["primary"].replicas[0].env["FAKE_READY_DELAY_S"] = "3"
        return plan

    svc = await start_service(planner, worker_cache_bytes=worker_bytes, backoff_initial_s=0.05)
    try:
        rep = svc.sup.replicas["primary-0"]
        old_pid = rep.pid
        assert old_pid is not None
        os.kill(old_pid, signal.SIGKILL)
        await wait_for(
            lambda: rep.pid not in (None, old_pid) and rep.state.value == "starting",
            10,
            "primary-0 starting again",
        )
        new_pid = rep.pid
        wanted["n"] = 2
        result = await svc.sup.submit(Command("reload"))
        assert result["kept"] == ["primary-0"]
        assert rep.state.value == "starting"  # still starting: the path under test
        await wait_for(
            lambda: replica_doc(svc.sup, "primary-0")["ready"], 20, "primary-0 ready again"
        )
        doc = replica_doc(svc.sup, "primary-0")
        assert (doc["pid"], doc["result_cache_bytes"]) == (new_pid, worker_bytes)
        assert replica_doc(svc.sup, "primary-1")["result_cache_bytes"] == worker_bytes
    finally:
        await svc.stop()


async def test_bad_reload_keeps_serving_and_says_why() -> None:
    state = {"bad": False}

    def planner() -> Any:
        if state["bad"]:
            raise ConfigError("config.yaml:3: replicas: -1 is not accepted (want >= 0)")
        return fake_plan(1)

    svc = await start_service(planner)
    try:
        pid = svc.sup.replicas["primary-0"].pid
        state["bad"] = True
        with pytest.raises(ConfigError):
            await svc.sup.submit(Command("reload"))
        failed = [e for e in svc.sup.events.since(0) if e.event == ev.RELOAD_FAILED]
        assert failed and "replicas: -1" in failed[0].fields["reason"]
        async with aiohttp.ClientSession() as s:
            status, _, _ = await post(s, f"{svc.url}/v1/embeddings", {"input": "x"})
        assert status == 200 and svc.sup.replicas["primary-0"].pid == pid
    finally:
        await svc.stop()


async def test_stop_drains_in_flight_then_stops_workers() -> None:
    svc = await start_service(lambda: fake_plan(1, env={"VLLM_SR_FAULT_FORWARD_DELAY_MS": "800"}))
    pid = svc.sup.replicas["primary-0"].pid
    async with aiohttp.ClientSession() as s:
        calls = [
            asyncio.ensure_future(post(s, f"{svc.url}/v1/embeddings", {"input": "x"}))
            for _ in range(5)
        ]
        await wait_for(lambda: replica_doc(svc.sup, "primary-0")["inflight"] == 5, 10, "in flight")
        svc.sup.queue.put_nowait(Command("stop", source="signal:SIGTERM"))
        await wait_for(lambda: svc.sup.stopping, 5, "stopping")
        late, _, _ = await post(s, f"{svc.url}/v1/embeddings", {"input": "late"})
        results = await asyncio.gather(*calls)
    await svc.stop()
    assert [r[0] for r in results] == [200] * 5
    assert late == 503
    assert not psutil.pid_exists(pid or -1) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


async def test_attached_replica_is_served_with_its_own_model_name() -> None:
    port = free_port()
    argv = [sys.executable, "-m", FAKE_MODULE, "worker", "fake/remote", "--port", str(port)]
    remote = await asyncio.create_subprocess_exec(
        *argv, env={**os.environ, "PYTHONPATH": REPO_ROOT}
    )
    spec = spec_of(
        "primary-0",
        "primary",
        0,
        device=None,
        endpoint=f"http://127.0.0.1:{port}",
        model="remote-name",
    )  # type: ignore[arg-type]
    plan = ServicePlan(
        {"primary": DeploymentPlan("primary", "fake/remote", [spec], PoolSettings())}, "primary"
    )
    svc = await start_service(lambda: plan)
    try:
        async with aiohttp.ClientSession() as s:
            status, doc, _ = await post(
                s, f"{svc.url}/v1/embeddings", {"model": "primary", "input": "x"}
            )
        assert status == 200 and doc["model_seen"] == "remote-name" and doc["pid"] == remote.pid
        rep = replica_doc(svc.sup, "primary-0")
        assert rep["pid"] is None and rep["device"] == f"http://127.0.0.1:{port}"
    finally:
        await svc.stop()
        remote.terminate()
        await remote.wait()
    assert remote.returncode is not None  # the supervisor never owned it; the test stopped it


class RecordingNotifier:
    """Stands in for SystemdNotifier: records what the supervisor tells systemd, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def ready(self, status: str | None = None) -> None:
        self.calls.append(("ready", status))

    def status(self, text: str) -> None:
        self.calls.append(("status", text))

    def reloading(self) -> None:
        self.calls.append(("reloading", None))

    def stopping(self) -> None:
        self.calls.append(("stopping", None))

    def extend_timeout(self, seconds: float) -> None:
        self.calls.append(("extend_timeout", seconds))

    async def run_watchdog(self) -> None:
        return None

    def kinds(self) -> list[str]:
        return [k for k, _ in self.calls if k != "status"]


async def test_systemd_hears_ready_once_status_reload_and_stopping() -> None:
    notifier = RecordingNotifier()
    replicas = {"n": 1}
    svc = await start_service(lambda: fake_plan(replicas["n"]), notifier=notifier)
    try:
        await wait_for(lambda: "ready" in notifier.kinds(), 10, "READY=1")
        assert notifier.kinds()[0] == "extend_timeout"  # before any worker is ready
        statuses = [v for k, v in notifier.calls if k == "status"]
        assert statuses and "primary: 1/1 ready" in statuses[-1]
        replicas["n"] = 2
        await svc.sup.submit(Command("reload"))
        kinds = notifier.kinds()
        at = kinds.index("reloading")
        # The reload's answer comes after READY=1; its time bound is the new workers' ready
        # timeout plus a margin, given to systemd (whose reload timer is TimeoutStartSec=).
        assert kinds[at : at + 3] == ["reloading", "extend_timeout", "ready"]
        extended = [v for k, v in notifier.calls if k == "extend_timeout"][-1]
        assert extended == svc.sup.options.ready_timeout_s + RELOAD_MARGIN_S
        await wait_for(
            lambda: any("2/2" in str(v) for k, v in notifier.calls if k == "status"),
            10,
            "STATUS 2/2",
        )
    finally:
        await svc.stop()
    assert notifier.kinds()[-1] == "stopping" and notifier.kinds().count("ready") == 2


async def test_a_failed_reload_answers_after_ready() -> None:
    notifier = RecordingNotifier()
    bad = {"on": False}

    def planner() -> ServicePlan:
        plan = fake_plan(1)
        if bad["on"]:  # a second worker that is still loading when its ready timeout ends
            spec = fake_spec("primary", 1, env={"FAKE_READY_DELAY_S": "60"})
            plan.deployments["primary"].replicas.append(spec)
        return plan

    svc = await start_service(planner, notifier=notifier, ready_timeout_s=2.0)
    try:
        pid = svc.sup.replicas["primary-0"].pid
        bad["on"] = True
        with pytest.raises(VllmSrError, match=r"new workers not ready within 2 s: \['primary-1'\]"):
            await svc.sup.submit(Command("reload"))
        kinds = notifier.kinds()  # as they were when the answer came
        at = kinds.index("reloading")
        assert kinds[at : at + 3] == ["reloading", "extend_timeout", "ready"]
        assert svc.sup.generation == 0 and svc.sup.replicas["primary-0"].pid == pid
        assert "primary-1" not in svc.sup.replicas
    finally:
        await svc.stop()
