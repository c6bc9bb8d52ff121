"""The supervisor's workers and the pools they serve in: which worker holds each replica id,
which ids are published, each deployment's pool, and the directory the frontend resolves
against. The supervisor and a reconfiguration both work on one ``Fleet``; a new generation is
swapped in by ``publish`` in one step (no await)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from vllm_sr import events as ev
from vllm_sr.clock import Clock
from vllm_sr.events import Emit
from vllm_sr.jsontypes import json_int, json_object, json_str
from vllm_sr.plan import DeploymentPlan, ReplicaSpec, ReplicaState, ServicePlan
from vllm_sr.pool.directory import PoolDirectory
from vllm_sr.pool.pool import ReplicaPool
from vllm_sr.pool.result_caches import cache_sizes
from vllm_sr.supervisor.managed import ManagedReplica

Spawn = Callable[[ReplicaSpec], ManagedReplica]


class Fleet:
    def __init__(
        self,
        clock: Clock,
        emit: Emit,
        on_wake: Callable[[], None] | None = None,
        directory: PoolDirectory | None = None,
    ) -> None:
        self.clock = clock
        self.emit = emit
        self.on_wake = on_wake
        self.plan: ServicePlan | None = None
        self.pools: dict[str, ReplicaPool] = {}  # every pool, retiring deployments' too
        self.replicas: dict[str, ManagedReplica] = {}  # the live worker of each published id
        self.published: set[str] = set()
        self.staged: list[ManagedReplica] = []  # a reload's new workers, not yet published
        self.retiring: list[ManagedReplica] = []  # retired workers still draining
        self.directory = directory if directory is not None else PoolDirectory()
        self.generation = 0

    # ------------------------------------------------------------------ lookups
    def pool_of(self, rep: ManagedReplica) -> ReplicaPool | None:
        """The pool ``rep`` serves in, while it is the published worker of its id."""
        if rep.id not in self.published or self.replicas.get(rep.id) is not rep:
            return None
        return self.pools.get(rep.spec.deployment)

    def workers(self) -> list[ManagedReplica]:
        return [*self.replicas.values(), *self.staged, *self.retiring]

    def busy(self) -> int:
        return sum(r.inflight for p in self.pools.values() for r in p.replicas())

    # ------------------------------------------------------------------ building
    def new_pool(self, dep: DeploymentPlan) -> ReplicaPool:
        pool = ReplicaPool(
            dep.name,
            settings=dep.settings,
            clock=self.clock,
            emit=self.emit,
            artifact=dep.artifact,
            desired_replicas=len(dep.replicas),
        )
        pool.outliers.on_wake = self.on_wake
        return pool

    def join(self, rep: ManagedReplica, pool: ReplicaPool) -> None:
        """Publish ``rep`` under its id in ``pool`` (with the client exchanges go through)."""
        where = rep.spec.device or rep.spec.endpoint
        self.replicas[rep.id] = rep
        self.published.add(rep.id)
        rep.record = pool.add_replica(
            rep.id, str(where), pid=rep.pid, client=rep.client, served_model=rep.served_model
        )
        pool.set_restarts(rep.id, rep.restarts)

    def first(self, plan: ServicePlan, workers: list[ManagedReplica]) -> None:
        """The first generation: pools for every deployment, every worker joined."""
        self.plan = plan
        for dep in plan.deployments.values():
            self.pools[dep.name] = self.new_pool(dep)
        for rep in workers:
            self.join(rep, self.pools[rep.spec.deployment])
        self._publish_directory()

    def publish(
        self, plan: ServicePlan, staged: list[ManagedReplica], retire: list[str]
    ) -> list[ManagedReplica]:
        """Swap generations in one step (no await): returns the workers to drain and stop."""
        retiring: list[ManagedReplica] = []
        for rid in retire:
            old = self.replicas.pop(rid)
            self.published.discard(rid)
            pool = self.pools.get(old.spec.deployment)
            if pool is not None and rid in pool:
                if any(r.id == rid for r in staged):
                    pool.remove_replica(rid)  # its successor takes the id; the old drains aside
                else:
                    pool.mark_draining(rid)
            retiring.append(old)
            self.emit(ev.REPLICA_DRAINING, **who(old), pid=old.pid, reason="reload")
        for name, dep in plan.deployments.items():
            pool = self.pools.get(name)
            if pool is None:
                self.pools[name] = self.new_pool(dep)
            else:
                pool.apply_settings(dep.settings, len(dep.replicas))
        for rep in staged:
            pool = self.pools[rep.spec.deployment]
            self.join(rep, pool)
            mark_ready(pool, rep)
        for spec in plan.specs():
            self.replicas[spec.id].spec = spec  # kept workers take the new spec (same identity)
        self.plan = plan
        self.generation += 1
        self._publish_directory()
        self.emit(ev.POOL_PUBLISHED, generation=self.generation, deployments=list(plan.deployments))
        return retiring

    def reconcile(self, spawn: Spawn, cache_bytes: int = 0) -> list[tuple[str, ManagedReplica]]:
        """gunicorn's ``manage_workers``: compare the plan's replicas with the supervised
        ones and repair a difference. A planned id with no worker gets a new one (joined and
        started); a worker whose life loop has ended while it is still planned is revived
        (through its backoff). Returns what was done, as (``"spawned"``/``"revived"``, rep)."""
        done: list[tuple[str, ManagedReplica]] = []
        if self.plan is None:
            return done
        for spec in self.plan.specs():
            rep = self.replicas.get(spec.id)
            pool = self.pools.get(spec.deployment)
            if rep is None and pool is not None and spec.id not in pool:
                rep = spawn(spec)
                self.join(rep, pool)
                size_caches([rep], self.plan, cache_bytes)
                rep.start()
                done.append(("spawned", rep))
            elif rep is not None and rep.lapsed():
                rep.revive()
                done.append(("revived", rep))
        return done

    def forget(self, rep: ManagedReplica) -> None:
        """A retired worker has stopped: drop its record, and a deployment that left the plan
        once its last worker has."""
        pool = self.pools.get(rep.spec.deployment)
        mine = pool is not None and rep.id in pool and pool.replica(rep.id) is rep.record
        if pool is not None and mine and rep.id not in self.published:
            pool.remove_replica(rep.id)
        planned = self.plan.deployments if self.plan is not None else {}
        for name in list(self.pools):
            if name not in planned and len(self.pools[name]) == 0:
                del self.pools[name]

    def _publish_directory(self) -> None:
        assert self.plan is not None
        default = self.plan.default_deployment
        aliases = {}
        dep = self.plan.deployments.get(default)
        if dep is not None:
            aliases[dep.artifact] = default  # the default deployment's artifact name
        for name, d in self.plan.deployments.items():
            if d.public_name:  # v0.4's public_name: the name clients use in "model"
                aliases[d.public_name] = name
        published = {n: p for n, p in self.pools.items() if n in self.plan.deployments}
        self.directory.publish(published, default, aliases, self.generation)


def worker_cache_bytes(plan: ServicePlan, deployment: str, cache_bytes: int) -> int:
    """The page: "Single-worker deployments retain the frontend result cache; multiple replicas
    use independent worker caches" (vllm_sr.pool.result_caches): each worker's bound."""
    dep = plan.deployments.get(deployment)
    replicas = len(dep.replicas) if dep is not None else 0
    return cache_sizes(replicas, worker_bytes=cache_bytes).worker_bytes


