"""The signal processes: a few children that evaluate Router mode's CPU-bound signals
(keywords, context, structure, conversation, language, metadata, PII) off the frontend's event
loop, kept alive by the supervisor as it keeps workers.

Each :class:`SignalProcess` runs one life loop: a socket pair (the child inherits its end by
file descriptor), spawn (exec, as workers), wait for its ``ready`` (it has loaded presidio and
lingua), hand the connection to the router's ``SignalDispatch``, wait for the exit, take the
connection back (its jobs in flight fail as ``SignalProcessFailed``: those chats' signals do not
match; none answers 5xx), back off (1 s doubling to 60 s, reset after a minute up) and start
again. Every transition is an event (``signal_process_*``, docs/events.md); the inventory lists
each process (``signal_processes``), and vllm-sr-top shows them.

How many: ``signal_processes`` in the host settings (``auto``: half the CPU budget, 1..4;
0: none, the signals stay on the loop). They start with the first generation that routes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, cast

from vllm_sr import events as ev
from vllm_sr.backoff import Backoff
from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.events import Emit as Publish  # EventBus.publish(name, **fields)
from vllm_sr.jsontypes import JsonObject
from vllm_sr.supervisor.process import WorkerProcess

if TYPE_CHECKING:
    from vllm_sr.plan import ServicePlan
    from vllm_sr.router.signal_dispatch import SignalDispatch, SignalProcConnection

log = logging.getLogger("vllm_sr.supervisor")

MAX_AUTO = 4


def auto_count(budget_cpus: int) -> int:
    """``signal_processes: auto``: half the CPU budget, at least 1, at most 4 (the loop and the
    workers need the rest)."""
    return max(1, min(MAX_AUTO, budget_cpus // 2))


def signal_command(fd: int, name: str, preload_language: bool) -> list[str]:
    argv = [sys.executable, "-m", "vllm_sr.router.signal_proc_main", "--fd", str(fd)]
    argv += ["--name", name]
    return argv + (["--preload-language"] if preload_language else [])


class UsesSignals(Protocol):
    """The router side (the chat mount): takes the dispatch its routers hand jobs to."""

    def use_signal_dispatch(self, dispatch: SignalDispatch) -> None: ...


class SignalProcess:
    """One signal process's life (states: starting, ready, backoff, stopped)."""

    def __init__(
        self,
        name: str,
        dispatch: SignalDispatch,
        publish: Publish,
        *,
        preload_language: bool,
        ready_timeout_s: float,
        stop_grace_s: float,
        backoff: Backoff,
    ) -> None:
        self.name = name
        self.dispatch = dispatch
        self.publish = publish
        self.preload_language = preload_language
        self.ready_timeout_s = ready_timeout_s
        self.stop_grace_s = stop_grace_s
        self.backoff = backoff
        self.state = "starting"
        self.restarts = 0
        self.restart_reason: str | None = None
        self.last_error: str | None = None
        self.process: WorkerProcess | None = None
        self.conn: SignalProcConnection | None = None
        self.jobs = 0  # answered by earlier lives (the current one's are on its connection)
        self.failed_jobs = 0
        self.ready = asyncio.Event()  # set while the current process is ready
        self._stopping = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._tail: collections.deque[str] = collections.deque(maxlen=10)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.process.running else None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"signal-process-{self.name}")

    async def _run(self) -> None:
        restarted = False
        while not self._stopping:
            try:
                returncode, reason = await self._one_life(restarted)
            except Exception as exc:  # a spawn the OS refused, a bug: backoff, not silence
                returncode, reason = None, f"{type(exc).__name__}: {exc}"
                log.exception("signal process %s", self.name)
            if self._stopping:
                break
            self.backoff.mark_down()
            self.last_error = self.restart_reason = reason
            delay = self.backoff.next_delay()
            self.state = "backoff"
            self.publish(
                ev.SIGNAL_PROCESS_EXITED,
                process=self.name,
                returncode=returncode,
                reason=reason,
                backoff_s=delay,
            )
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            if not self._stopping:
                self.restarts += 1
                restarted = True
        self.state = "stopped"

    async def _one_life(self, restarted: bool) -> tuple[int | None, str]:
        from vllm_sr.router.signal_dispatch import connect

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            proc = WorkerProcess(
                signal_command(theirs.fileno(), self.name, self.preload_language),
                name=self.name,
                pass_fds=(theirs.fileno(),),
            )
            self.process = proc
            self._tail.clear()
            self.state = "starting"
            await proc.start(stderr_sink=self._tail)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()  # the child has its copy
        conn = await connect(ours, self.name)
        self.conn = conn
        self.publish(
            ev.SIGNAL_PROCESS_STARTING, process=self.name, pid=proc.pid, restarted=restarted
        )
        exited = asyncio.ensure_future(proc.wait())
        try:
            first = asyncio.FIRST_COMPLETED
            waits = {exited, conn.ready}
            done, _ = await asyncio.wait(waits, timeout=self.ready_timeout_s, return_when=first)
            if conn.ready.done() and conn.ready.exception() is None:
                self.state = "ready"
                self.last_error = None
                self.backoff.mark_ready()
                self.dispatch.add(conn)
                self.ready.set()
                self.publish(ev.SIGNAL_PROCESS_READY, process=self.name, pid=proc.pid)
                ends: set[asyncio.Future[object]] = {
                    cast("asyncio.Future[object]", exited),
                    cast("asyncio.Future[object]", conn.closed),
                }
                await asyncio.wait(ends, return_when=first)
                if conn.cut and not exited.done():  # a job passed its deadline: hung
                    self.last_error = "hung: a job passed its deadline; stopped"
                    await proc.stop(self.stop_grace_s)
                returncode = await exited
            elif not done:
                self.last_error = f"not ready within {self.ready_timeout_s:.0f} s"
                await proc.stop(self.stop_grace_s)
                returncode = await exited
            else:
                returncode = await exited
        finally:
            self.ready.clear()
            self.dispatch.remove(conn)
            conn.close()
            await conn.closed
            self.jobs += conn.jobs
            self.failed_jobs += conn.failed_jobs
            self.conn = None
        return returncode, self._reason(returncode)

    def _reason(self, returncode: int) -> str:
        if self.last_error and self.last_error.startswith(("not ready", "hung")):
            return self.last_error
        if returncode < 0:
            return f"killed by signal {-returncode}"
        last = next((line for line in reversed(self._tail) if line.strip()), "")
        return f"exit {returncode}: {last.strip()}" if last else f"exit {returncode}"

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self.process is not None:
            await self.process.stop(self.stop_grace_s)
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    def inventory(self) -> JsonObject:
        conn = self.conn
        return {
            "id": self.name,
            "pid": self.pid,
            "state": self.state,
            "inflight": conn.inflight if conn is not None else 0,
            "jobs": self.jobs + (conn.jobs if conn is not None else 0),
            "failed_jobs": self.failed_jobs + (conn.failed_jobs if conn is not None else 0),
            "restarts": self.restarts,
            "restart_reason": self.restart_reason,
            "last_error": self.last_error,
        }


