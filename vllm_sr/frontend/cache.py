"""The frontend's result cache for single-worker deployments.

A bounded LRU of successful answers keyed by surface, deployment, the precision the deployment's
worker serves at (its resolved dtype) and the request body's bytes (the body holds the input and
every option that shapes the answer, so two requests with the same key get the same answer from
the same worker). Multi-replica deployments bypass it: each
worker keeps its own cache and the page says so. Bounded both by entries and by bytes, so a
flood of large answers cannot grow the service.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class CachedAnswer:
    status: int
    body: bytes
    content_type: str


def cache_key(surface: str, deployment: str, body: bytes, dtype: str = "") -> bytes:
    # A digest instead of the body keeps the key small however large the input is.
    h = hashlib.blake2b(body, digest_size=20)
    h.update(b"\0" + surface.encode() + b"\0" + deployment.encode() + b"\0" + dtype.encode())
    return h.digest()


class ResultCache:
    def __init__(self, max_entries: int = 4096, max_bytes: int = 64 * 1024 * 1024) -> None:
        if max_entries < 0 or max_bytes < 0:
            raise ValueError("cache bounds must be >= 0")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._items: OrderedDict[bytes, CachedAnswer] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def get(self, key: bytes) -> CachedAnswer | None:
        item = self._items.get(key)
        if item is None:
            self.misses += 1
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return item

    def put(self, key: bytes, answer: CachedAnswer) -> None:
        size = len(answer.body)
        if self.max_entries == 0 or size > self.max_bytes:
            return
        old = self._items.pop(key, None)
        if old is not None:
            self._bytes -= len(old.body)
        self._items[key] = answer
        self._bytes += size
        while len(self._items) > self.max_entries or self._bytes > self.max_bytes:
            _, evicted = self._items.popitem(last=False)
            self._bytes -= len(evicted.body)

    def clear(self) -> None:
        self._items.clear()
        self._bytes = 0
