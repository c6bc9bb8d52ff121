"""The supervisor's handlers (reload, scale, drain, restart, stop, hang detection) on a fake
clock, with an injected ``spawn`` that makes in-memory replicas instead of processes: the real
ReplicaPool, EventBus, Fleet and Reconfiguration, no child process and no socket."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.test_supervisor_fake import spec_of
from tests.support.workers import short_socket_dir
from vllm_sr import events as ev
from vllm_sr.clock import FakeClock
from vllm_sr.control.commands import Command
from vllm_sr.errors import VllmSrError
from vllm_sr.plan import DeploymentPlan, ReplicaSpec, ReplicaState, ServicePlan
from vllm_sr.pool.client import WorkerResponse
from vllm_sr.pool.exchange import exchange
from vllm_sr.pool.settings import PoolSettings
from vllm_sr.supervisor.managed import ProcessOptions
from vllm_sr.supervisor.supervisor import Supervisor

PIDS = itertools.count(1000)


class GatedClient:
    """Answers when the test opens the gate (so exchanges can be held in flight)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()

    async def post(self, *a: Any, **k: Any) -> WorkerResponse:
        await self.gate.wait()
        return WorkerResponse(200, b"{}", "application/json", {})


class MemoryReplica:
    """What the supervisor needs of a ManagedReplica, in memory: it is ready on start unless
    the spec says ``fail``; ``restart`` and ``kill_hung`` start a new life at once."""

    def __init__(self, spec: ReplicaSpec, hooks: Any) -> None:
        self.spec, self.id, self.hooks = spec, spec.id, hooks
        self.client = GatedClient()
        self.served_model: str | None = None
        self.socket_path = f"/nowhere/{spec.id}"
        self.health: dict[str, Any] = {"threads": 1}
        self.limits: dict[str, Any] | None = {"max_num_seqs": int(spec.env.get("seqs", 64))}
        if spec.env.get("revision"):
            self.health["revision"] = spec.env["revision"]
        self.pid: int | None = None
        self.state, self.last_error = ReplicaState.STARTING, None
        self.restarts, self.lives = 0, 0
        self.record: Any = None
        self.process = None
        self.ready, self.settled = asyncio.Event(), asyncio.Event()
        self.stopped = False
        self.hung_reasons: list[str] = []
        self.result_cache_bytes = 0

    def start(self) -> None:
        if self.spec.env.get("hold"):
            self.release = asyncio.Event()
            self.task = asyncio.ensure_future(self._held())
            return
        self._life(restarted=False)

    async def _held(self) -> None:
        self.pid, self.lives = next(PIDS), self.lives + 1
        self.hooks.on_starting(self, False)
        await self.release.wait()
        self.state = ReplicaState.READY
        self.ready.set()
        self.settled.set()
        self.hooks.on_ready(self)

    def _life(self, restarted: bool) -> None:
        self.pid, self.lives = next(PIDS), self.lives + 1
        self.hooks.on_starting(self, restarted)
        if self.spec.env.get("fail"):
            self.state, self.last_error = ReplicaState.FAILED, "exit 78: bad artifact"
            self.settled.set()
            self.hooks.on_failed(self, self.last_error)
            return
        self.state = ReplicaState.READY
        self.ready.set()
        self.settled.set()
        self.hooks.on_ready(self)

    async def wait_settled(self) -> None:
        await self.settled.wait()

    async def wait_new_life(self, after: int) -> None:
        while self.lives <= after:
            await asyncio.sleep(0)

    async def restart(self) -> None:
        self.restarts += 1
        self.hooks.on_exited(self, -15, "restarted on request (exit -15)")
        self._life(restarted=True)

    def mark_hung(self, reason: str) -> bool:
        if self.state is not ReplicaState.READY:
            return False
        self.state, self.last_error = ReplicaState.HUNG, reason
        return True

    async def kill_hung(self, reason: str) -> None:
        self.hung_reasons.append(reason)
        self.restarts += 1
        self.hooks.on_exited(self, -15, reason)
        self._life(restarted=True)

    def retire(self) -> None:
        pass

    async def resize_result_cache(self, max_bytes: int) -> bool:
        self.result_cache_bytes = max_bytes
        self.health = {**self.health, "result_cache_bytes": max_bytes}
        return True

    lapse = False  # a test sets it: the life loop has ended while the replica is planned

    def lapsed(self) -> bool:
        return self.lapse

    def revive(self) -> None:
        self.lapse = False
        self.restarts += 1
        self._life(restarted=True)

    async def stop(self, grace_s: float | None = None) -> None:
        self.stopped, self.pid = True, None

    def kill_now(self) -> None:
        self.stopped = True


