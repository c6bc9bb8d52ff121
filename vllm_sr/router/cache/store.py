"""A response-cache entry and the in-memory store (``global.stores.response_cache.backend_type:
memory``, the default): bounded in bytes and in entries, least recently used out first, each
entry dropped at its TTL. Time comes from a clock (tests use a fake one).

Stores answer three questions: the entry under an exact key, the nearest entry of a semantic
group (cosine of normalised embeddings, at or above a threshold), and store this entry. The
Redis store (``redis_store``) answers the same ones for several routers at once."""

from __future__ import annotations

import base64
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import numpy
from numpy.typing import NDArray

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.jsontypes import JsonObject

Vector = NDArray[numpy.float32]  # an embedding (the query's, an entry's)

DEFAULT_MAX_BYTES = 256 << 20
DEFAULT_MAX_ENTRIES = 1000  # upstream's max_entries default
DEFAULT_TTL_S = 3600  # upstream's ttl_seconds default
ENTRY_OVERHEAD = 256  # bytes counted per entry besides its answer and embedding


@dataclass(frozen=True)
class Entry:
    key: str  # the exact key
    answer: bytes  # the chat.completion document (JSON)
    created: float  # wall seconds
    expires: float  # wall seconds
    group: str | None = None  # the semantic group, when the entry is in the semantic tier
    vector: Vector | None = None  # normalised float32 embedding of the query text

    @property
    def size(self) -> int:
        vec = 0 if self.vector is None else int(self.vector.nbytes)
        return len(self.answer) + vec + ENTRY_OVERHEAD

    def to_json(self) -> bytes:
        doc: JsonObject = {
            "key": self.key,
            "answer": self.answer.decode(),
            "created": self.created,
            "expires": self.expires,
            "group": self.group,
        }
        if self.vector is not None:
            doc["vector"] = base64.b64encode(self.vector.astype(numpy.float32).tobytes()).decode()
        return json.dumps(doc).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> Entry:
        doc = json.loads(raw)
        vec = doc.get("vector")
        return cls(
            key=doc["key"],
            answer=doc["answer"].encode(),
            created=float(doc["created"]),
            expires=float(doc["expires"]),
            group=doc.get("group"),
            vector=None
            if vec is None
            else numpy.frombuffer(base64.b64decode(vec), dtype=numpy.float32),
        )


def normalise(vector: Vector) -> Vector:
    vec = numpy.asarray(vector, dtype=numpy.float32).reshape(-1)
    norm = float(numpy.linalg.norm(vec))
    return vec / norm if norm else vec


class CacheStore(Protocol):
    kind: str

    async def get(self, key: str) -> Entry | None: ...

    async def nearest(
        self, group: str, vector: Vector, threshold: float
    ) -> tuple[Entry, float] | None: ...

    async def put(self, entry: Entry) -> None: ...

    def usage(self) -> tuple[int, int] | None:
        """(entries, bytes), or None when the store cannot say cheaply."""

    async def close(self) -> None: ...


class MemoryStore:
    kind = "memory"

    def __init__(
        self,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.clock = clock
        self._entries: OrderedDict[str, Entry] = OrderedDict()  # least recently used first
        self._groups: dict[str, set[str]] = {}
        self.bytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def usage(self) -> tuple[int, int]:
        return len(self._entries), self.bytes

    async def get(self, key: str) -> Entry | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires <= self.clock.time():
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return entry

    async def nearest(
        self, group: str, vector: Vector, threshold: float
    ) -> tuple[Entry, float] | None:
        keys = list(self._groups.get(group, ()))
        now = self.clock.time()
        live = []
        for key in keys:
            entry = self._entries[key]
            if entry.expires <= now:
                self._drop(key)
            elif entry.vector is not None and entry.vector.shape == vector.shape:
                live.append(entry)
        if not live:
            return None
        sims = numpy.stack([e.vector for e in live if e.vector is not None]) @ normalise(vector)
        best = int(numpy.argmax(sims))
        if float(sims[best]) < threshold:
            return None
        self._entries.move_to_end(live[best].key)
        return live[best], float(sims[best])

    async def put(self, entry: Entry) -> None:
        if entry.size > self.max_bytes or self.max_entries <= 0:
            return
        if entry.key in self._entries:
            self._drop(entry.key)
        self._entries[entry.key] = entry
        self.bytes += entry.size
        if entry.group is not None:
            self._groups.setdefault(entry.group, set()).add(entry.key)
        while self.bytes > self.max_bytes or len(self._entries) > self.max_entries:
            oldest = next(iter(self._entries))
            self._drop(oldest)
            self.evictions += 1

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key)
        self.bytes -= entry.size
        if entry.group is not None:
            members = self._groups.get(entry.group)
            if members is not None:
                members.discard(key)
                if not members:
                    del self._groups[entry.group]

    async def close(self) -> None:
        return None
