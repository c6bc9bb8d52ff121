"""The watch on config.yaml: a changed file applies by itself, through the same reload as
SIGHUP and ``vllm-sr ctl reload`` (prepare, check compatibility, publish, drain).

It polls the file's mark (``vllm_sr.config.watch``: stat through the links, and a ConfigMap
volume's ``..data``) every ``poll_s``; a change is read once it has settled, and reloads only
when its content hash is neither the served text's nor the last text a reload read: a file the
service wrote itself (``ctl scale``) was read by that reload already, and a broken file is
refused once, not on every poll. A refused reload is reported by the reload path
(``reload_failed`` with its problems); the watch waits for the next change. Polling rather than
inotify: it sees a ConfigMap's symlink swap and a rename-over the same way as an in-place
write, works on any filesystem, and its timing runs on a clock the tests drive.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.config.watch import Settler, content_hash, file_mark
from vllm_sr.control.commands import Command
from vllm_sr.errors import Conflict, VllmSrError
from vllm_sr.jsontypes import JsonObject
from vllm_sr.supervisor.config_source import ConfigSource

log = logging.getLogger("vllm_sr.supervisor")

Submit = Callable[[Command], Awaitable[JsonObject]]

SOURCE = "watch"  # the reload command's source, in its events and in reload_failures


def poll_interval(settle_s: float) -> float:
    """A few looks within the settle time, at most four a second."""
    return max(0.05, min(0.25, settle_s / 4))


class ConfigWatch:
    def __init__(
        self,
        path: Path,
        source: ConfigSource,
        submit: Submit,
        *,
        settle_s: float,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.path = path
        self.source = source
        self.submit = submit
        self.poll_s = poll_interval(settle_s)
        # Nothing acted on yet: the first settled look compares the file with what was served.
        self.settler = Settler(settle_s, clock)

    async def run(self) -> None:
        while True:
            await self.step()
            await asyncio.sleep(self.poll_s)

    async def step(self) -> bool:
        """One look at the file. True when it ran a reload (applied or refused)."""
        mark = file_mark(self.path)
        if not self.settler.observe(mark):
            return False
        if not mark.exists:
            # Deleted: keep serving what runs (a reload would fall back to the embedded default).
            log.warning("%s is missing; the running generation keeps serving", self.path)
            self.source.seen_on_disk(None)
            self.settler.acted(mark)
            return False
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            log.warning("%s: cannot read (%s); waiting for the next change", self.path, exc)
            self.settler.acted(mark)
            return False
        if file_mark(self.path) != mark:
            return False  # changed while being read: settle again
        digest = content_hash(data)
        self.source.seen_on_disk(digest)
        if digest in (self.source.read_hash, self.source.served_hash):
            self.settler.acted(mark)  # nothing new (a touch, or a file the service wrote)
            return False
        log.info("%s changed (sha256 %s): reloading", self.path, digest[:12])
        try:
            await self.submit(Command("reload", source=SOURCE))
        except Conflict:
            return False  # a reload is running, or the service stops: look again next time
        except VllmSrError:
            pass  # refused: the reload path reported it; the next change tries again
        self.settler.acted(mark)
        return True
