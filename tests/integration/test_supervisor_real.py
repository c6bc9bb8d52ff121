"""The supervisor and frontend with real `vllm-sr worker` processes (a tiny random BERT): a worker
killed mid-request, and admission with every forward held by the fault knob."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.test_supervisor_fake import fake_plan, replica_doc, start_service, wait_for

pytestmark = pytest.mark.slow

WORKER_ARGV = [sys.executable, "-m", "vllm_sr.cli", "worker"]


async def post(
    s: aiohttp.ClientSession, url: str, body: Any
) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with s.post(url, json=body) as resp:
        return resp.status, await resp.json(), dict(resp.headers)


async def test_real_worker_killed_mid_request(tiny_bert_dir: Path) -> None:
    plan = fake_plan(1, artifact=str(tiny_bert_dir), env={"VLLM_SR_ENABLE_FAULTS": "1"})
    svc = await start_service(lambda: plan, worker_argv=WORKER_ARGV)
    try:
        rep = svc.sup.replicas["primary-0"]
        old_pid = rep.pid
        assert old_pid is not None
        async with aiohttp.ClientSession() as s:
            status, doc, _ = await post(s, f"{svc.url}/v1/embeddings", {"input": "hello"})
            assert status == 200 and len(doc["data"][0]["embedding"]) == 32
            assert (await rep.client.set_faults(5_000)).status == 200
            call = asyncio.ensure_future(post(s, f"{svc.url}/v1/embeddings", {"input": "held"}))
            await wait_for(
                lambda: replica_doc(svc.sup, "primary-0")["inflight"] == 1, 10, "in flight"
            )
            os.kill(old_pid, signal.SIGKILL)
            status, doc, _ = await asyncio.wait_for(call, 10)
        assert status == 502 and doc["error"]["code"] == "worker_failed"
        after = replica_doc(svc.sup, "primary-0")
        assert after["inflight"] == 0 and after["outstanding_bytes"] == 0
        await wait_for(
            lambda: (
                replica_doc(svc.sup, "primary-0")["pid"] not in (None, old_pid)
                and replica_doc(svc.sup, "primary-0")["ready"]
            ),
            90,
            "the worker back with a new pid",
        )
        assert replica_doc(svc.sup, "primary-0")["restarts"] == 1
    finally:
        await svc.stop()


async def test_real_workers_full_refuse_exactly_k(tiny_bert_dir: Path) -> None:
    env = {"VLLM_SR_ENABLE_FAULTS": "1"}
    plan = fake_plan(2, artifact=str(tiny_bert_dir), env=env, timeout_ms=60_000)
    svc = await start_service(lambda: plan, worker_argv=WORKER_ARGV)
    k = 3
    try:
        for rep in svc.sup.replicas.values():  # hold every forward (after the golden check)
            assert (await rep.client.set_faults(5_000)).status == 200
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
            held = [
                asyncio.ensure_future(
                    post(s, f"{svc.url}/v1/embeddings", {"input": f"row {i:02d}"})
                )
                for i in range(2 * 32)
            ]
            await wait_for(
                lambda: (
                    [r["inflight"] for r in svc.sup.inventory()["deployments"][0]["replicas"]]
                    == [32, 32]
                ),  # same-size bodies: the pick rule fills both
                30,
                "both workers full",
                lambda: (svc.sup.inventory(), [f.result() for f in held if f.done()][:3]),
            )
            extra = await asyncio.gather(
                *(post(s, f"{svc.url}/v1/embeddings", {"input": "x"}) for _ in range(k))
            )
            done = await asyncio.gather(*held)
        assert [e[0] for e in extra] == [429] * k
        assert all(e[2].get("Retry-After") for e in extra)
        assert [d[0] for d in done] == [200] * 64
    finally:
        await svc.stop()


async def test_real_worker_whose_forward_hangs_is_restarted_and_comes_back(
    tiny_bert_dir: Path,
) -> None:
    """The hang is seen from the worker's own /health (forward_running_s), not guessed."""
    import time

    from vllm_sr import events as ev

    plan = fake_plan(2, artifact=str(tiny_bert_dir), env={"VLLM_SR_ENABLE_FAULTS": "1"})
    for dep in plan.deployments.values():
        dep.settings = dep.settings.model_copy(update={"timeout_ms": 500, "hang_after_ms": 2000})
    svc = await start_service(lambda: plan, worker_argv=WORKER_ARGV, backoff_initial_s=0.2)
    try:
        rep = svc.sup.replicas["primary-1"]
        pid = rep.pid
        assert (await rep.client.set_faults(600_000)).status == 200
        pool = svc.sup.pools["primary"]
        held = pool.acquire(10_000_000, "primary-0")  # primary-1 is the pick
        async with aiohttp.ClientSession() as s:
            t_hang = time.monotonic()
            status, _, _ = await post(s, f"{svc.url}/v1/embeddings", {"input": "hang"})
            assert status == 504
            pool.release(held, "success")
            await wait_for(lambda: rep.pid not in (None, pid), 30, "restarted", svc.sup.inventory)
            assert time.monotonic() - t_hang < 20
            await wait_for(lambda: replica_doc(svc.sup, "primary-1")["ready"], 120, "ready")
            status, doc, _ = await post(s, f"{svc.url}/v1/embeddings", {"input": "after"})
            assert status == 200 and len(doc["data"][0]["embedding"]) == 32
        names = [e.event for e in svc.sup.events.since(0) if e.fields.get("replica") == "primary-1"]
        assert ev.REPLICA_HUNG in names
        assert replica_doc(svc.sup, "primary-1")["restart_reason"].startswith("hung: ")
    finally:
        await svc.stop()
