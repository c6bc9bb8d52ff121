"""The router_replay store seam and the memory store.

A store answers four things: ``connect`` (make the store usable: open, create what is
missing; raises :class:`StoreUnavailable`), ``add`` (keep one record, give it the next
``seq``), ``read`` (the records after a ``seq``, oldest first, of one decision, recipe and/or
session, or all), ``get`` (one record by its id: Router Learning's outcome verdicts name it)
and ``append_outcome`` (add a verdict to the record's ``outcomes``, upstream's field).
Records are plain JSON-able dicts with upstream's field names (vllm_sr/router/plugins/replay.py
builds them); a store keeps them as they are, so a record read back equals the one written
plus its ``seq``. The memory store keeps each decision's ring of ``max_records`` and drops a
record ``ttl_s`` after it was written (on the given clock). The redis and postgres stores
(``redis_store``, ``postgres_store``) are shared by every router that points at them and
survive a restart; they are bounded by the TTL alone, as upstream's are."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.errors import Unavailable
from vllm_sr.jsontypes import JsonObject

Record = JsonObject
MAX_LIST = 1000  # records one read returns at most
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"  # upstream's record timestamp (UTC)


def iso(wall_s: float) -> str:
    """Wall seconds as a record's ``timestamp``."""
    return datetime.fromtimestamp(wall_s, UTC).strftime(TIME_FORMAT)


class StoreUnavailable(Unavailable):
    """The store cannot be used now (unreachable, refused, timed out); retrying later can
    help."""

    code = "replay_store_unavailable"


@dataclass(frozen=True)
class ReplayQuery:
    """What a read asks for: the records after ``since`` (oldest first, at most ``limit``), of
    ``decision``, ``recipe`` and ``session`` (the record's ``session_id``) when given."""

    decision: str | None = None
    since: int = 0
    limit: int = MAX_LIST
    recipe: str | None = None
    session: str | None = None

    def matches(self, rec: Record) -> bool:
        """Whether ``rec`` is of the asked decision, recipe and session (``since`` aside)."""
        return (
            (not self.decision or rec.get("decision") == self.decision)
            and (not self.recipe or rec.get("recipe") == self.recipe)
            and (not self.session or rec.get("session_id") == self.session)
        )


class ReplayStore(Protocol):
    kind: str

    async def connect(self) -> None: ...

    async def add(self, record: Record, max_records: int) -> int: ...

    async def read(self, query: ReplayQuery) -> ReadResult:
        """-> the records ``query`` asks for, the last seq given, and the decisions that have
        records."""
        ...

    async def get(self, record_id: str) -> Record | None:
        """The record with this id (None: never written, or expired)."""
        ...

    async def append_outcome(self, record_id: str, outcome: Record) -> bool:
        """Add ``outcome`` to the record's ``outcomes`` list; False: no such record."""
        ...

    async def close(self) -> None: ...


ReadResult = tuple[list[Record], int, list[str]]


class MemoryReplayStore:
    """Each decision's ring in this process (lost when the router stops)."""

    kind = "memory"

    def __init__(self, ttl_s: float = 0, clock: Clock = SYSTEM_CLOCK) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self.rings: dict[tuple[str, str], deque[tuple[float, Record]]] = {}  # (recipe, decision)
        self.last_seq = 0

    async def connect(self) -> None:
        return None

    async def add(self, record: Record, max_records: int) -> int:
        self.last_seq += 1
        key = (str(record.get("recipe") or ""), str(record.get("decision") or ""))
        ring = self.rings.get(key)
        if ring is None or ring.maxlen != max_records:
            ring = deque(ring or (), maxlen=max_records)
            self.rings[key] = ring
        ring.append((self.clock.monotonic(), {**record, "seq": self.last_seq}))
        return self.last_seq

    def _expire(self) -> None:
        if self.ttl_s <= 0:
            return
        oldest = self.clock.monotonic() - self.ttl_s
        for key, ring in list(self.rings.items()):
            while ring and ring[0][0] <= oldest:
                ring.popleft()
            if not ring:
                del self.rings[key]

    async def read(self, query: ReplayQuery) -> ReadResult:
        self._expire()
        found = sorted(
            (
                r
                for ring in self.rings.values()
                for _, r in ring
                if record_seq(r) > query.since and query.matches(r)
            ),
            key=record_seq,
        )
        return found[: query.limit], self.last_seq, sorted({dec for _, dec in self.rings})

    async def get(self, record_id: str) -> Record | None:
        """A scan of the rings: the control API asks rarely, the chats never."""
        self._expire()
        for ring in self.rings.values():
            for _, rec in ring:
                if rec.get("id") == record_id:
                    return rec
        return None

    async def append_outcome(self, record_id: str, outcome: Record) -> bool:
        rec = await self.get(record_id)
        if rec is None:
            return False
        rec["outcomes"] = with_outcome(rec, outcome)
        return True

    async def close(self) -> None:
        return None


def record_seq(rec: Record) -> int:
    """A stored record's ``seq`` (every store sets it; 0 on a record that has none)."""
    seq = rec.get("seq")
    return seq if isinstance(seq, int) else 0


def with_outcome(rec: Record, outcome: Record) -> list[object]:
    """The record's ``outcomes`` with ``outcome`` appended."""
    prior = rec.get("outcomes")
    return [*(prior if isinstance(prior, list) else []), outcome]
