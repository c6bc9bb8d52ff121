"""router_replay's store seam without servers: the memory store (rings, TTL on a fake clock),
the writer's handling of a store that is down (lost records, backoff, async queue), the
postgres row codec, env expansion and the global/plugin layering. The same contract on real
redis and postgres servers is tests/integration/test_replay_stores.py."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from vllm_sr.clock import FakeClock
from vllm_sr.config.router_replay import RouterReplay, RouterReplayPlugin
from vllm_sr.router.plugins.replay import GLOBAL_DEFAULT, ReplayLog, effective, signals_by_family
from vllm_sr.router.replay import build_store
from vllm_sr.router.replay.envexpand import expand_env
from vllm_sr.router.replay.store import (
    MemoryReplayStore,
    Record,
    ReplayQuery,
    StoreUnavailable,
    iso,
)
from vllm_sr.router.replay.writer import ReplayWriter


def record(rid: str, decision: str = "coding", **extra: Any) -> Record:
    return {
        "id": rid,
        "timestamp": iso(1_700_000_000.25),
        "recipe": "default",
        "decision": decision,
        "original_model": "auto",
        "selected_model": "coder",
        "model": "coder",
        "signals": {"keyword": ["code"]},
        "streaming": False,
        "response_status": 200,
        "duration_ms": 12,
        "lifecycle_state": "completed",
        "from_cache": False,
        "response_path": "upstream",
        "backend_fallbacks": [],
        "request_bytes": 10,
        **extra,
    }


async def check_contract(store: Any) -> None:
    """What every store does (run here on memory and on real servers in integration)."""
    a = record("a1", "coding", request_body="hi", request_body_truncated=False)
    b = record("b1", "billing", response_status=502, lifecycle_state="failed")
    c = record("a2", "coding", backend_fallbacks=["broken:http_429"])
    seqs = [await store.add(r, 100) for r in (a, b, c)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    records, last, decisions = await store.read(ReplayQuery())
    assert records == [{**r, "seq": s} for r, s in zip((a, b, c), seqs, strict=True)]
    assert last == seqs[-1] and decisions == ["billing", "coding"]
    only, _, _ = await store.read(ReplayQuery(decision="coding"))
    assert [r["id"] for r in only] == ["a1", "a2"]
    after, _, _ = await store.read(ReplayQuery(since=seqs[0]))
    assert [r["id"] for r in after] == ["b1", "a2"]
    first, _, _ = await store.read(ReplayQuery(limit=1))
    assert [r["id"] for r in first] == ["a1"]
    assert (await store.read(ReplayQuery(decision="nothing")))[0] == []
    # another recipe with a decision of the same name: apart by recipe, together by decision
    d = record("o1", "coding", recipe="other")
    await store.add(d, 100)
    mine, _, _ = await store.read(ReplayQuery(decision="coding", recipe="default"))
    assert [r["id"] for r in mine] == ["a1", "a2"]
    theirs, _, decisions = await store.read(ReplayQuery(recipe="other"))
    assert [r["id"] for r in theirs] == ["o1"] and decisions == ["billing", "coding"]
    both, _, _ = await store.read(ReplayQuery(decision="coding"))
    assert [r["id"] for r in both] == ["a1", "a2", "o1"]


async def check_sessions(store: Any) -> None:
    """Records of two sessions (and one without) are read apart by ``session``, with the
    other filters; ``get`` finds a record by id (on a store of its own)."""
    await store.add(record("n1", "coding"), 100)  # no session
    s1 = record("s1a", "coding", session_id="sess-1", turn_index=0)
    s2 = record("s2a", "billing", session_id="sess-2", turn_index=0)
    s3 = record("s1b", "billing", session_id="sess-1", turn_index=1)
    for r in (s1, s2, s3):
        await store.add(r, 100)
    one, _, _ = await store.read(ReplayQuery(session="sess-1"))
    assert [(r["id"], r["turn_index"]) for r in one] == [("s1a", 0), ("s1b", 1)]
    two, _, _ = await store.read(ReplayQuery(session="sess-2"))
    assert [r["id"] for r in two] == ["s2a"]
    narrowed, _, _ = await store.read(ReplayQuery(decision="billing", session="sess-1"))
    assert [r["id"] for r in narrowed] == ["s1b"]
    assert (await store.read(ReplayQuery(session="sess-9")))[0] == []
    after, _, _ = await store.read(ReplayQuery(since=one[0]["seq"], session="sess-1"))
    assert [r["id"] for r in after] == ["s1b"]
    got = await store.get("s2a")
    assert got == {**s2, "seq": two[0]["seq"]}
    assert (await store.get("n1"))["decision"] == "coding"  # a record without a session
    assert await store.get("never-written") is None


async def check_outcomes(store: Any) -> None:
    """Verdicts are appended to a record's ``outcomes`` in order, and read back with it."""
    await store.add(record("v1"), 100)
    await store.add(record("v2"), 100)
    first = {"source": "operator", "target": "model", "verdict": "good_fit"}
    second = {**first, "verdict": "underpowered", "score": 0.5}
    assert await store.append_outcome("v1", first) is True
    assert await store.append_outcome("v1", second) is True
    assert await store.append_outcome("nope", first) is False
    assert (await store.get("v1"))["outcomes"] == [first, second]
    assert "outcomes" not in await store.get("v2")
    records, _, _ = await store.read(ReplayQuery())
    assert [r.get("outcomes") for r in records] == [[first, second], None]


