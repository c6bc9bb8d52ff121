"""Reconfiguration: SIGHUP / ``POST /v1/reload`` / scale.

Re-plan from config; keep every worker whose id and identity are unchanged (same process);
start the new workers outside the published pools and wait until each is ready; then, in one
step on the loop (no await), publish: new replicas join dispatch, retired ones are marked
draining. Retired workers finish what they have and stop. A config that does not load or plan,
or a new worker that never gets ready, leaves the running generation untouched and says why
(``reload_failed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vllm_sr import events as ev
from vllm_sr.errors import Conflict, InvalidRequest, VllmSrError
from vllm_sr.control.commands import Command
from vllm_sr.supervisor.reload import ServicePlan, diff_plans

if TYPE_CHECKING:
    from vllm_sr.supervisor.managed import ManagedReplica
    from vllm_sr.supervisor.supervisor import Supervisor

log = logging.getLogger("vllm_sr.supervisor")

Scaler = Callable[[str, int], None]


async def reload(self: Supervisor, cmd: Command) -> dict[str, Any] | None:
    self._check_not_stopping()
    if self._reload_task is not None and not self._reload_task.done():
        raise Conflict("a reload is already in progress")
    try:
        plan = self.planner()
    except Exception as exc:
        reason = exc.message if isinstance(exc, VllmSrError) else f"{type(exc).__name__}: {exc}"
        reason = str(exc) if hasattr(exc, "problems") else reason
        log.error("reload refused, the running generation keeps serving: %s", reason)
        self.events.publish(ev.RELOAD_FAILED, reason=reason, source=cmd.source)
        if isinstance(exc, VllmSrError):
            raise
        raise InvalidRequest(f"reload failed: {reason}") from exc
    self._reload_task = self._task(_reload(self, plan, cmd), "reload")
    return None  # _reload resolves cmd.done once the new generation is published


async def scale(self: Supervisor, cmd: Command) -> dict[str, Any] | None:
    self._check_not_stopping()
    if self.scaler is None:
        raise Conflict("scaling needs a config file to write (serve was started without one)")
    if cmd.deployment is None or cmd.replicas is None or cmd.replicas < 0:
        raise InvalidRequest(
            f"scale needs a deployment and replicas >= 0, got {cmd.deployment!r}, {cmd.replicas!r}"
        )
    self.scaler(cmd.deployment, cmd.replicas)
    return await reload(self, cmd)


def cancel_reload(self: Supervisor) -> None:
    if self._reload_task is not None and not self._reload_task.done():
        self._reload_task.cancel()


async def _reload(self: Supervisor, plan: ServicePlan, cmd: Command) -> None:
    self.notifier.reloading()
    running = {rid: self.replicas[rid].spec for rid in self.published}
    diff = diff_plans(running, plan.specs())
    staged = [self._spawn(spec) for spec in diff.start]
    for rep in staged:
        self._staged[id(rep)] = rep
        rep.start()
    published = False
    try:
        await _wait_staged_ready(self, staged)
        retiring = _publish(self, plan, staged, diff.retire)
        published = True
    except VllmSrError as exc:
        log.error("reload failed, the running generation keeps serving: %s", exc.message)
        self.events.publish(ev.RELOAD_FAILED, reason=exc.message, source=cmd.source)
        _resolve(cmd, exc=exc)
        return
    finally:
        for rep in staged:
            self._staged.pop(id(rep), None)
            if not published:
                await rep.stop(1.0)
        self.notifier.ready(self._last_status or None)
    kept = [s.id for s in diff.keep]
    _resolve(
        cmd,
        result={
            "ok": True,
            "generation": self.generation,
            "kept": kept,
            "started": [s.id for s in diff.start],
            "retired": diff.retire,
        },
    )
    await asyncio.gather(*(_retire(self, rep) for rep in retiring), return_exceptions=True)


def _resolve(
    cmd: Command, *, result: dict[str, Any] | None = None, exc: Exception | None = None
) -> None:
    if cmd.done is None or cmd.done.done():
        return
    if exc is not None:
        cmd.done.set_exception(exc)
    else:
        cmd.done.set_result(result or {"ok": True})


async def _wait_staged_ready(self: Supervisor, staged: list[ManagedReplica]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + self.options.ready_timeout_s
    while True:
        failed = [r for r in staged if r.state == "failed"]
        if failed:
            raise VllmSrError(
                f"new worker {failed[0].id} failed: {failed[0].last_error}",
                replica=failed[0].id,
            )
        if all(r.ready.is_set() for r in staged):
            return
        if loop.time() >= deadline:
            late = [r.id for r in staged if not r.ready.is_set()]
            raise VllmSrError(
                f"new workers not ready within {self.options.ready_timeout_s:.0f} s: {late}"
            )
        await asyncio.sleep(0.05)


def _publish(
    self: Supervisor, plan: ServicePlan, staged: list[ManagedReplica], retire: list[str]
) -> list[ManagedReplica]:
    """Swap generations in one step (no await): returns the workers to drain and stop."""
    from vllm_sr.supervisor.supervisor import pool_settings

    retiring: list[ManagedReplica] = []
    for rid in retire:
        old = self.replicas.pop(rid)
        self.published.discard(rid)
        pool = self.pools.get(old.spec.deployment)
        replaced = any(r.id == rid for r in staged)
        if pool is not None and rid in pool:
            if replaced:
                pool.remove_replica(rid)  # its successor takes the id; the old drains aside
            else:
                pool.mark_draining(rid)
        old.retired_from = pool if (pool is not None and not replaced) else None
        retiring.append(old)
        self.events.publish(ev.REPLICA_DRAINING, **self._who(old), pid=old.pid, reason="reload")
    for name, dep in plan.deployments.items():
        pool = self.pools.get(name)
        if pool is None:
            self.pools[name] = self._new_pool(dep)
        else:
            # Settings are plain attributes of the pool; a new generation swaps them whole.
            pool.settings = pool_settings(dep)
            pool.policy = pool.settings.policy()
            pool.desired_replicas = len(dep.replicas)
    for rep in staged:
        self.replicas[rep.id] = rep
        self.published.add(rep.id)
        pool = self.pools[rep.spec.deployment]
        rep.record = pool.add_replica(rep.id, str(rep.spec.device), pid=rep.pid)
        pool.set_restarts(rep.id, rep.restarts)
        pool.mark_ready(rep.id, rep.pid, rep.limits, rep.health.get("threads"))
    for rid in plan.specs():
        self.replicas[rid.id].spec = rid  # kept workers take the new spec (same identity)
    self.plan = plan
    self.place_self()
    self.generation += 1
    self.events.publish(
        ev.POOL_PUBLISHED, generation=self.generation, deployments=list(plan.deployments)
    )
    return retiring


async def _retire(self: Supervisor, rep: ManagedReplica) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + self.drain_timeout_s
    while rep.active > 0 and loop.time() < deadline and not self._quick.is_set():
        await asyncio.sleep(0.05)
    pid = rep.pid
    await rep.stop()
    pool = getattr(rep, "retired_from", None)
    if pool is not None and rep.id in pool and rep.id not in self.published:
        pool.remove_replica(rep.id)
    self.events.publish(ev.REPLICA_STOPPED, **self._who(rep), pid=pid)
    # A deployment that left the plan goes once its last worker has.
    for name in list(self.pools):
        if (
            self.plan is not None
            and name not in self.plan.deployments
            and len(self.pools[name]) == 0
        ):
            del self.pools[name]


async def stop_staged(self: Supervisor) -> None:
    for rep in list(self._staged.values()):
        with contextlib.suppress(Exception):
            await rep.stop(1.0)
