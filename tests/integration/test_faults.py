"""Nothing lost, nothing hung (issue 13), on real processes and sockets: two or three stand-in
workers (tests/integration/test_supervisor_fake.py) under steady load while a worker is killed
with SIGKILL, hangs with a healthy /health, or is retired by a scale-down, a reload or a stop.
Every answer is checked against its deadline."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import aiohttp
import pytest

from tests.integration.test_ejection import Load
from tests.integration.test_supervisor_fake import (
    Service,
    fake_plan,
    replica_doc,
    start_service,
    wait_for,
)
from vllm_sr import events as ev
from vllm_sr.control.commands import Command

pytestmark = pytest.mark.slow

TIMEOUT_MS = 2000


def failures(load: Load) -> dict[int, int]:
    out: dict[int, int] = {}
    for _, _, status, _ in load.results:
        if status != 200:
            out[status] = out.get(status, 0) + 1
    return out


def late(load: Load, deadline_s: float) -> int:
    return sum(1 for t0, t1, _, _ in load.results if t1 - t0 > deadline_s + 0.5)


async def loaded(replicas: int, **kw: object) -> tuple[Service, Load]:
    plan = fake_plan(replicas, timeout_ms=TIMEOUT_MS, **kw)  # type: ignore[arg-type]
    svc = await start_service(lambda: plan, stop_grace_s=1.0, backoff_initial_s=0.2)
    load = Load(svc.url, tasks=8)
    load.start()
    await wait_for(lambda: len(load.results) > 50, 20, "load running")
    return svc, load


async def test_kill_9_under_load_loses_nothing() -> None:
    svc, load = await loaded(2)
    try:
        for _ in range(2):
            pid = svc.sup.replicas["primary-1"].pid
            assert pid is not None
            n = len(load.results)
            os.kill(pid, signal.SIGKILL)
            await wait_for(
                lambda p=pid: svc.sup.replicas["primary-1"].pid not in (None, p), 20, "restart"
            )
            await wait_for(lambda: replica_doc(svc.sup, "primary-1")["ready"], 20, "ready again")
            await wait_for(lambda n=n: len(load.results) > n + 100, 20, "load went on")
        await load.stop()
        print(f"\n[kill -9 x2] {len(load.results)} requests, failures {failures(load)}")
        assert failures(load) == {} and late(load, TIMEOUT_MS / 1000) == 0
        inv = replica_doc(svc.sup, "primary-1")
        assert inv["restarts"] == 2 and inv["restart_reason"] == "killed by signal 9"
        async with aiohttp.ClientSession() as s, s.get(f"{svc.url}/metrics") as r:
            text = await r.text()
        retried = [ln for ln in text.splitlines() if ln.startswith("vllm_sr_pool_retries_total")]
        assert retried and float(retried[0].split()[-1]) >= 1, retried
    finally:
        await svc.stop()


async def test_a_retried_answer_says_so() -> None:
    plan = fake_plan(2, timeout_ms=10_000, env={"VLLM_SR_ENABLE_FAULTS": "1"})
    svc = await start_service(lambda: plan)
    try:
        pool = svc.sup.pools["primary"]
        victim = svc.sup.replicas["primary-0"]
        assert (await victim.client.set_faults(5000)).status == 200  # it holds what it gets
        held = pool.acquire(10_000_000, "primary-1")  # primary-0 is the pick
        async with aiohttp.ClientSession() as s:
            call = asyncio.ensure_future(s.post(f"{svc.url}/v1/embeddings", json={"input": "x"}))
            await wait_for(lambda: replica_doc(svc.sup, "primary-0")["inflight"] == 1, 5, "sent")
            pool.release(held, "success")
            assert victim.pid is not None
            os.kill(victim.pid, signal.SIGKILL)  # mid-request: the connection breaks
            r = await asyncio.wait_for(call, 10)
            assert r.status == 200
            assert r.headers["X-Vsr-Retried"] == "1; from=primary-0"
            assert (await r.json())["replica"] == "primary-1"
    finally:
        await svc.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_hung_forward_with_a_healthy_health_is_restarted() -> None:
    plan = fake_plan(2, timeout_ms=500, env={"VLLM_SR_ENABLE_FAULTS": "1"})
    for dep in plan.deployments.values():
        dep.settings = dep.settings.model_copy(update={"hang_after_ms": 1500})
    svc = await start_service(lambda: plan, stop_grace_s=1.0, backoff_initial_s=0.2)
    try:
        rep = svc.sup.replicas["primary-1"]
        pid = rep.pid
        assert (await rep.client.set_faults(600_000)).status == 200
        t_hang = time.monotonic()
        async with aiohttp.ClientSession() as s:
            # Nudge one exchange onto it (the other replica holds a heavy lease).
            held = svc.sup.pools["primary"].acquire(10_000_000, "primary-0")
            call = asyncio.ensure_future(s.post(f"{svc.url}/v1/embeddings", json={"input": "x"}))
            await wait_for(lambda: replica_doc(svc.sup, "primary-1")["inflight"] == 1, 5, "sent")
            svc.sup.pools["primary"].release(held, "success")
            await wait_for(lambda: rep.pid not in (None, pid), 20, "restarted", svc.sup.inventory)
            t_restart = time.monotonic()
            await wait_for(lambda: replica_doc(svc.sup, "primary-1")["ready"], 20, "ready again")
            resp = await call
            assert resp.status == 504  # its own deadline (500 ms) ran out long before
        print(f"\n[hung forward] hang -> restart {1000 * (t_restart - t_hang):.0f} ms")
        assert t_restart - t_hang < 20
        hung = [e for e in svc.sup.events.since(0) if e.event == ev.REPLICA_HUNG]
        assert hung and hung[0].fields["replica"] == "primary-1"
        assert replica_doc(svc.sup, "primary-1")["restart_reason"].startswith("hung: forward")
    finally:
        await svc.stop()


async def test_scale_down_and_reload_under_load_lose_nothing() -> None:
    plans = [fake_plan(3, timeout_ms=TIMEOUT_MS, env={"VLLM_SR_FAULT_FORWARD_DELAY_MS": "50"})]
    svc = await start_service(lambda: plans[-1], stop_grace_s=1.0)
    load = Load(svc.url, tasks=8)
    load.start()
    try:
        await wait_for(lambda: len(load.results) > 50, 20, "load running")
        for n in (1, 3, 2):
            plans.append(
                fake_plan(n, timeout_ms=TIMEOUT_MS, env={"VLLM_SR_FAULT_FORWARD_DELAY_MS": "50"})
            )
            mark = len(load.results)
            await asyncio.wait_for(svc.sup.submit(Command("reload", source="test")), 30)
            await wait_for(lambda m=mark: len(load.results) > m + 50, 20, "load went on")
        await wait_for(lambda: len(svc.sup.pools["primary"].replicas()) == 2, 20, "retired gone")
        await load.stop()
        print(f"\n[scale 3->1->3->2] {len(load.results)} requests, failures {failures(load)}")
        assert failures(load) == {} and late(load, TIMEOUT_MS / 1000) == 0
    finally:
        await svc.stop()


async def test_sigterm_stop_stops_admitting_first_and_finishes_what_is_in_flight() -> None:
    plan = fake_plan(2, timeout_ms=5000, env={"VLLM_SR_FAULT_FORWARD_DELAY_MS": "800"})
    svc = await start_service(lambda: plan, stop_grace_s=1.0)
    try:
        async with aiohttp.ClientSession() as s:
            calls = [
                asyncio.ensure_future(s.post(f"{svc.url}/v1/embeddings", json={"input": str(i)}))
                for i in range(6)
            ]
            await wait_for(
                lambda: sum(r.inflight for r in svc.sup.pools["primary"].replicas()) == 6,
                10,
                "in flight",
            )
            svc.sup.queue.put_nowait(Command("stop", source="signal:SIGTERM"))
            await wait_for(lambda: not svc.sup.admitting, 5, "admission off")
            async with s.post(f"{svc.url}/v1/embeddings", json={"input": "late"}) as r:
                assert r.status == 503  # refused at once, never half-served
            statuses = [(await c).status for c in calls]
        assert statuses == [200] * 6
    finally:
        await svc.stop()
