"""config.yaml as the running service sees it: the hash of the text the served generation was
planned from, the hash of the file on disk, and why they differ when a reload was refused.

The planner reports each text it reads (``read``) and each plan it returns (``planned``); the
event bus tells it which plan was published (``pool_published``) and which reload was refused
(``reload_failed``, with its problems). The inventory's ``service.config``, ``/metrics``,
``vllm-sr status`` and vllm-sr-top show ``view()``. The watch keeps ``file_hash`` current;
without it, ``view()`` looks at the file itself.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from vllm_sr import events as ev
from vllm_sr.config.watch import FileMark, content_hash, file_mark
from vllm_sr.events import Event
from vllm_sr.jsontypes import JsonObject


class ConfigSource:
    def __init__(self, path: Path, *, watching: bool = False) -> None:
        self.path = path
        self.watching = watching
        self.served_hash: str | None = None  # the text the published generation came from
        self.file_hash: str | None = None  # the file on disk, as last read (None: missing)
        self.read_hash: str | None = None  # the last text any reload planned from
        self._planned: str | None = None  # the hash of the plan a reload is staging
        self.last_failure: JsonObject | None = None
        self.failures: Counter[str] = Counter()  # refused reloads by source
        self._mark: FileMark | None = None  # the file as last looked at by ``view`` (no watch)

    def read(self, text_hash: str, existed: bool) -> None:
        """The planner read the file (or, when missing, the embedded default)."""
        self.read_hash = text_hash
        self.file_hash = text_hash if existed else None

    def planned(self, text_hash: str) -> None:
        """The planner turned that text into a plan; it is served once published."""
        self._planned = text_hash

    def seen_on_disk(self, text_hash: str | None) -> None:
        """The watch read the file (None: it is missing)."""
        self.file_hash = text_hash

    def on_event(self, event: Event) -> None:
        """An event-bus sink: a publish makes the staged plan's text the served one; a refused
        reload is remembered with its problems until the next publish."""
        if event.event == ev.POOL_PUBLISHED:
            if self._planned is not None:
                self.served_hash = self._planned
            self.last_failure = None
        elif event.event == ev.RELOAD_FAILED:
            source = str(event.fields.get("source") or "control")
            self.failures[source] += 1
            self.last_failure = {
                "time": event.time,
                "source": source,
                "reason": event.fields.get("reason"),
                "problems": event.fields.get("problems") or [],
                "file_hash": self.read_hash,
            }

    def _refresh(self) -> None:
        """With no watch keeping ``file_hash`` current, look at the file when asked (read again
        only when its mark moved), so the inventory still says when it is not being served."""
        mark = file_mark(self.path)
        if mark == self._mark:
            return
        self._mark = mark
        try:
            self.file_hash = content_hash(self.path.read_bytes()) if mark.exists else None
        except OSError:
            self.file_hash = None

    def view(self) -> JsonObject:
        if not self.watching:
            self._refresh()
        in_sync = self.served_hash is not None and self.served_hash == self.file_hash
        failure = self.last_failure
        if failure is not None and failure.get("file_hash") != self.file_hash:
            failure = None  # refused a text that is no longer on disk: not why they differ
        return {
            "path": str(self.path),
            "watch": self.watching,
            "served_hash": self.served_hash,
            "file_hash": self.file_hash,
            "in_sync": in_sync,
            "last_failure": failure,
            "reload_failures": dict(self.failures),
        }