def plan_of(n: int, **kw: Any) -> ServicePlan:
    specs = [spec_of(f"primary-{i}", "primary", i, **kw) for i in range(n)]
    dep = DeploymentPlan("primary", "fake/artifact", specs, settings=PoolSettings(timeout_ms=1000))
    return ServicePlan({"primary": dep}, "primary")


class Harness:
    def __init__(self, plans: list[ServicePlan], router_builder: Any = None) -> None:
        self.plans = plans
        self.clock = FakeClock()
        self.spawned: list[MemoryReplica] = []
        self.sup = Supervisor(
            self.planner,
            runtime_dir=str(short_socket_dir(prefix="vsr-handlers-")),
            options=ProcessOptions(ready_timeout_s=5.0, stop_grace_s=1.0),
            clock=self.clock,
            drain_timeout_s=5.0,
            spawn=self.spawn,
            router_builder=router_builder,
        )
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.sup.events.add_sink(lambda e: self.events.append((e.event, e.fields)))

    def planner(self) -> ServicePlan:
        return self.plans[0] if len(self.plans) == 1 else self.plans.pop(0)

    def spawn(self, spec: Any) -> Any:
        rep = MemoryReplica(spec, self.sup.hooks)
        self.spawned.append(rep)
        return rep

    def of(self, name: str) -> list[dict[str, Any]]:
        return [f for n, f in self.events if n == name]

    async def command(self, kind: str, **kw: Any) -> dict[str, Any]:
        return await asyncio.wait_for(self.sup.submit(Command(kind, **kw)), 10)  # type: ignore[arg-type]


def serve(
    plans: list[ServicePlan], body: Callable[[Harness], Any], router_builder: Any = None
) -> None:
    async def main() -> None:
        h = Harness(plans, router_builder)
        if router_builder is not None:
            router_builder.sup = h.sup
        await h.sup.start()
        loop = asyncio.ensure_future(h.sup.run())
        try:
            await body(h)
        finally:
            if not h.sup.stopping:
                await h.command("stop")
            await asyncio.wait_for(loop, 10)

    asyncio.run(main())


def test_reload_keeps_unchanged_workers_and_starts_only_the_new() -> None:
    async def body(h: Harness) -> None:
        first = dict(h.sup.replicas)
        h.plans[:] = [plan_of(3)]
        result = await h.command("reload")
        assert (result["kept"], result["started"]) == (["primary-0", "primary-1"], ["primary-2"])
        assert all(h.sup.replicas[rid] is rep for rid, rep in first.items())
        assert h.sup.generation == 1 and len(h.spawned) == 3
        assert h.sup.inventory()["deployments"][0]["ready_replicas"] == 3

    serve([plan_of(2)], body)


class RecordingBuilder:
    """Router mode's builder as the supervisor sees it (vllm_sr/supervisor/router_build.py):
    records each call with the generation the directory had published at that moment."""

    def __init__(self) -> None:
        self.sup: Supervisor | None = None
        self.calls: list[tuple[str, int]] = []
        self.fail_build = False

    def _generation(self) -> int:
        assert self.sup is not None
        return self.sup.directory.generation

    async def build(self, plan: Any) -> str:
        self.calls.append(("build", self._generation()))
        await asyncio.sleep(0)  # a build awaits (backends, the replay store's connect)
        if self.fail_build:
            raise RuntimeError("redis said no")
        return f"router-{len(self.calls)}"

    def swap(self, staged: str) -> str:
        self.calls.append((f"swap {staged}", self._generation()))
        return f"retired-by-{staged}"

    async def retire(self, retired: str) -> None:
        self.calls.append((retired, self._generation()))

    async def discard(self, staged: str) -> None:
        self.calls.append((f"discard {staged}", self._generation()))


def test_the_router_is_built_before_the_publish_and_swapped_in_the_same_step() -> None:
    builder = RecordingBuilder()

    async def body(h: Harness) -> None:
        # at start: built and swapped before any chat can arrive; nothing to retire
        assert builder.calls == [("build", 0), ("swap router-1", 0)]
        h.plans[:] = [plan_of(3)]
        await h.command("reload")
        await until(lambda: len(builder.calls) == 5)
        # built while generation 0 served; swapped once generation 1 was published (the
        # swap runs in the publish's own step: no chat sees one without the other)
        assert builder.calls[2:] == [
            ("build", 0),
            ("swap router-3", 1),
            ("retired-by-router-3", 1),
        ]

    serve([plan_of(2)], body, builder)


