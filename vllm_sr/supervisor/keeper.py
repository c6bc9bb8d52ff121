"""Keeping the service's long-running tasks alive (the maintenance loop, the systemd watchdog,
the usage sampler, ``TaskKeeper``): a task that raises is logged, counted and reported as a
``service_task_failed`` event, and run again after a doubling backoff (1 s to 60 s, reset after
a minute without failure). Before this an EMFILE in the usage sampler ended it for good with
only asyncio's "Task exception was never retrieved" to say so. ``OwnedTasks``: every task the
supervisor starts, held until it ends and cancelled together by the stop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine

from vllm_sr import events as ev
from vllm_sr.backoff import Backoff
from vllm_sr.clock import Clock
from vllm_sr.events import Emit

log = logging.getLogger("vllm_sr.supervisor")


class TaskKeeper:
    """Runs ``factory()`` until it returns; restarts it with backoff when it raises."""

    initial_s = 1.0
    max_s = 60.0
    reset_after_s = 60.0

    def __init__(self, clock: Clock, emit: Emit) -> None:
        self.clock = clock
        self.emit = emit
        self.failures: dict[str, int] = {}  # task name -> times it raised

    async def keep(self, name: str, factory: Callable[[], Awaitable[object]]) -> None:
        backoff = Backoff(
            self.initial_s, self.max_s, reset_after_s=self.reset_after_s, clock=self.clock
        )
        while True:
            backoff.mark_ready()
            try:
                await factory()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                backoff.mark_down()
                delay = backoff.next_delay()
                count = self.failures[name] = self.failures.get(name, 0) + 1
                error = f"{type(exc).__name__}: {exc}"
                log.error("service task %s failed (%s); again in %.1f s", name, error, delay,
                          exc_info=exc)  # fmt: skip
                self.emit(
                    ev.SERVICE_TASK_FAILED,
                    task=name,
                    error=error,
                    failures=count,
                    restart_in_s=delay,
                )
            await asyncio.sleep(delay)


class OwnedTasks:
    """The tasks the supervisor starts and owns (the kept ones, probes, a restart, a hung
    worker's kill, the stop): each held until it ends, all cancelled together when the stop
    has finished."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[object]] = set()

    def start(self, coro: Coroutine[object, object, object], name: str) -> asyncio.Task[object]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def owned(self) -> set[asyncio.Task[object]]:
        """The owned tasks that have not ended."""
        return set(self._tasks)

    def cancel_all(self) -> None:
        """Cancel every owned task but the one calling (the stop that ends them)."""
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