async def test_memory_store_keeps_the_contract() -> None:
    await check_contract(MemoryReplayStore())
    await check_sessions(MemoryReplayStore())
    await check_outcomes(MemoryReplayStore())


async def test_memory_store_bounds_each_decision_and_expires_at_its_ttl() -> None:
    clock = FakeClock()
    store = MemoryReplayStore(ttl_s=60, clock=clock)
    for i in range(3):
        await store.add(record(f"c{i}"), max_records=2)
    await store.add(record("b0", "billing"), max_records=2)
    records, _, _ = await store.read(ReplayQuery())
    assert [r["id"] for r in records] == ["c1", "c2", "b0"]  # c0 out of coding's ring of 2
    clock.advance(30)
    await store.add(record("b1", "billing"), max_records=2)
    clock.advance(30)  # the first four are 60 s old now: gone
    records, last, decisions = await store.read(ReplayQuery())
    assert [r["id"] for r in records] == ["b1"] and last == 5 and decisions == ["billing"]


class FakeStore:
    kind = "fake"

    def __init__(self, up: bool = True) -> None:
        self.up = up
        self.connects = 0
        self.added: list[Record] = []
        self.gate: asyncio.Event | None = None  # set: add waits for it

    async def connect(self) -> None:
        self.connects += 1
        if not self.up:
            raise StoreUnavailable("fake store is down")

    async def add(self, rec: Record, max_records: int) -> int:
        if self.gate is not None:
            await self.gate.wait()
        if not self.up:
            raise StoreUnavailable("fake store went away")
        self.added.append(rec)
        return len(self.added)

    async def read(self, query: ReplayQuery) -> Any:
        if not self.up:
            raise StoreUnavailable("fake store went away")
        added = [dict(r, seq=i + 1) for i, r in enumerate(self.added)]
        return added[query.since :], len(self.added), []

    async def get(self, record_id: str) -> Record | None:
        if not self.up:
            raise StoreUnavailable("fake store went away")
        return next((r for r in self.added if r["id"] == record_id), None)

    async def close(self) -> None:
        return None


async def settle(writer: ReplayWriter) -> None:
    """Let a background reconnect finish."""
    task = writer._reconnect
    if task is not None:
        await task


async def test_a_store_down_at_start_loses_records_at_once_and_is_retried_with_backoff() -> None:
    clock, store = FakeClock(), FakeStore(up=False)
    writer = ReplayWriter(store, clock=clock)
    await writer.start()  # never raises
    assert writer.state == "down" and store.connects == 1
    await writer.write(record("x"), 10)
    assert writer.lost == {"store_down": 1} and store.connects == 1  # not before the backoff
    clock.advance(1.0)
    await writer.write(record("y"), 10)  # starts a reconnect; this record is lost
    await settle(writer)
    assert store.connects == 2 and writer.state == "down" and writer.lost["store_down"] == 2
    clock.advance(1.0)  # the wait doubled: 2 s now
    await writer.write(record("z"), 10)
    assert store.connects == 2
    store.up = True
    clock.advance(1.0)
    await writer.write(record("w"), 10)
    await settle(writer)
    assert writer.state == "up"
    await writer.write(record("v"), 10)
    assert [r["id"] for r in store.added] == ["v"] and writer.written == 1


