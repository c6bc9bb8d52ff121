"""Noticing that config.yaml changed on disk, and when it is safe to read: the file's mark
(what ``stat`` says of it, and of a Kubernetes ConfigMap volume's ``..data`` link beside it),
the settle rule on a clock, and the content hash.

Three ways a file changes, each seen by its mark:
- written in place: the size, mtime or ctime change (same inode);
- written to a temp file and renamed over (editors, ``vllm-sr config apply``): the inode
  changes;
- a ConfigMap update: the kubelet writes a new timestamped directory and swaps the ``..data``
  symlink to it in one rename; ``config.yaml`` is a link through ``..data``, so its target's
  inode changes, and so does ``..data``'s own target.

A change is read only once its mark has stayed the same for ``settle_s`` (``Settler``): a
writer that writes half the file and the rest within that time is never read half-way. The
content hash decides whether anything changed at all (a ``touch`` or a rewrite with the same
bytes reloads nothing).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from vllm_sr.clock import Clock

DATA_LINK = "..data"  # the symlink a ConfigMap volume swaps on every update


@dataclass(frozen=True)
class FileMark:
    """What ``stat`` says of the file (through its links) and of the directory's ``..data``."""

    exists: bool
    dev: int = 0
    ino: int = 0
    size: int = 0
    mtime_ns: int = 0
    ctime_ns: int = 0
    data_link: str | None = None  # ``..data``'s target in a ConfigMap volume, else None


def file_mark(path: Path) -> FileMark:
    """The mark of ``path`` now (a missing file has a mark too: ``exists`` False)."""
    try:
        link: str | None = os.readlink(path.parent / DATA_LINK)
    except OSError:
        link = None
    try:
        st = os.stat(path)
    except OSError:
        return FileMark(exists=False, data_link=link)
    return FileMark(True, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, link)


def content_hash(data: bytes) -> str:
    """The config's hash as the inventory and /metrics report it: SHA-256 of the bytes, hex."""
    return hashlib.sha256(data).hexdigest()


def text_hash(text: str) -> str:
    return content_hash(text.encode("utf-8"))


class Settler:
    """Debounces marks: ``observe(mark)`` answers True once, when a mark that differs from the
    last one acted on has stayed unchanged for ``settle_s`` (by the clock). The caller then
    reads the file and calls ``acted(mark)``; a read that should be tried again later (a
    reload already running) simply does not call it."""

    def __init__(self, settle_s: float, clock: Clock, initial: FileMark | None = None) -> None:
        self.settle_s = settle_s
        self.clock = clock
        self.acted_on: FileMark | None = initial
        self._seen: FileMark | None = initial
        self._since = clock.monotonic()

    def observe(self, mark: FileMark) -> bool:
        now = self.clock.monotonic()
        if mark != self._seen:
            self._seen, self._since = mark, now
            return False
        return mark != self.acted_on and now - self._since >= self.settle_s

    @property
    def settling(self) -> bool:
        """A change has been seen and is not yet stable (or not yet acted on)."""
        return self._seen != self.acted_on

    def acted(self, mark: FileMark) -> None:
        self.acted_on = mark
