"""Where stored responses live (upstream's ``pkg/responsestore``): one record per response,
the Response object's fields plus its ``input`` items, keyed by its ``resp_`` id.

:class:`MemoryStore` keeps them in this process, bounded by ``max_responses`` (beyond it the
oldest response is evicted, as upstream's memory store evicts the oldest created) and by the
TTL on a :class:`~vllm_sr.clock.Clock`. The Redis store (``redis_store``) shares them between
routers. :func:`chain` walks ``previous_response_id`` back from a response: the history a
chained request sends to the backend.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.errors import NotFound, Unavailable
from vllm_sr.jsontypes import JsonObject

Record = JsonObject

DEFAULT_TTL_S = 30 * 24 * 3600  # upstream's store default (a ttl_seconds of 0)
DEFAULT_MAX_RESPONSES = 10_000  # upstream's memory store default (a max_responses of 0)
MAX_CHAIN = 1000  # upstream's longest walk (its Redis store's maxChainLength)


class ResponseNotFound(NotFound):
    """An id no stored response has (never stored, ``store: false``, deleted, expired or
    evicted). OpenAI clients read ``type``."""

    code = "response_not_found"

    def to_json(self) -> JsonObject:
        doc: JsonObject = super().to_json()
        error = doc["error"]
        assert isinstance(error, dict)  # VllmSrError.to_json's shape
        error["type"] = "invalid_request_error"
        return doc


class StoreUnavailable(Unavailable):
    code = "response_store_unavailable"


class ResponseStore(Protocol):
    kind: str

    async def put(self, record: Record) -> None: ...

    async def get(self, response_id: str) -> Record | None: ...

    async def delete(self, response_id: str) -> bool:
        """True when there was one to delete."""
        ...

    def usage(self) -> int | None:
        """Records held (None: a shared store that does not count them here)."""
        ...

    async def close(self) -> None: ...


class MemoryStore:
    kind = "memory"

    def __init__(self, *, ttl_s: float, max_responses: int, clock: Clock = SYSTEM_CLOCK) -> None:
        self.ttl_s = ttl_s or DEFAULT_TTL_S
        self.max_responses = max_responses or DEFAULT_MAX_RESPONSES
        self.clock = clock
        # id -> (expires on the monotonic clock, the record as JSON); oldest first. One TTL for
        # all, so insertion order is also expiry order.
        self._items: OrderedDict[str, tuple[float, str]] = OrderedDict()
        self.evicted = 0

    def _expire(self) -> None:
        now = self.clock.monotonic()
        while self._items:
            first = next(iter(self._items.values()))
            if first[0] > now:
                return
            self._items.popitem(last=False)

    async def put(self, record: Record) -> None:
        self._expire()
        rid = str(record["id"])
        self._items.pop(rid, None)
        while len(self._items) >= self.max_responses:
            self._items.popitem(last=False)
            self.evicted += 1
        # Stored as JSON: a caller that changes its dict later never changes the record.
        self._items[rid] = (self.clock.monotonic() + self.ttl_s, json.dumps(record))

    async def get(self, response_id: str) -> Record | None:
        self._expire()
        item = self._items.get(response_id)
        return None if item is None else dict(json.loads(item[1]))

    async def delete(self, response_id: str) -> bool:
        self._expire()
        return self._items.pop(response_id, None) is not None

    def usage(self) -> int | None:
        self._expire()
        return len(self._items)

    async def close(self) -> None:
        self._items.clear()


@dataclass
class Chain:
    """A response and its ancestors, oldest first. ``missing``: the id of an ancestor that is
    no longer stored (deleted, expired or evicted), where the walk had to stop; None when it
    reached the first turn."""

    records: list[Record] = field(default_factory=list)
    missing: str | None = None


async def chain(store: ResponseStore, response_id: str) -> Chain:
    """The conversation ending at ``response_id``. Raises :class:`ResponseNotFound` naming the
    id when that response itself is not stored (upstream: 404, never an empty history)."""
    first = await store.get(response_id)
    if first is None:
        raise ResponseNotFound(
            f"previous_response_id {response_id!r} is not a stored response (never stored, "
            "stored with store: false, deleted, or expired); accepted: the id of a stored "
            "response",
            previous_response_id=response_id,
        )
    out = Chain([first])
    seen = {response_id}
    prev = first.get("previous_response_id")
    while isinstance(prev, str) and prev and len(out.records) < MAX_CHAIN and prev not in seen:
        seen.add(prev)
        record = await store.get(prev)
        if record is None:
            out.missing = prev
            break
        out.records.append(record)
        prev = record.get("previous_response_id")
    out.records.reverse()
    return out