async def test_a_closed_writer_loses_late_records_and_reopens_nothing() -> None:
    store = FakeStore()
    writer = ReplayWriter(store, clock=FakeClock())
    await writer.start()
    await writer.close()
    await writer.write(record("late"), 10)
    assert writer.lost == {"closed": 1} and store.added == [] and writer._reconnect is None
    assert store.connects == 1


async def test_chats_arriving_during_the_first_try_do_not_each_try_again() -> None:
    store = FakeStore(up=False)
    writer = ReplayWriter(store, clock=FakeClock())
    await asyncio.gather(*(writer.write(record(str(i)), 10) for i in range(5)))
    assert store.connects == 1 and writer.lost == {"store_down": 5}


async def test_a_failed_write_marks_the_store_down_and_a_read_says_so() -> None:
    clock, store = FakeClock(), FakeStore()
    writer = ReplayWriter(store, clock=clock)
    await writer.write(record("a"), 10)  # connects on first use
    store.up = False
    await writer.write(record("b"), 10)
    assert writer.lost == {"store_error": 1} and writer.state == "down"
    with pytest.raises(StoreUnavailable, match="down"):
        await writer.read(ReplayQuery())


async def test_losses_are_logged_at_most_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    writer = ReplayWriter(FakeStore(up=False), clock=clock)
    await writer.start()
    caplog.clear()
    with caplog.at_level(logging.WARNING, "vllm_sr.router.replay"):
        for _ in range(5):
            await writer.write(record("x"), 10)
        clock.advance(60)
        await writer.write(record("x"), 10)
    lost_lines = [r.getMessage() for r in caplog.records if "lost" in r.getMessage()]
    assert len(lost_lines) == 2 and "5 record(s) lost" not in lost_lines[0]
    assert lost_lines[1].startswith("router_replay: 5 record(s) lost")  # the 5 since the first


async def test_async_writes_never_wait_and_a_full_queue_loses_the_record() -> None:
    store = FakeStore()
    store.gate = asyncio.Event()  # the store hangs until told
    writer = ReplayWriter(store, async_writes=True, clock=FakeClock(), queue_size=2)
    await writer.start()
    for rid in ("a", "b", "c", "d"):
        await asyncio.wait_for(writer.write(record(rid), 10), 1)  # returns at once
    await asyncio.sleep(0)  # the drain task took "a" and waits in the store
    assert writer.lost == {"queue_full": 1}  # "a" in the store, "b"/"c" queued, "d" lost
    store.gate.set()
    await asyncio.wait_for(writer.flush(), 5)
    assert [r["id"] for r in store.added] == ["a", "b", "c"] and writer.written == 3
    await writer.close()


async def test_replay_log_builds_upstream_fields_and_reads_from_its_store() -> None:
    clock = FakeClock()
    log = ReplayLog(ReplayWriter(MemoryReplayStore(clock=clock), clock=clock), clock=clock)
    conf = RouterReplayPlugin(enabled=True, max_body_bytes=4, capture_response_body=False)
    rec = await log.record(
        conf, replay_id="r1", decision="coding", recipe="default", original_model="auto",
        selected_model="coder", answered_by=None, matched_signals=("keyword:code", "domain:cs"),
        body=b"abcdefgh", stream=True, status=503, latency_ms=250.4, path="error",
        response=None,
    )  # fmt: skip
    assert rec["timestamp"] == iso(clock.time() - 0.2504)
    assert rec["signals"] == {"keyword": ["code"], "domain": ["cs"]}
    assert (rec["duration_ms"], rec["lifecycle_state"], rec["streaming"]) == (250, "failed", True)
    assert (rec["request_body"], rec["request_body_truncated"]) == ("abcd", True)
    assert "response_body" not in rec and "response_body_truncated" not in rec
    doc = await log.read()
    assert doc == {"records": [{**rec, "seq": 1}], "last_seq": 1, "decisions": ["coding"]}