def test_a_router_that_cannot_be_built_fails_the_reload() -> None:
    builder = RecordingBuilder()

    async def body(h: Harness) -> None:
        builder.fail_build = True
        h.plans[:] = [plan_of(3)]
        with pytest.raises(VllmSrError, match="Router mode could not be built: RuntimeError"):
            await h.command("reload")
        assert h.sup.generation == 0 and h.spawned[2].stopped  # the staged worker stopped
        assert [c for c, _ in builder.calls] == ["build", "swap router-1", "build"]
        assert "redis said no" in h.of(ev.RELOAD_FAILED)[0]["reason"]

    serve([plan_of(2)], body, builder)


def test_a_new_worker_that_fails_leaves_the_running_generation_untouched() -> None:
    async def body(h: Harness) -> None:
        h.plans[:] = [plan_of(2, env={"fail": "1"}, threads=2)]  # a new identity: all replaced
        with pytest.raises(VllmSrError, match="failed"):
            await h.command("reload")
        assert h.sup.generation == 0 and [r.stopped for r in h.spawned[:2]] == [False, False]
        assert all(r.stopped for r in h.spawned[2:])  # the staged ones were stopped
        assert h.of(ev.RELOAD_FAILED)

    serve([plan_of(2)], body)


def test_a_reload_whose_new_workers_report_other_limits_is_refused_before_publishing() -> None:
    async def body(h: Harness) -> None:
        new = plan_of(3, env={"seqs": "32"}, threads=2)  # every worker replaced
        new.deployments["primary"].settings = PoolSettings(configured_max_num_seqs=64)
        h.plans[:] = [new]
        with pytest.raises(VllmSrError, match="max_num_seqs is 32, config sets 64"):
            await h.command("reload")
        assert h.sup.generation == 0 and len(h.sup.replicas) == 2
        assert all(not r.stopped for r in h.spawned[:2]) and all(r.stopped for r in h.spawned[2:])
        assert "primary-0" in h.of(ev.RELOAD_FAILED)[0]["reason"]

    serve([plan_of(2)], body)


def test_a_new_worker_of_another_revision_than_the_kept_ones_is_refused() -> None:
    async def body(h: Harness) -> None:
        h.plans[:] = [plan_of(3, env={"revision": "sha256:abc"})]
        h.plans[0].deployments["primary"].replicas[2].env["revision"] = "sha256:def"
        with pytest.raises(VllmSrError, match="revision sha256:def differs from primary-0"):
            await h.command("reload")
        assert h.sup.generation == 0

    serve([plan_of(2, env={"revision": "sha256:abc"})], body)


def test_scale_down_retires_a_worker_only_after_its_exchange_finishes() -> None:
    async def body(h: Harness) -> None:
        pool = h.sup.pools["primary"]
        victim = h.sup.replicas["primary-1"]
        victim.client.gate.clear()
        held = pool.acquire(1_000_000, "primary-0")  # the pick rule now prefers primary-1
        call = asyncio.ensure_future(exchange(pool, "/v1/embeddings", b"{}"))
        await until(lambda: victim.record.inflight == 1)
        pool.release(held, "success")
        h.plans[:] = [plan_of(1)]
        await h.command("reload")
        assert pool.replica("primary-1").state.value == "draining"
        for _ in range(20):
            await asyncio.sleep(0)
        assert not victim.stopped  # still finishing what it has
        victim.client.gate.set()
        assert (await call).status == 200
        await until(lambda: victim.stopped)
        await until(lambda: "primary-1" not in pool)

    serve([plan_of(2)], body)


def test_restart_answers_with_the_new_pid() -> None:
    async def body(h: Harness) -> None:
        old = h.sup.replicas["primary-0"].pid
        result = await h.command("restart", replica="primary-0")
        assert result["old_pid"] == old and result["pid"] not in (None, old)
        assert h.of(ev.REPLICA_RESTARTED)[0]["replica"] == "primary-0"

    serve([plan_of(1)], body)


def test_drain_takes_the_replica_out_of_dispatch_with_the_control_reason() -> None:
    async def body(h: Harness) -> None:
        result = await h.command("drain", replica="primary-1")
        assert result == {"ok": True, "replica": "primary-1", "inflight": 0}
        assert h.of(ev.REPLICA_DRAINING)[-1]["reason"] == "control"
        pool = h.sup.pools["primary"]
        leases = [pool.acquire(0) for _ in range(3)]
        assert {lease.replica_id for lease in leases} == {"primary-0"}
        for lease in leases:
            pool.release(lease, "success")

    serve([plan_of(2)], body)


