"""ManagedReplica: keeps one planned replica's worker process alive.

One task per replica runs spawn -> wait for /health 200 (ready timeout) -> watch (its /health
every ``health_every_s``, reported to ``on_health``) until it exits -> restart with backoff, and
reports each transition to its ``ReplicaHooks`` (the supervisor, which updates the pool and
publishes events in one place). An exit with the "do not restart" code (78) ends the loop with
the replica ``failed`` and the worker's own last words as the reason. Waiters await events
(``wait_settled``, ``wait_new_life``), never poll.

A spawn that fails (``create_subprocess_exec`` raising EMFILE, ENOMEM, ENOENT ...) is a failure
like an exit: backoff, ``on_backoff`` with the reason, another try. Anything else the life loop
raises (a bug in a hook) ends its task; the task's done callback reports it
(``on_supervision_failed``) and ``lapsed`` says so, and the supervisor's reconcile pass calls
``revive``, which starts the loop again through the usual backoff: supervision never dies
silently.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Protocol

from vllm_sr.backoff import Backoff
from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.errors import EXIT_DO_NOT_RESTART, VllmSrError
from vllm_sr.jsontypes import JsonObject, json_object
from vllm_sr.plan import ReplicaSpec, ReplicaState
from vllm_sr.pool.client import WorkerClient
from vllm_sr.pool.replica import Replica
from vllm_sr.pool.result_caches import WORKER_CACHE_BYTES
from vllm_sr.supervisor.process import WorkerProcess, worker_command

log = logging.getLogger("vllm_sr.supervisor")


@dataclass
class ProcessOptions:
    ready_timeout_s: float = 600.0
    stop_grace_s: float = 10.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    backoff_reset_s: float = 60.0
    health_every_s: float = 1.0  # a ready worker's /health is read this often (threads, hangs)
    worker_cache_bytes: int = WORKER_CACHE_BYTES  # each worker's cache when replicas > 1
    hung_grace_s: float = 2.0  # SIGTERM -> SIGKILL for a hung worker (it finishes nothing)
    worker_argv: Sequence[str] | None = None  # tests run another command than `vllm-sr worker`


class SpawnFailed(Exception):
    """The worker process could not be started at all (the OS refused the spawn)."""


class ReplicaHooks(Protocol):
    def on_starting(self, rep: ManagedReplica, restarted: bool) -> None: ...
    def on_ready(self, rep: ManagedReplica) -> None: ...
    def on_exited(self, rep: ManagedReplica, returncode: int, reason: str) -> None: ...
    def on_backoff(self, rep: ManagedReplica, delay_s: float) -> None: ...
    def on_failed(self, rep: ManagedReplica, reason: str) -> None: ...
    def on_health(self, rep: ManagedReplica, doc: JsonObject) -> None: ...
    def on_supervision_failed(self, rep: ManagedReplica, error: str) -> None: ...


class ManagedReplica:
    def __init__(
        self,
        spec: ReplicaSpec,
        socket_path: str,
        hooks: ReplicaHooks,
        options: ProcessOptions,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.spec = spec
        self.id: str = spec.id
        self.socket_path = socket_path
        self.hooks = hooks
        self.options = options
        self.client = WorkerClient(uds=socket_path, replica_id=self.id)
        self.process: WorkerProcess | None = None
        self.restarts = 0
        # Written by this object alone (its life loop, ``mark_hung``); the pool keeps its own
        # record of the replica (``record``), written by the pool alone.
        self.state = ReplicaState.STARTING
        self.last_error: str | None = None
        self.health: JsonObject = {}
        self.ready = asyncio.Event()  # set while the current process is ready
        self.settled = asyncio.Event()  # ready or failed for good (a reload waits on it)
        self.lives = 0  # processes started so far
        self.supervision_failures = 0  # times its life loop raised (and was started again)
        self._life = asyncio.Event()  # set (and replaced) each time a process starts
        self.record: Replica | None = None  # its pool record while published (set by Fleet.join)
        self.served_model: str | None = None  # attached runtimes: the name to put in "model"
        # Its result cache bound (fleet.size_caches: by its deployment's replica count); each
        # process starts with it, and a running one is told when it changes.
        self.result_cache_bytes = 0
        self._backoff = Backoff(
            options.backoff_initial_s,
            options.backoff_max_s,
            reset_after_s=options.backoff_reset_s,
            clock=clock,
        )
        self._stopping = False
        self._restart_now = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=20)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process and self.process.running else None

    @property
    def limits(self) -> JsonObject | None:
        return json_object(self.health.get("limits"))

    def start(self) -> None:
        self._supervise(self._run())

    def _supervise(self, coro: Coroutine[object, object, None]) -> None:
        self._task = asyncio.create_task(coro, name=f"replica-{self.id}")
        self._task.add_done_callback(self._ended)

    def lapsed(self) -> bool:
        """Its life loop has ended while it should still run (not stopping, not failed for
        good): the supervisor's reconcile pass revives it."""
        task = self._task
        return (
            task is not None
            and task.done()
            and not self._stopping
            and self.state is not ReplicaState.FAILED
        )

    def _ended(self, task: asyncio.Task[None]) -> None:
        """The life loop's task is done: a lapse is counted and reported, never silent (and
        the exception is retrieved here, so asyncio has nothing to complain of later)."""
        if task.cancelled() or task is not self._task:
            return
        exc = task.exception()
        if not self.lapsed():
            return
        self.ready.clear()
        self.supervision_failures += 1
        if exc is not None:
            error = f"supervision failed: {type(exc).__name__}: {exc}"
            log.error("%s: %s", self.id, error, exc_info=exc)
        else:
            error = "supervision failed: the life loop ended while the replica is planned"
            log.error("%s: %s", self.id, error)
        self.last_error = error
        with contextlib.suppress(Exception):  # a hook that raises here too: lapsed() still says
            self.hooks.on_supervision_failed(self, error)

    def revive(self) -> None:
        """Start a lapsed life loop again: what is left of its process is stopped, the usual
        backoff is waited, then the loop runs as a restart."""
        if self.lapsed():
            self._supervise(self._recover())

    async def _recover(self) -> None:
        # The wait comes first, so a hook that keeps raising cannot make the revival spin.
        delay = self._backoff.next_delay()
        self.state = ReplicaState.BACKOFF
        with contextlib.suppress(Exception):
            self.hooks.on_backoff(self, delay)
        if self.process is not None and self.process.running:
            await self.process.stop(self.options.stop_grace_s)
        await self._sleep(delay)
        if not self._stopping:
            self.restarts += 1
            await self._run(restarted=True)

    async def wait_settled(self) -> None:
        """Until the worker is ready, or failed for good (then ``state`` is FAILED)."""
        await self.settled.wait()

    async def wait_new_life(self, after: int) -> None:
        """Until a process later than life number ``after`` has started (or it failed)."""
        while self.lives <= after and self.state is not ReplicaState.FAILED:
            await self._life.wait()

    def _new_life(self) -> None:
        self.lives += 1
        self._life.set()
        self._life = asyncio.Event()

    def mark_hung(self, reason: str) -> bool:
        """Its forward has run past the hang bound: HUNG (``kill_hung`` restarts it). False,
        and nothing changes, unless it is READY (a hang is reported once per process)."""
        if self.state is not ReplicaState.READY:
            return False
        self.state, self.last_error = ReplicaState.HUNG, reason
        return True

    async def kill_hung(self, reason: str) -> None:
        """Its forward hangs: TERM, a short grace, KILL; the life loop restarts it with the
        usual backoff and ``reason`` as the exit reason."""
        self.last_error = reason
        if self.process is not None:
            await self.process.stop(min(self.options.hung_grace_s, self.options.stop_grace_s))

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop for good: no restart. SIGTERM, grace, SIGKILL."""
        self._stopping = True
        self._wake.set()
        if self.process is not None:
            await self.process.stop(self.options.stop_grace_s if grace_s is None else grace_s)
        if self._task is not None:
            # A loop that raised was reported when it ended (``_ended``); stopping goes on.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self.client.close()

    async def resize_result_cache(self, max_bytes: int) -> bool:
        """Its deployment's replica count changed: the next process starts with ``max_bytes``,
        and a ready one is told now (it keeps running). False when a ready worker did not
        take it (the reason is logged); a starting one catches up as it gets ready."""
        self.result_cache_bytes = max_bytes
        if self.state is not ReplicaState.READY:
            return True
        return await self._tell_result_cache()

    async def _tell_result_cache(self) -> bool:
        try:
            resp = await self.client.set_result_cache(self.result_cache_bytes)
        except VllmSrError as exc:
            log.warning("%s: result cache not resized: %s", self.id, exc.message)
            return False
        if resp.status != 200:
            log.warning("%s: result cache not resized: answered %d", self.id, resp.status)
            return False
        self.health = {**self.health, "result_cache_bytes": self.result_cache_bytes}
        return True

    def retire(self) -> None:
        """Leaving the plan: if the process exits now it is not restarted (stop() follows)."""
        self._stopping = True
        self._wake.set()

    def kill_now(self) -> None:
        if self.process is not None:
            self.process.kill_now()

    async def restart(self) -> None:
        """Replace the process now (control API): stop it, then start a new one at once
        (no backoff wait; it still counts as a restart)."""
        self._restart_now = True
        if self.process is not None:
            await self.process.stop(self.options.stop_grace_s)

    async def _run(self, restarted: bool = False) -> None:
        while not self._stopping:
            try:
                returncode: int | None = await self._one_life(restarted)
            except SpawnFailed as exc:
                returncode, reason = None, str(exc)
            self.ready.clear()
            if self._stopping:
                break
            self._backoff.mark_down()
            if returncode is None:  # no process: nothing exited, the try failed
                self.last_error = reason
                log.warning("%s: %s", self.id, reason)
            else:
                reason = self._exit_reason(returncode)
                self.last_error = reason
                self.hooks.on_exited(self, returncode, reason)
            if returncode == EXIT_DO_NOT_RESTART:
                self.state = ReplicaState.FAILED
                self.settled.set()
                self._life.set()
                self.hooks.on_failed(self, reason)
                return
            if self._restart_now:
                self._restart_now = False
            else:
                delay = self._backoff.next_delay()
                self.state = ReplicaState.BACKOFF
                self.hooks.on_backoff(self, delay)
                await self._sleep(delay)
            restarted = True
            if not self._stopping:
                self.restarts += 1

    async def _sleep(self, delay: float) -> None:
        """The backoff's wait; ``stop``/``retire`` end it early."""
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), delay)

    async def _one_life(self, restarted: bool) -> int:
        """Spawn, wait until ready, wait for the exit. Returns the exit code."""
        argv = worker_command(
            self.spec, self.socket_path, self.options.worker_argv, self.result_cache_bytes
        )
        env = dict(self.spec.env)
        proc = WorkerProcess(
            argv,
            env=env,
            cpus=self.spec.cpus,
            socket_path=self.socket_path,
            name=self.id,
        )
        self.process = proc
        self._stderr_tail.clear()
        try:
            await proc.start(stderr_sink=self._stderr_tail)
        except OSError as exc:  # EMFILE, ENOMEM, ENOENT (a package upgraded under us) ...
            raise SpawnFailed(f"spawn failed: {type(exc).__name__}: {exc}") from exc
        self.state = ReplicaState.STARTING
        self.health = {}
        self.last_error = None
        self._new_life()
        self.hooks.on_starting(self, restarted)
        if await self._wait_ready(proc):
            reported = self.health.get("result_cache_bytes")
            if reported is not None and reported != self.result_cache_bytes:
                await self._tell_result_cache()  # resized while this process was starting
            self.state = ReplicaState.READY
            self._backoff.mark_ready()
            self.ready.set()
            self.settled.set()
            self.hooks.on_ready(self)
            await self._watch(proc)
        elif proc.running and not self._stopping:
            self.last_error = f"not ready within {self.options.ready_timeout_s:.0f} s"
            log.warning("%s: %s; stopping it", self.id, self.last_error)
            await proc.stop(self.options.stop_grace_s)
        return await proc.wait()

    async def _watch(self, proc: WorkerProcess) -> None:
        """While it runs: read its /health every ``health_every_s`` and report it (adaptive
        threads, the running forward's age). A failed read changes nothing here: the pool's
        probes and the request path judge reachability."""
        waiter = asyncio.ensure_future(proc.wait())
        try:
            while not waiter.done() and not self._stopping:
                await asyncio.wait({waiter}, timeout=self.options.health_every_s)
                if waiter.done() or self._stopping:
                    return
                try:
                    status, doc = await self.client.health(timeout_s=2.0)
                except VllmSrError:
                    continue
                if status == 200 and doc:
                    self.health = doc
                    self.hooks.on_health(self, doc)
        finally:
            waiter.cancel()

    async def _wait_ready(self, proc: WorkerProcess) -> bool:
        """Poll /health until 200, the process exits, or the ready timeout passes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.ready_timeout_s
        interval = 0.02
        while proc.running and not self._stopping:
            try:
                status, doc = await self.client.health(timeout_s=2.0)
                self.health = doc
                if status == 200:
                    return True
            except VllmSrError:
                pass  # not listening yet
            if loop.time() >= deadline:
                return False
            waiter = asyncio.ensure_future(proc.wait())
            await asyncio.wait({waiter}, timeout=interval)
            waiter.cancel()
            interval = min(interval * 1.5, 0.5)
        return False

    def _exit_reason(self, returncode: int) -> str:
        if self._restart_now:
            return f"restarted on request (exit {returncode})"
        if self.last_error and self.last_error.startswith("hung"):
            return self.last_error
        if self.last_error and returncode < 0:
            return self.last_error
        tail = [line for line in self._stderr_tail if line.strip()]
        last = _message_of(tail[-1].strip()) if tail else ""
        if returncode < 0:
            return f"killed by signal {-returncode}"
        if returncode == EXIT_DO_NOT_RESTART:
            return f"exit {returncode} (do not restart): {last}" if last else f"exit {returncode}"
        return f"exit {returncode}: {last}" if last else f"exit {returncode}"


def _message_of(line: str) -> str:
    """A worker's last stderr line as a reason: the message of a JSON log line, else the line."""
    if line.startswith("{"):
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            return str(json.loads(line).get("message") or line)
    return line
