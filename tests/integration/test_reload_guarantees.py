"""What a reconfiguration promises, on real processes and real sockets with the stand-in worker
(tests/integration/test_supervisor_fake.py), each asserted so that it fails when the promise
breaks (issue 39 item 3):

- a new worker that reports other limits than config sets is kept out before publishing, and
  the old generation serves on;
- workers that share one GPU start one after another (at start and in a reload);
- a retired worker drains: what it has in flight is answered by it, not by a retry elsewhere
  (the pool retries a worker that drops a connection, which would hide a killed one).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import psutil
import pytest

from tests.integration.test_supervisor_fake import (
    Service,
    fake_plan,
    fake_spec,
    start_service,
    wait_for,
)
from vllm_sr import events as ev
from vllm_sr.control.commands import Command
from vllm_sr.errors import VllmSrError
from vllm_sr.plan import DeploymentPlan, ReplicaSpec, ServicePlan
from vllm_sr.pool.settings import PoolSettings

pytestmark = pytest.mark.slow

RETRIED = "X-Vsr-Retried"


async def embed(session: aiohttp.ClientSession, url: str, text: str) -> dict[str, Any]:
    """One request: its status, the replica whose worker answered, and whether it was retried."""
    async with session.post(f"{url}/v1/embeddings", json={"input": text}) as resp:
        body = await resp.json()
        return {
            "status": resp.status,
            "replica": body.get("replica"),
            "retried": RETRIED in resp.headers,
        }


def plan_of(specs: list[ReplicaSpec], **settings: Any) -> ServicePlan:
    dep = DeploymentPlan(
        "primary", "fake/artifact", specs, settings=PoolSettings(timeout_ms=5000, **settings)
    )
    return ServicePlan({"primary": dep}, "primary", {"replicas": len(specs)})


def events_of(svc: Service, name: str, replica: str) -> list[ev.Event]:
    return [
        e for e in svc.sup.events.since(0) if e.event == name and e.fields["replica"] == replica
    ]


def seq_of(svc: Service, name: str, replica: str) -> int:
    found = events_of(svc, name, replica)
    assert found, f"no {name} event for {replica}"
    return found[0].seq


# ------------------------------------------------------------------------- compatibility


async def test_a_new_worker_reporting_other_limits_is_kept_out_and_the_old_serves_on() -> None:
    """The compatibility check runs before the reload is published: primary-1 reports
    max_num_seqs 32 where config sets 64, so the reload is refused, primary-1 never serves and
    its process is stopped, and primary-0 answers every request before, during and after."""
    wanted = {"n": 1}
    other = json.dumps({"max_num_seqs": 32, "max_num_batched_tokens": 8192})

    def planner() -> ServicePlan:
        specs = [fake_spec("primary", 0, max_num_seqs=64)]
        if wanted["n"] == 2:
            specs.append(fake_spec("primary", 1, max_num_seqs=64, env={"FAKE_LIMITS": other}))
        return plan_of(specs, configured_max_num_seqs=64)

    svc = await start_service(planner)
    answers: list[dict[str, Any]] = []
    stop = asyncio.Event()

    async def load() -> None:
        async with aiohttp.ClientSession() as s:
            while not stop.is_set():
                answers.append(await embed(s, svc.url, "during"))

    loaders = [asyncio.ensure_future(load()) for _ in range(3)]
    try:
        await wait_for(lambda: len(answers) > 10, 10, "load running")
        wanted["n"] = 2
        with pytest.raises(VllmSrError) as exc:
            await svc.sup.submit(Command("reload"))
        assert "new worker primary-1 is incompatible" in exc.value.message
        assert "max_num_seqs is 32, config sets 64" in exc.value.message
        failed = [e for e in svc.sup.events.since(0) if e.event == ev.RELOAD_FAILED]
        assert failed and "primary-1" in failed[0].fields["reason"]
        # It did start (the check is on what it reported once ready), and it was stopped.
        staged_pid = events_of(svc, ev.REPLICA_STARTING, "primary-1")[0].fields["pid"]
        await wait_for(lambda: not psutil.pid_exists(staged_pid), 20, "staged worker stopped")
        mark = len(answers)
        await wait_for(lambda: len(answers) > mark + 10, 10, "load after the refused reload")
        stop.set()
        await asyncio.gather(*loaders)
        assert svc.sup.generation == 0
        (dep,) = svc.sup.inventory()["deployments"]
        assert [r["id"] for r in dep["replicas"]] == ["primary-0"]
        assert (dep["desired_replicas"], dep["ready_replicas"]) == (1, 1)
        assert {a["status"] for a in answers} == {200}
        assert {a["replica"] for a in answers} == {"primary-0"}
    finally:
        stop.set()
        await asyncio.gather(*loaders, return_exceptions=True)
        await svc.stop()


# ------------------------------------------------------------------------- one GPU, in turn


async def test_workers_sharing_a_gpu_start_one_after_another() -> None:
    """primary-1 shares rocm:0 with primary-0: its process starts only once primary-0 is ready;
    primary-2 on rocm:1 does not wait. A reload adding two workers on rocm:1 starts them in
    turn too."""
    wanted = {"n": 3}
    devices = ["rocm:0", "rocm:0", "rocm:1", "rocm:1", "rocm:1"]
    slow = {"FAKE_READY_DELAY_S": "0.6"}

    def planner() -> ServicePlan:
        specs = [
            fake_spec("primary", i, device=devices[i], threads=None, env=dict(slow))
            for i in range(wanted["n"])
        ]
        return plan_of(specs)

    svc = await start_service(planner)
    try:
        assert seq_of(svc, ev.REPLICA_READY, "primary-0") < seq_of(
            svc, ev.REPLICA_STARTING, "primary-1"
        )
        assert seq_of(svc, ev.REPLICA_STARTING, "primary-2") < seq_of(
            svc, ev.REPLICA_READY, "primary-0"
        )
        wanted["n"] = 5
        result = await svc.sup.submit(Command("reload"))
        assert result["started"] == ["primary-3", "primary-4"]
        # primary-2 (kept, ready) holds nothing back; the two new ones go in turn.
        assert seq_of(svc, ev.REPLICA_READY, "primary-3") < seq_of(
            svc, ev.REPLICA_STARTING, "primary-4"
        )
    finally:
        await svc.stop()


# ------------------------------------------------------------------------- drain


async def test_a_retired_worker_answers_what_it_has_in_flight_itself() -> None:
    """Scale 2 -> 1 while primary-1 has slow requests in flight: each is answered by
    primary-1's own worker, none retried, no retry counted; then primary-1 stops."""
    wanted = {"n": 2}
    delay = {"VLLM_SR_FAULT_FORWARD_DELAY_MS": "1500"}
    svc = await start_service(lambda: fake_plan(wanted["n"], env=dict(delay), timeout_ms=10000))
    try:
        pool = svc.sup.pools["primary"]
        victim_pid = svc.sup.replicas["primary-1"].pid
        async with aiohttp.ClientSession() as s:
            calls = [asyncio.ensure_future(embed(s, svc.url, f"slow {i}")) for i in range(6)]
            await wait_for(
                lambda: sum(r.inflight for r in pool.replicas()) == 6, 10, "all six in flight"
            )
            on_victim = pool.replica("primary-1").inflight
            assert on_victim >= 2  # the pick rule spreads them
            wanted["n"] = 1
            result = await svc.sup.submit(Command("reload"))
            assert result["retired"] == ["primary-1"]
            assert pool.replica("primary-1").state.value == "draining"
            answers = await asyncio.gather(*calls)
        assert [a["status"] for a in answers] == [200] * 6
        assert not [a for a in answers if a["retried"]]
        assert sum(1 for a in answers if a["replica"] == "primary-1") == on_victim
        assert pool.retries == 0
        await wait_for(lambda: not psutil.pid_exists(victim_pid or -1), 20, "primary-1 stopped")
        # the process can be gone a moment before the supervisor has reaped it and said so
        await wait_for(
            lambda: bool(events_of(svc, ev.REPLICA_STOPPED, "primary-1")), 20, "replica_stopped"
        )
        stopped = events_of(svc, ev.REPLICA_STOPPED, "primary-1")
        assert stopped[0].fields["pid"] == victim_pid
    finally:
        await svc.stop()
