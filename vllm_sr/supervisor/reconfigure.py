"""Reconfiguration: SIGHUP / ``POST /v1/reload`` / scale.

Re-plan from config (in a thread: planning may run rocm-smi); keep every worker whose id and
identity are unchanged (same process); start the new workers outside the published pools and
wait until each is ready; build the new generation's router (supervisor/router_build.py);
then, in one step on the loop (no await), publish: new replicas join dispatch, retired ones are
marked draining, the new router takes the chats that arrive from then on. Retired workers
finish what they have in flight (up to the drain timeout) and stop; the old router's resources
close once its chats in flight have finished. A config that does not load or plan, a new
worker that never gets ready, or a router that cannot be built leaves the running generation
untouched and says why (``reload_failed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from vllm_sr import events as ev
from vllm_sr.control.commands import Command
from vllm_sr.errors import Conflict, InvalidRequest, VllmSrError
from vllm_sr.events import EventBus
from vllm_sr.jsontypes import JsonObject, json_object, json_str
from vllm_sr.plan import ReplicaState, ServicePlan
from vllm_sr.pool import compat
from vllm_sr.supervisor.fleet import (
    Fleet,
    Spawn,
    resize_caches,
    size_caches,
    start_in_order,
    who,
)
from vllm_sr.supervisor.managed import ManagedReplica
from vllm_sr.supervisor.reload import diff_plans
from vllm_sr.supervisor.router_build import RouterBuilder, build_router

log = logging.getLogger("vllm_sr.supervisor")

Scaler = Callable[[str, int], None]
Planner = Callable[[], ServicePlan]


class Notifier(Protocol):
    def reloading(self) -> None: ...
    def extend_timeout(self, seconds: float) -> None: ...
    def ready(self, status: str | None = None) -> None: ...


# What a reload may take beyond the new workers' ready timeout once they are started (the
# compatibility check, publishing, stopping the staged workers of a failed reload).
RELOAD_MARGIN_S = 30.0


def resolve(
    cmd: Command, *, result: JsonObject | None = None, exc: Exception | None = None
) -> None:
    if cmd.done is None or cmd.done.done():
        return
    if exc is not None:
        cmd.done.set_exception(exc)
    else:
        cmd.done.set_result(result or {"ok": True})


async def wait_idle(rep: ManagedReplica, timeout_s: float, quick: asyncio.Event) -> None:
    """Until nothing is in flight on ``rep``'s pool record, the timeout, or a quick stop."""
    record = rep.record
    if record is None or record.inflight == 0:
        return
    idle = asyncio.Event()
    record.idle_waiters.append(idle.set)
    waits = {asyncio.ensure_future(idle.wait()), asyncio.ensure_future(quick.wait())}
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