def size_caches(workers: list[ManagedReplica], plan: ServicePlan, cache_bytes: int) -> None:
    """Workers about to start get the result cache their deployment's replica count calls
    for."""
    for rep in workers:
        rep.result_cache_bytes = worker_cache_bytes(plan, rep.spec.deployment, cache_bytes)


async def resize_caches(fleet: Fleet, cache_bytes: int) -> list[str]:
    """After a publish: every published worker whose result cache its deployment's new
    replica count no longer calls for is told its new bound, and keeps its process (1 -> 2:
    each replica gets a cache; 2 -> 1: the one left drops it, the frontend's is back). Returns
    the ids that did not take it (they serve on, with the old bound)."""
    assert fleet.plan is not None
    plan = fleet.plan
    changes = [
        (rep, want)
        for rid, rep in list(fleet.replicas.items())
        if rid in fleet.published
        and (want := worker_cache_bytes(plan, rep.spec.deployment, cache_bytes))
        != rep.result_cache_bytes
    ]
    taken = await asyncio.gather(*(rep.resize_result_cache(want) for rep, want in changes))
    for rep, _ in changes:
        pool = fleet.pool_of(rep)
        if pool is not None and rep.health:
            pool.set_result_cache_bytes(rep.id, rep.health.get("result_cache_bytes"))
    return [rep.id for (rep, _), ok in zip(changes, taken, strict=True) if not ok]


def start_in_order(
    workers: list[ManagedReplica], busy: list[ManagedReplica]
) -> list[asyncio.Future[None]]:
    """Start ``workers``; those placed on the same GPU one after another. Each GPU worker
    calibrates its token budget from the device's free memory at startup, so two starting
    together on one card would both count the same free memory. ``busy`` are workers already
    starting (a reload's kept ones): a new one on their GPU waits for them too. Returns the
    tasks that hold back later starts (the caller keeps them alive)."""
    chains: dict[str, list[ManagedReplica]] = {}
    for rep in busy:
        if _gpu(rep) is not None and rep.state is ReplicaState.STARTING:
            chains.setdefault(_gpu(rep) or "", []).append(rep)
    tasks: list[asyncio.Future[None]] = []
    for rep in workers:
        gpu = _gpu(rep)
        if gpu is None or not chains.get(gpu):
            rep.start()
        else:
            before = list(chains[gpu])
            tasks.append(asyncio.ensure_future(_start_after(rep, before)))
        if gpu is not None:
            chains.setdefault(gpu, []).append(rep)
    return tasks


async def _start_after(rep: ManagedReplica, before: list[ManagedReplica]) -> None:
    for other in before:
        await other.wait_settled()
    rep.start()


def _gpu(rep: ManagedReplica) -> str | None:
    device = rep.spec.device or "cpu"
    return None if device == "cpu" or rep.spec.endpoint else device


def who(rep: ManagedReplica) -> dict[str, str]:
    return {"deployment": rep.spec.deployment, "replica": rep.id, "device": str(rep.spec.device)}


def mark_ready(pool: ReplicaPool, rep: ManagedReplica) -> bool:
    """Tell the pool what the worker's /health reported on getting ready."""
    h = rep.health
    ok = pool.mark_ready(
        rep.id,
        rep.pid,
        rep.limits,
        json_int(h.get("threads")),
        revision=json_str(h.get("revision")),
        capabilities=json_object(h.get("capabilities")),
    )
    pool.set_adaptive_threads(rep.id, h.get("adaptive_threads"))
    pool.set_result_cache_bytes(rep.id, h.get("result_cache_bytes"))
    return ok