def test_a_forward_running_past_the_hang_bound_restarts_the_worker() -> None:
    async def body(h: Harness) -> None:
        rep = h.sup.replicas["primary-0"]
        bound = h.sup.pools["primary"].settings.hang_bound_s
        assert bound == 10.0  # max(3 x 1000 ms, 10 s)
        h.sup.hooks.on_health(rep, {"forward_running": True, "forward_running_s": bound - 0.1})
        assert not rep.hung_reasons
        h.sup.hooks.on_health(rep, {"forward_running": True, "forward_running_s": bound + 0.5})
        await until(lambda: rep.hung_reasons)
        hung = h.of(ev.REPLICA_HUNG)
        assert hung[0]["replica"] == "primary-0" and hung[0]["bound_s"] == bound
        doc = h.sup.inventory()["deployments"][0]["replicas"][0]
        assert doc["restart_reason"].startswith("hung: forward running 10.5 s")
        assert doc["restarts"] == 1 and doc["state"] == "ready"

    serve([plan_of(2)], body)


def test_a_hung_worker_leaves_dispatch_at_once_and_is_reported_once() -> None:
    """Both records say hung before the kill has run (no await in between), each written by
    its owner: the worker by ``mark_hung``, the pool's record by the pool's ``mark_hung``."""

    async def body(h: Harness) -> None:
        rep, pool = h.sup.replicas["primary-0"], h.sup.pools["primary"]
        doc: dict[str, object] = {"forward_running_s": pool.settings.hang_bound_s + 0.5}
        h.sup.hooks.on_health(rep, doc)
        h.sup.hooks.on_health(rep, doc)  # the next /health read, before the kill: not again
        assert rep.state is ReplicaState.HUNG
        assert pool.replica("primary-0").state is ReplicaState.HUNG
        leases = [pool.acquire(0) for _ in range(3)]
        assert {lease.replica_id for lease in leases} == {"primary-1"}
        for lease in leases:
            pool.release(lease, "success")
        assert len(h.of(ev.REPLICA_HUNG)) == 1
        await until(lambda: rep.hung_reasons)
        assert len(rep.hung_reasons) == 1
        await until(lambda: pool.replica("primary-0").state is ReplicaState.READY)

    serve([plan_of(2)], body)


async def test_router_views_come_through_the_constructor() -> None:
    """The inventory's ``router`` and the replay records are the injected views' own; with
    none (Engine mode, tests) the inventory has no ``router`` and replay is empty."""

    class Views:
        def __init__(self) -> None:
            self.asked: list[tuple[str | None, int, str | None]] = []

        def inventory(self) -> dict[str, object] | None:
            return {"backends": [], "stats": {"decisions": []}}

        async def replay(
            self,
            decision: str | None = None,
            since: int = 0,
            recipe: str | None = None,
            session: str | None = None,
        ) -> dict[str, object]:
            self.asked.append((decision, since, recipe))
            return {"records": [{"seq": 4}], "last_seq": 4, "decisions": ["coding"]}

    views = Views()
    runtime = str(short_socket_dir(prefix="vsr-views-"))
    sup = Supervisor(lambda: plan_of(1), runtime_dir=runtime, router=views)
    assert sup.inventory()["router"] == {"backends": [], "stats": {"decisions": []}}
    assert (await sup.replay("coding", 3))["last_seq"] == 4
    assert views.asked == [("coding", 3, None)]
    bare = Supervisor(lambda: plan_of(1), runtime_dir=runtime)
    assert "router" not in bare.inventory()
    assert await bare.replay() == {"records": [], "last_seq": 0, "decisions": []}


def test_the_usage_sampler_reports_through_the_pool() -> None:
    async def body(h: Harness) -> None:
        rep = h.sup.replicas["primary-0"]
        h.sup.hooks.on_usage(rep, {"cpu_percent": 50.0, "rss_bytes": 4096, "gpu": None})
        doc = h.sup.inventory()["deployments"][0]["replicas"][0]
        assert doc["usage"] == {"cpu_percent": 50.0, "rss_bytes": 4096, "gpu": None}

    serve([plan_of(1)], body)