class Reconfiguration:
    """One reload at a time: plan, stage, publish, retire."""

    def __init__(
        self,
        fleet: Fleet,
        planner: Planner,
        spawn: Spawn,
        *,
        events: EventBus,
        notifier: Notifier,
        ready_timeout_s: float,
        drain_timeout_s: float,
        quick: asyncio.Event,
        status: Callable[[], str | None],
        on_published: Callable[[], None] = lambda: None,
        router: RouterBuilder | None = None,
    ) -> None:
        self.fleet = fleet
        self.planner = planner
        self.spawn = spawn
        self.events = events
        self.notifier = notifier
        self.ready_timeout_s = ready_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.quick = quick
        self.status = status
        self.on_published = on_published
        self.router = router
        self.scaler: Scaler | None = None
        self.task: asyncio.Task[None] | None = None
        self.source: str | None = None  # who asked for the reload in progress
        self.retiring_tasks: set[asyncio.Task[None]] = set()
        self.starts: list[asyncio.Future[None]] = []
        self.cache_bytes = 0  # each worker's result cache (new and kept) with several replicas

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    async def reload(self, cmd: Command) -> None:
        """Start a reload; ``cmd.done`` resolves once the new generation is published."""
        if self.running:
            raise Conflict("a reload is already in progress")
        try:
            plan = await asyncio.to_thread(self.planner)
        except Exception as exc:
            self._refused(exc, cmd)
        self.task = asyncio.create_task(self._run(plan, cmd), name="reload")
        self.source = cmd.source

    async def scale(self, cmd: Command) -> None:
        if self.scaler is None:
            raise Conflict("scaling needs a config file to write (serve was started without one)")
        if cmd.deployment is None or cmd.replicas is None or cmd.replicas < 0:
            raise InvalidRequest(
                f"scale needs a deployment and replicas >= 0, got {cmd.deployment!r}, "
                f"{cmd.replicas!r}"
            )
        self.scaler(cmd.deployment, cmd.replicas)
        await self.reload(cmd)

    def cancel(self) -> None:
        """A stop: the reload in progress ends here, and drains of retired workers too (the
        stop drains and stops every worker itself)."""
        if self.running:
            assert self.task is not None
            self.task.cancel()
        for task in list(self.retiring_tasks):
            task.cancel()

    def _refused(self, exc: Exception, cmd: Command) -> None:
        reason = exc.message if isinstance(exc, VllmSrError) else f"{type(exc).__name__}: {exc}"
        reason = str(exc) if hasattr(exc, "problems") else reason
        # Each problem names its place (config.yaml:LINE: path) and what is accepted there.
        problems = list(getattr(exc, "problems", None) or [reason])
        log.error("reload refused, the running generation keeps serving: %s", reason)
        self.events.publish(ev.RELOAD_FAILED, reason=reason, source=cmd.source, problems=problems)
        if isinstance(exc, VllmSrError):
            raise exc
        raise InvalidRequest(f"reload failed: {reason}") from exc

    async def _run(self, plan: ServicePlan, cmd: Command) -> None:
        fleet = self.fleet
        self.notifier.reloading()
        # systemd times a reload with TimeoutStartSec= (and kills the reload command when it
        # runs out); new workers may take up to the ready timeout, as at start.
        self.notifier.extend_timeout(self.ready_timeout_s + RELOAD_MARGIN_S)
        running = {rid: fleet.replicas[rid].spec for rid in fleet.published}
        diff = diff_plans(running, plan.specs())
        staged = [self.spawn(spec) for spec in diff.start]
        fleet.staged.extend(staged)
        size_caches(staged, plan, self.cache_bytes)
        self.starts = start_in_order(staged, list(fleet.replicas.values()))
        published = False
        failure: VllmSrError | None = None
        router = self.router
        staged_router = retired_router = None
        try:
            await self._wait_ready(staged)
            self._check_compatible(plan, staged, diff.retire)
            if router is not None:
                staged_router = await build_router(router, plan.router)
            # One step, no await: the pools and the router of the new generation together.
            retiring = fleet.publish(plan, staged, diff.retire)
            if router is not None and staged_router is not None:
                retired_router = router.swap(staged_router)
            published = True
            self.on_published()
            # Kept workers' caches follow the new replica count, in the same process.
            missed = await resize_caches(fleet, self.cache_bytes)
            if missed:
                log.warning("result cache not resized on %s (see above)", ", ".join(missed))
        except VllmSrError as exc:
            log.error("reload failed, the running generation keeps serving: %s", exc.message)
            self.events.publish(
                ev.RELOAD_FAILED, reason=exc.message, source=cmd.source, problems=[exc.message]
            )
            failure = exc
        finally:
            for rep in staged:
                with contextlib.suppress(ValueError):
                    fleet.staged.remove(rep)
                if not published:
                    await rep.stop(1.0)
            if not published and router is not None and staged_router is not None:
                await router.discard(staged_router)
            self.notifier.ready(self.status())
        # Answered only now, after READY=1: whoever waits on the reload (`systemctl reload`
        # through `vllm-sr ctl reload`) finds the unit active again when it returns.
        if failure is not None:
            resolve(cmd, exc=failure)
            return
        resolve(
            cmd,
            result={
                "ok": True,
                "generation": fleet.generation,
                "kept": [s.id for s in diff.keep],
                "started": [s.id for s in diff.start],
                "retired": diff.retire,
            },
        )
        # Retiring runs on after the reload is done: a next reload need not wait for drains.
        for rep in retiring:
            self.fleet.retiring.append(rep)
            task = asyncio.create_task(self.retire(rep), name=f"retire-{rep.id}")
            self.retiring_tasks.add(task)
            task.add_done_callback(self.retiring_tasks.discard)
        if router is not None and retired_router is not None:
            task = asyncio.create_task(router.retire(retired_router), name="retire-router")
            self.retiring_tasks.add(task)
            task.add_done_callback(self.retiring_tasks.discard)

    async def _wait_ready(self, staged: list[ManagedReplica]) -> None:
        waits: dict[asyncio.Future[None], ManagedReplica] = {
            asyncio.ensure_future(rep.wait_settled()): rep for rep in staged
        }
        pending: set[asyncio.Future[None]] = set(waits)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_timeout_s
        try:
            while pending:
                done, pending = await asyncio.wait(
                    pending,
                    timeout=max(0.0, deadline - loop.time()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if not done:
                    late = [waits[f].id for f in pending]
                    raise VllmSrError(
                        f"new workers not ready within {self.ready_timeout_s:.0f} s: {late}"
                    )
                for fut in done:
                    rep = waits[fut]
                    if rep.state is ReplicaState.FAILED:
                        raise VllmSrError(
                            f"new worker {rep.id} failed: {rep.last_error}", replica=rep.id
                        )
        finally:
            for fut in pending:
                fut.cancel()

    def _check_compatible(
        self, plan: ServicePlan, staged: list[ManagedReplica], retire: list[str]
    ) -> None:
        """The page: "Reconfiguration prepares a compatible pool before publishing it". Each
        new worker must report the limits the new config sets, and the revision and
        capabilities of the workers it will serve beside (kept ones, or new ones checked
        before it); otherwise the reload is refused and the running generation serves on."""
        for name, dep in plan.deployments.items():
            pool = self.fleet.pools.get(name)
            peers: list[tuple[str, str | None, Mapping[str, object] | None]] = [
                (r.id, r.revision, r.capabilities)
                for r in (pool.replicas() if pool is not None else [])
                if r.id not in retire and r.serving
            ]
            for rep in (r for r in staged if r.spec.deployment == name):
                revision = json_str(rep.health.get("revision"))
                capabilities = json_object(rep.health.get("capabilities"))
                problem = compat.limits_problem(dep.settings, rep.limits or {})
                problem = problem or compat.peer_problem(revision, capabilities, peers)
                if problem is not None:
                    raise VllmSrError(
                        f"new worker {rep.id} is incompatible: {problem}", replica=rep.id
                    )
                peers.append((rep.id, revision, capabilities))

    async def retire(self, rep: ManagedReplica) -> None:
        """Drain: wait for its in-flight exchanges (up to the drain timeout), then stop it."""
        rep.retire()
        await wait_idle(rep, self.drain_timeout_s, self.quick)
        pid = rep.pid
        await rep.stop()
        with contextlib.suppress(ValueError):
            self.fleet.retiring.remove(rep)
        self.fleet.forget(rep)
        self.events.publish(ev.REPLICA_STOPPED, **who(rep), pid=pid)