def test_global_enabled_is_each_decisions_default_and_the_plugin_overrides_it() -> None:
    on, off, unset = (
        RouterReplayPlugin(enabled=True),
        RouterReplayPlugin(enabled=False),
        RouterReplayPlugin(max_records=5),
    )
    assert effective(None, False) is None and effective(None, True) is GLOBAL_DEFAULT
    assert effective(on, False) is on and effective(off, True) is None
    assert effective(unset, False) is None and effective(unset, True) is unset


def test_store_follows_store_backend_or_the_block_written() -> None:
    assert build_store(None).kind == "memory"
    assert build_store(RouterReplay()).kind == "memory"
    assert build_store(RouterReplay(redis={"address": "/tmp/r.sock"})).kind == "redis"
    both = RouterReplay(store_backend="redis", postgres={"database": "d", "user": "u"})
    assert build_store(both).kind == "redis"
    assert build_store(RouterReplay(postgres={"database": "d", "user": "u"})).kind == "postgres"


def test_signals_by_family() -> None:
    assert signals_by_family(("keyword:a", "keyword:b", "pii:ssn")) == {
        "keyword": ["a", "b"],
        "pii": ["ssn"],
    }


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("${PW}", "s3cret"),
        ("$USERX", "root"),
        ("${MISSING:-fallback}", "fallback"),
        ("${EMPTY:-fallback}", "fallback"),
        ("${EMPTY-fallback}", ""),
        ("${MISSING-default}", "default"),
        ("cost-$$value", "cost-$value"),
        ("user:${USERX}@db", "user:root@db"),
        ("plain", "plain"),
        ("${MISSING}", ""),
    ],
)
def test_env_expansion_follows_upstreams_grammar(text: str, want: str) -> None:
    env = {"PW": "s3cret", "USERX": "root", "EMPTY": ""}
    assert expand_env(text, env) == want


def test_postgres_codec_round_trips_a_record() -> None:
    pytest.importorskip("psycopg")
    from datetime import datetime

    from vllm_sr.router.replay import postgres_codec as codec

    rec = record("p1", response_body="{}", response_body_truncated=True, response_bytes=900)
    values = dict(zip(codec.INSERT_COLUMNS, codec.encode(rec), strict=True))
    assert values["timestamp"] == datetime(2023, 11, 14, 22, 13, 20, 250000)
    assert (values["ended_at"] - values["timestamp"]).total_seconds() == 0.012
    assert values["request_body"] is None and values["request_body_truncated"] is False
    ours = values["route_diagnostics"].obj["annotations"]["vllm_sr"]
    assert ours == {
        "model": "coder",
        "response_path": "upstream",
        "backend_fallbacks": [],
        "request_bytes": 10,
        "response_bytes": 900,
    }
    assert values["session_id"] is None and values["turn_index"] is None
    values["outcomes"] = None  # not inserted: verdicts are appended later
    row = [values[c] for c in codec.SELECT_COLUMNS if c != "vsr_seq"]
    row = [v.obj if hasattr(v, "obj") else v for v in row]
    assert codec.decode((*row, 7)) == {**rec, "seq": 7}  # no session: no session fields


def test_postgres_codec_puts_the_session_in_upstreams_columns() -> None:
    pytest.importorskip("psycopg")
    from vllm_sr.router.replay import postgres_codec as codec

    rec = record("p2", session_id="sess-1", turn_index=3)
    values = dict(zip(codec.INSERT_COLUMNS, codec.encode(rec), strict=True))
    assert (values["session_id"], values["turn_index"]) == ("sess-1", 3)
    ours = values["route_diagnostics"].obj["annotations"]["vllm_sr"]
    assert "session_id" not in ours and "turn_index" not in ours
    values["outcomes"] = None  # not inserted: verdicts are appended later
    row = [values[c] for c in codec.SELECT_COLUMNS if c != "vsr_seq"]
    row = [v.obj if hasattr(v, "obj") else v for v in row]
    assert codec.decode((*row, 8)) == {**rec, "seq": 8}
    # an upstream router's table gets the columns (and the index reads by session use)
    assert "ADD COLUMN IF NOT EXISTS session_id" in codec.CREATE_TABLE
    assert "ADD COLUMN IF NOT EXISTS turn_index" in codec.CREATE_TABLE
