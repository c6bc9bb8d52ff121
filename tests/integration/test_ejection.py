"""Outlier ejection on real processes and sockets (issue 5): three workers under steady load;
one made to hang (fault knob: its /health still answers; or SIGSTOP: nothing answers) is
ejected after ``consecutive_timeouts`` timeouts while the others take its traffic; with the
knob on every replica none is ejected; once the hang ends the replica is readmitted.

The stand-in worker (test_supervisor_fake) is used so that the timings measured are the
pool's and the frontend's, not a loaded machine's model forwards. Each test prints the time
from hang to ejection and the share of requests that failed meanwhile."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass, field

import aiohttp
import pytest

from tests.integration.test_supervisor_fake import (
    Service,
    fake_plan,
    replica_doc,
    start_service,
    wait_for,
)
from vllm_sr import events as ev

pytestmark = pytest.mark.slow

OUTLIER = {"consecutive_timeouts": 3, "base_ejection_ms": 2000, "max_ejection_percent": 50}
TIMEOUT_MS = 300


@dataclass
class Load:
    """Steady load: ``tasks`` loops of one request each; records (start, end, status, replica)."""

    url: str
    tasks: int = 6
    results: list[tuple[float, float, int, str]] = field(default_factory=list)

    def start(self) -> None:
        self._stop = asyncio.Event()
        self._go = asyncio.Event()
        self._go.set()
        self.inflight = 0
        self._running = [asyncio.ensure_future(self._loop()) for _ in range(self.tasks)]

    async def pause(self) -> None:
        """No new requests; returns once none is in flight."""
        self._go.clear()
        await wait_for(lambda: self.inflight == 0, 20, "load paused")

    def resume(self) -> None:
        self._go.set()

    async def _loop(self) -> None:
        async with aiohttp.ClientSession() as s:
            while not self._stop.is_set():
                await self._go.wait()
                t0 = time.monotonic()
                self.inflight += 1
                try:
                    async with s.post(f"{self.url}/v1/embeddings", json={"input": "steady"}) as r:
                        doc = await r.json()
                finally:
                    self.inflight -= 1
                replica = doc.get("replica", "") if r.status == 200 else ""
                self.results.append((t0, time.monotonic(), r.status, replica))

    async def stop(self) -> None:
        self._stop.set()
        self._go.set()
        await asyncio.gather(*self._running)

    def between(self, t0: float, t1: float) -> list[tuple[float, float, int, str]]:
        return [r for r in self.results if r[0] >= t0 and r[0] <= t1]


def event_time(svc: Service, name: str, replica: str, after_seq: int = 0) -> float | None:
    for e in svc.sup.events.since(after_seq):
        if e.event == name and e.fields.get("replica") == replica:
            return e.time
    return None


async def three_workers() -> tuple[Service, Load]:
    plan = fake_plan(3, timeout_ms=TIMEOUT_MS, outlier=OUTLIER, env={"VLLM_SR_ENABLE_FAULTS": "1"})
    svc = await start_service(lambda: plan, stop_grace_s=1.0)
    load = Load(svc.url)
    load.start()
    await wait_for(lambda: len(load.results) > 30, 20, "load running")
    return svc, load


def report(label: str, load: Load, t_hang: float, t_eject: float) -> tuple[float, float]:
    window = load.between(t_hang, t_eject)
    failed = sum(1 for r in window if r[2] != 200)
    share = failed / len(window) if window else 0.0
    print(
        f"\n[{label}] hang -> ejection {1000 * (t_eject - t_hang):.0f} ms; "
        f"{failed}/{len(window)} requests failed meanwhile ({100 * share:.1f}%)"
    )
    return t_eject - t_hang, share


async def test_hung_forward_is_ejected_others_serve_and_it_comes_back() -> None:
    svc, load = await three_workers()
    try:
        hung = svc.sup.replicas["primary-1"]
        seq = svc.sup.events.last_seq
        wall0, t_hang = time.time(), time.monotonic()
        assert (await hung.client.set_faults(60_000)).status == 200
        await wait_for(
            lambda: event_time(svc, ev.REPLICA_EJECTED, "primary-1", seq), 20, "ejection"
        )
        t_eject = t_hang + (event_time(svc, ev.REPLICA_EJECTED, "primary-1", seq) or 0) - wall0
        doc = replica_doc(svc.sup, "primary-1")
        assert doc["state"] == "ejected" and doc["ejections"] == 1 and doc["ejected_until"]
        assert doc["consecutive_timeouts"] >= OUTLIER["consecutive_timeouts"]
        elapsed, share = report("fault knob", load, t_hang, t_eject)
        assert elapsed < 10 and share < 0.5
        # While it is out the others take every request, and nothing fails.
        mark = time.monotonic()
        await asyncio.sleep(0.5)
        after = load.between(mark, mark + 0.4)
        assert after and all(r[2] == 200 and r[3] != "primary-1" for r in after)
        # The hang ends: the cool-down returns it and its next answer keeps it.
        assert (await hung.client.set_faults(0)).status == 200
        await wait_for(
            lambda: event_time(svc, ev.REPLICA_READMITTED, "primary-1", seq), 10, "readmission"
        )
        await wait_for(
            lambda: any(r[3] == "primary-1" for r in load.results[-50:]), 10, "serving again"
        )
        assert replica_doc(svc.sup, "primary-1")["state"] == "ready"
    finally:
        await load.stop()
        await svc.stop()


async def test_sigstopped_worker_is_ejected_then_readmitted() -> None:
    svc, load = await three_workers()
    pid = svc.sup.replicas["primary-2"].pid
    assert pid is not None
    try:
        seq = svc.sup.events.last_seq
        wall0, t_hang = time.time(), time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        await wait_for(
            lambda: event_time(svc, ev.REPLICA_EJECTED, "primary-2", seq), 20, "ejection"
        )
        t_eject = t_hang + (event_time(svc, ev.REPLICA_EJECTED, "primary-2", seq) or 0) - wall0
        elapsed, share = report("SIGSTOP", load, t_hang, t_eject)
        assert elapsed < 10 and share < 0.5
        assert replica_doc(svc.sup, "primary-2")["state"] == "ejected"
        os.kill(pid, signal.SIGCONT)
        await wait_for(
            lambda: any(r[3] == "primary-2" for r in load.results[-50:]), 20, "serving again"
        )
        assert replica_doc(svc.sup, "primary-2")["pid"] == pid  # same process, not restarted
    finally:
        os.kill(pid, signal.SIGCONT)
        await load.stop()
        await svc.stop()


async def test_slow_everywhere_ejects_nobody() -> None:
    svc, load = await three_workers()
    try:
        # Hang all three before any request can see one of them hang and another answer.
        await load.pause()
        seq = svc.sup.events.last_seq
        for rep in svc.sup.replicas.values():
            assert (await rep.client.set_faults(60_000)).status == 200
        load.resume()
        await wait_for(
            lambda: sum(e.event == ev.REPLICA_EJECTION_WITHHELD for e in svc.sup.events.since(seq)),
            20,
            "an ejection withheld",
        )
        mark = time.monotonic()
        await wait_for(lambda: len(load.between(mark, time.monotonic())) > 20, 20, "more timeouts")
        assert not [e for e in svc.sup.events.since(seq) if e.event == ev.REPLICA_EJECTED]
        rules = {
            e.fields["rule"]
            for e in svc.sup.events.since(seq)
            if e.event == ev.REPLICA_EJECTION_WITHHELD
        }
        assert rules == {"no_other_replica_answered"}
        assert all(replica_doc(svc.sup, f"primary-{i}")["ejections"] == 0 for i in range(3))
    finally:
        for rep in svc.sup.replicas.values():
            await rep.client.set_faults(0)
        await load.stop()
        await svc.stop()


async def test_stopped_worker_out_by_failed_probe_and_back_after_sigcont() -> None:
    # With a threshold it cannot reach before its /health probe fails, a SIGSTOPped worker
    # leaves dispatch as unhealthy rather than ejected, and the supervisor's re-probe brings it
    # back once it runs again.
    outlier = {**OUTLIER, "consecutive_timeouts": 50}
    plan = fake_plan(3, timeout_ms=TIMEOUT_MS, outlier=outlier)
    svc = await start_service(lambda: plan, stop_grace_s=1.0)
    load = Load(svc.url)
    load.start()
    pid = svc.sup.replicas["primary-0"].pid
    assert pid is not None
    try:
        await wait_for(lambda: len(load.results) > 30, 20, "load running")
        os.kill(pid, signal.SIGSTOP)
        await wait_for(lambda: not replica_doc(svc.sup, "primary-0")["ready"], 20, "out")
        mark = time.monotonic()
        await asyncio.sleep(0.5)
        after = load.between(mark, mark + 0.4)
        assert after and all(r[2] == 200 and r[3] != "primary-0" for r in after)
        os.kill(pid, signal.SIGCONT)
        await wait_for(lambda: replica_doc(svc.sup, "primary-0")["ready"], 20, "healthy again")
        await wait_for(lambda: any(r[3] == "primary-0" for r in load.results[-50:]), 20, "serving")
        assert replica_doc(svc.sup, "primary-0")["ejections"] == 0
    finally:
        os.kill(pid, signal.SIGCONT)
        await load.stop()
        await svc.stop()
