"""AttachedReplica: a replica whose runtime someone else runs (``endpoint:`` + ``model:``).

There is no process to spawn, restart or stop: the supervisor only waits for the endpoint's
/health to answer 200 before the replica joins dispatch, and the pool's probes and outcomes
take it out and back afterwards, like any replica. Requests are forwarded with ``model`` set
to the name the attached runtime serves (the only case where the frontend rewrites a body).
"""

from __future__ import annotations

import asyncio
import contextlib

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.errors import Conflict, VllmSrError
from vllm_sr.plan import ReplicaSpec, ReplicaState
from vllm_sr.pool.client import WorkerClient
from vllm_sr.supervisor.managed import ManagedReplica, ProcessOptions, ReplicaHooks

POLL_S = 1.0


class AttachedReplica(ManagedReplica):
    def __init__(
        self,
        spec: ReplicaSpec,
        hooks: ReplicaHooks,
        options: ProcessOptions,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        super().__init__(spec, "", hooks, options, clock)
        self.client = WorkerClient.from_endpoint(str(spec.endpoint), self.id)
        self.served_model = spec.model

    @property
    def pid(self) -> int | None:
        return None

    def lapsed(self) -> bool:
        """Its wait for the endpoint ends once it is ready (nothing to supervise after that):
        only a wait that raised has lapsed."""
        task = self._task
        if task is None or not task.done() or task.cancelled() or self._stopping:
            return False
        return task.exception() is not None

    async def _run(self, restarted: bool = False) -> None:
        self._new_life()
        self.hooks.on_starting(self, restarted)
        while not self._stopping:
            try:
                status, doc = await self.client.health(timeout_s=2.0)
                self.health = doc
                if status == 200:
                    break
                self.last_error = f"{self.spec.endpoint}/health answered {status}"
            except VllmSrError as exc:
                self.last_error = exc.message
            await asyncio.sleep(POLL_S)
        self.state = ReplicaState.READY
        self.last_error = None
        self.ready.set()
        self.settled.set()
        self.hooks.on_ready(self)

    async def stop(self, grace_s: float | None = None) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # reported on its end
                await self._task
        self.ready.clear()
        await self.client.close()

    async def resize_result_cache(self, max_bytes: int) -> bool:
        """An attached runtime keeps its own caches: nothing to tell it."""
        return True

    def kill_now(self) -> None:
        """Nothing of ours to kill."""

    async def restart(self) -> None:
        raise Conflict(f"replica {self.id} is attached ({self.spec.endpoint}); restart it there")