def test_the_reconcile_pass_revives_a_lapsed_life_loop_and_replaces_a_missing_worker() -> None:
    async def body(h: Harness) -> None:
        rep = h.sup.replicas["primary-1"]
        rep.lapse = True
        h.sup._wake.set()  # as the lapse's report does
        await until(lambda: not rep.lapse and rep.restarts == 1)
        assert h.of(ev.REPLICA_RESTARTED)[-1]["replica"] == "primary-1"
        # A planned id with no worker (only a bug could do it): a new worker is spawned.
        gone = h.sup.fleet.replicas.pop("primary-0")
        h.sup.fleet.published.discard("primary-0")
        h.sup.pools["primary"].remove_replica("primary-0")
        h.sup._wake.set()
        await until(lambda: "primary-0" in h.sup.replicas)
        assert h.sup.replicas["primary-0"] is not gone
        await until(lambda: h.sup.pools["primary"].replica("primary-0").serving)

    serve([plan_of(2)], body)


def test_the_hang_bound_is_a_deployment_field_with_a_derived_default() -> None:
    assert PoolSettings(timeout_ms=2000).hang_bound_s == 10.0
    assert PoolSettings(timeout_ms=8000).hang_bound_s == 24.0
    assert PoolSettings(timeout_ms=8000, hang_after_ms=5000).hang_bound_s == 5.0


def test_the_learners_report_reaches_the_inventory() -> None:
    async def body(h: Harness) -> None:
        rep = h.sup.replicas["primary-0"]
        report = {"mode": 1, "state": "exploring", "buckets": []}
        h.sup.hooks.on_health(rep, {"adaptive_threads": report, "forward_running_s": 0.0})
        doc = h.sup.inventory()["deployments"][0]["replicas"][0]
        assert doc["adaptive_threads"] == report

    serve([plan_of(1)], body)


def test_stop_drains_in_flight_exchanges_before_stopping_workers() -> None:
    async def body(h: Harness) -> None:
        pool = h.sup.pools["primary"]
        rep = h.sup.replicas["primary-0"]
        rep.client.gate.clear()
        call = asyncio.ensure_future(exchange(pool, "/v1/embeddings", b"{}"))
        await until(lambda: rep.record.inflight == 1)
        await h.command("stop")
        assert not h.sup.admitting
        for _ in range(20):
            await asyncio.sleep(0)
        assert not rep.stopped
        rep.client.gate.set()
        assert (await call).status == 200
        await until(lambda: rep.stopped)

    serve([plan_of(1)], body)


async def until(cond: Callable[[], Any], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.001)


def test_workers_sharing_a_gpu_start_one_after_another() -> None:
    specs = [
        spec_of("primary-0", "primary", 0, device="rocm:0", env={"hold": "1"}),
        spec_of("primary-1", "primary", 1, device="rocm:0", env={"hold": "1"}),
        spec_of("primary-2", "primary", 2, device="rocm:1", env={"hold": "1"}),
    ]
    plan = ServicePlan(
        {"primary": DeploymentPlan("primary", "a", specs, PoolSettings())}, "primary"
    )

    async def body(h: Harness) -> None:
        r0, r1, r2 = (h.sup.replicas[f"primary-{i}"] for i in range(3))
        await until(lambda: r0.state == "starting" and r2.state == "starting")
        for _ in range(20):
            await asyncio.sleep(0)
        assert not hasattr(r1, "release")  # not started: rocm:0 is calibrating for primary-0
        r0.release.set()
        await until(lambda: hasattr(r1, "release"))  # now it starts
        r1.release.set()
        r2.release.set()
        await until(lambda: all(r.state == "ready" for r in (r0, r1, r2)))

    serve([plan], body)


def test_a_control_reload_during_the_watchs_reload_runs_after_it() -> None:
    held = plan_of(3, env={"hold": "1"}, threads=2)  # every worker replaced, held starting

    async def body(h: Harness) -> None:
        h.plans[:] = [held, plan_of(3, env={"hold": "1"}, threads=2)]
        watch = asyncio.ensure_future(h.command("reload", source="watch"))
        await until(lambda: len(h.spawned) == 5)  # the watch's reload is staging
        control = asyncio.ensure_future(h.command("reload", source="control"))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not control.done()  # waits instead of "a reload is already in progress"
        for rep in h.spawned[2:]:
            rep.release.set()
        assert (await watch)["generation"] == 1
        await until(lambda: len(h.spawned) == 5 and h.sup.reconfiguration.source == "control")
        result = await control  # ran after it, on the plan as it was then: nothing to start
        assert result["generation"] == 2 and result["started"] == []
        # Two reloads asked for by hand still refuse each other.
        h.plans[:] = [plan_of(4, env={"hold": "1"}, threads=2)]
        first = asyncio.ensure_future(h.command("reload"))
        await until(lambda: len(h.spawned) == 6)
        with pytest.raises(VllmSrError, match="already in progress"):
            await h.command("reload")
        h.spawned[5].release.set()
        await first

    serve([plan_of(2)], body)