class SignalProcesses:
    """The set, owned by the supervisor (and by bench/router_signals.py's router process)."""

    def __init__(
        self,
        count: int,
        dispatch: SignalDispatch | None,
        publish: Publish,
        *,
        ready_timeout_s: float = 120.0,
        stop_grace_s: float = 5.0,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.count = count
        self.dispatch = dispatch
        self.publish = publish
        self.ready_timeout_s = ready_timeout_s
        self.stop_grace_s = stop_grace_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.clock = clock
        self.processes: list[SignalProcess] = []

    @property
    def started(self) -> bool:
        return bool(self.processes)

    def start_for(self, plan: ServicePlan | None, router: UsesSignals | None) -> None:
        """Start them with the first generation that routes, and hand their dispatch to the
        router (the chat mount); the language models preload when a recipe has a language
        rule. Later generations keep them (each sends its own signals with its jobs); a
        process started again later preloads as the latest generation says."""
        routes = plan is not None and plan.router is not None and plan.router.enabled
        if self.count <= 0 or not routes or plan is None or plan.router is None:
            return
        language = any(r.signals.language for r in plan.router.recipes.values())
        for proc in self.processes:
            proc.preload_language = language  # read at each spawn
        if self.started:
            return
        self.start(preload_language=language)
        if router is not None and self.dispatch is not None:
            router.use_signal_dispatch(self.dispatch)

    def start(self, *, preload_language: bool) -> None:
        """Spawn ``count`` processes (once; a later call does nothing)."""
        if self.processes or self.count <= 0:
            return
        if self.dispatch is None:
            from vllm_sr.router.signal_dispatch import SignalDispatch

            self.dispatch = SignalDispatch()
        for i in range(self.count):
            proc = SignalProcess(
                f"signals-{i}",
                self.dispatch,
                self.publish,
                preload_language=preload_language,
                ready_timeout_s=self.ready_timeout_s,
                stop_grace_s=self.stop_grace_s,
                backoff=Backoff(
                    self.backoff_initial_s,
                    self.backoff_max_s,
                    reset_after_s=60.0,
                    clock=self.clock,
                ),
            )
            self.processes.append(proc)
            proc.start()

    async def wait_ready(self, timeout_s: float) -> bool:
        """Until every process is ready (tests, the bench), or the timeout."""
        try:
            await asyncio.wait_for(
                asyncio.gather(*(p.ready.wait() for p in self.processes)), timeout_s
            )
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        await asyncio.gather(*(p.stop() for p in self.processes))

    def kill_now(self) -> None:
        for p in self.processes:
            if p.process is not None:
                p.process.kill_now()

    def inventory(self) -> list[JsonObject]:
        return [p.inventory() for p in self.processes]

    def pids(self) -> Sequence[int]:
        return [p.pid for p in self.processes if p.pid is not None]
