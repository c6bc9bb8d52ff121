"""Commands for the supervisor's one queue. Signal handlers and control-API handlers only
build one of these and put it on the queue; the supervisor loop applies it with
``handle_<kind>`` and resolves ``done`` with a result dict or a ``VllmSrError``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal

CommandKind = Literal["drain", "eject", "readmit", "restart", "scale", "reload", "stop"]


@dataclass
class Command:
    kind: CommandKind
    replica: str | None = None  # drain / eject / readmit / restart
    deployment: str | None = None  # scale
    replicas: int | None = None  # scale
    duration_ms: int | None = None  # eject (None: the deployment's base_ejection_ms)
    quick: bool = False  # stop: a second signal skips the drain
    source: str = "control"  # "signal", "control", ...
    done: asyncio.Future[dict[str, Any]] | None = field(default=None, repr=False)


class CommandQueue:
    """The supervisor's single command queue."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Command] = asyncio.Queue()

    def put_nowait(self, command: Command) -> None:
        """Safe from a signal handler registered with ``loop.add_signal_handler``."""
        self._queue.put_nowait(command)

    async def submit(self, command: Command) -> dict[str, Any]:
        """Enqueue and wait until the loop has applied it; raises the loop's typed error."""
        loop = asyncio.get_running_loop()
        command.done = loop.create_future()
        self._queue.put_nowait(command)
        return await command.done

    async def get(self) -> Command:
        return await self._queue.get()
