"""The Responses API's memory store on a fake clock: bounded by max_responses (the oldest goes
first), records expire at the TTL, a record read back is a copy; and the chain walk behind
previous_response_id (oldest first, a missing start is a 404 naming it, a missing ancestor is
reported, cycles end)."""

from __future__ import annotations

import pytest

from vllm_sr.clock import FakeClock
from vllm_sr.router.responses.store import (
    DEFAULT_MAX_RESPONSES,
    DEFAULT_TTL_S,
    MemoryStore,
    ResponseNotFound,
    chain,
)


def rec(rid: str, prev: str | None = None) -> dict[str, object]:
    return {"id": rid, "object": "response", "previous_response_id": prev, "output": []}


async def test_beyond_max_responses_the_oldest_is_evicted() -> None:
    store = MemoryStore(ttl_s=60, max_responses=2, clock=FakeClock())
    for rid in ("resp_a", "resp_b", "resp_c"):
        await store.put(rec(rid))
    assert await store.get("resp_a") is None
    assert (await store.get("resp_b") or {})["id"] == "resp_b"
    assert (await store.get("resp_c") or {})["id"] == "resp_c"
    assert store.usage() == 2 and store.evicted == 1


async def test_records_expire_at_the_ttl() -> None:
    clock = FakeClock()
    store = MemoryStore(ttl_s=10, max_responses=5, clock=clock)
    await store.put(rec("resp_a"))
    clock.advance(5)
    await store.put(rec("resp_b"))
    clock.advance(4.9)
    assert await store.get("resp_a") is not None
    clock.advance(0.2)
    assert await store.get("resp_a") is None  # 10.1 s old
    assert await store.get("resp_b") is not None  # 5.1 s old
    assert store.usage() == 1
    clock.advance(5)
    assert await store.delete("resp_b") is False  # expired: nothing to delete


async def test_zero_means_upstreams_store_defaults() -> None:
    store = MemoryStore(ttl_s=0, max_responses=0, clock=FakeClock())
    assert store.ttl_s == DEFAULT_TTL_S == 30 * 24 * 3600
    assert store.max_responses == DEFAULT_MAX_RESPONSES == 10_000


async def test_a_record_read_back_is_a_copy_and_delete_removes_it() -> None:
    store = MemoryStore(ttl_s=60, max_responses=5, clock=FakeClock())
    record = rec("resp_a")
    await store.put(record)
    record["output"] = ["changed later"]
    got = await store.get("resp_a")
    assert got is not None and got["output"] == []
    got["output"] = ["changed by a reader"]
    assert (await store.get("resp_a") or {})["output"] == []
    assert await store.delete("resp_a") is True
    assert await store.delete("resp_a") is False
    assert await store.get("resp_a") is None


async def test_chain_is_oldest_first() -> None:
    store = MemoryStore(ttl_s=60, max_responses=10, clock=FakeClock())
    await store.put(rec("resp_1"))
    await store.put(rec("resp_2", "resp_1"))
    await store.put(rec("resp_3", "resp_2"))
    got = await chain(store, "resp_3")
    assert [r["id"] for r in got.records] == ["resp_1", "resp_2", "resp_3"]
    assert got.missing is None


async def test_an_unknown_start_is_a_404_naming_it() -> None:
    store = MemoryStore(ttl_s=60, max_responses=10, clock=FakeClock())
    with pytest.raises(ResponseNotFound) as err:
        await chain(store, "resp_nope")
    assert err.value.http_status == 404
    assert "resp_nope" in err.value.message
    assert err.value.to_json()["error"]["type"] == "invalid_request_error"


async def test_a_missing_ancestor_stops_the_walk_and_is_named() -> None:
    store = MemoryStore(ttl_s=60, max_responses=2, clock=FakeClock())
    await store.put(rec("resp_1"))
    await store.put(rec("resp_2", "resp_1"))
    await store.put(rec("resp_3", "resp_2"))  # evicts resp_1
    got = await chain(store, "resp_3")
    assert [r["id"] for r in got.records] == ["resp_2", "resp_3"]
    assert got.missing == "resp_1"


async def test_a_cycle_ends_the_walk() -> None:
    store = MemoryStore(ttl_s=60, max_responses=10, clock=FakeClock())
    await store.put(rec("resp_1", "resp_2"))
    await store.put(rec("resp_2", "resp_1"))
    got = await chain(store, "resp_2")
    assert [r["id"] for r in got.records] == ["resp_1", "resp_2"]
