"""The worker's result cache: whole 200 answers, keyed by everything that changes them,
bounded by bytes (least recently used out first). Off unless ``--result-cache-bytes`` > 0; the
supervisor resizes it on a running worker (``POST /admin/result-cache``) when its deployment's
replica count changes.

The key is a SHA-256 over the surface, the model revision this worker loaded, the precision
its forward runs in (the resolved dtype: a bfloat16 answer never answers for a float32 one), and
the request body as parsed (re-serialised compactly, keys in the caller's order, so label order
and every option count; ``user`` is dropped: it never changes an answer). Keying on the
revision means a cache can never answer from another revision even if one outlived a reload;
keying on the whole body means no option set can answer for another.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from vllm_sr.worker import jsonio

IGNORED_FIELDS = frozenset({"user"})  # OpenAI's end-user id: never changes an answer
ENTRY_OVERHEAD = 96  # bytes charged per entry on top of its body (key, list links)


def cache_key(surface: str, revision: str, dtype: str, body: Mapping[str, Any]) -> bytes:
    kept = {k: v for k, v in body.items() if k not in IGNORED_FIELDS}
    digest = hashlib.sha256()
    for part in (surface.encode(), revision.encode(), dtype.encode(), jsonio.dumps(kept)):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.digest()


class ResultCache:
    """An LRU of key -> response body bytes under ``max_bytes`` (each entry charged its body
    plus ``ENTRY_OVERHEAD``). Used on the event loop only: no locking."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"result cache bytes: {max_bytes} is negative")
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = self.misses = self.evictions = 0
        self._entries: OrderedDict[bytes, bytes] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> bytes | None:
        found = self._entries.get(key)
        if found is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return found

    def resize(self, max_bytes: int) -> int:
        """A new bound (0 turns the cache off and empties it); least recently used entries
        leave until the rest fit. Returns how many left."""
        if max_bytes < 0:
            raise ValueError(f"result cache bytes: {max_bytes} is negative")
        self.max_bytes = max_bytes
        evicted = 0
        while self._entries and self.bytes > max_bytes:
            _, dropped = self._entries.popitem(last=False)
            self.bytes -= len(dropped) + ENTRY_OVERHEAD
            evicted += 1
        self.evictions += evicted
        return evicted

    def put(self, key: bytes, body: bytes) -> int:
        """Store one answer; returns how many entries were evicted for it. An answer bigger
        than the whole cache is not stored."""
        size = len(body) + ENTRY_OVERHEAD
        if size > self.max_bytes:
            return 0
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= len(old) + ENTRY_OVERHEAD
        evicted = 0
        while self.bytes + size > self.max_bytes and self._entries:
            _, dropped = self._entries.popitem(last=False)
            self.bytes -= len(dropped) + ENTRY_OVERHEAD
            evicted += 1
        self._entries[key] = body
        self.bytes += size
        self.evictions += evicted
        return evicted
