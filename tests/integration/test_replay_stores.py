"""router_replay's redis and postgres stores on real servers (Debian's redis-server and
PostgreSQL, each started here on a temp Unix socket): the store contract of
tests/unit/test_replay_store.py, records surviving a new store (a restarted router), upstream's
table and key layout, the TTL, and a server that goes away and comes back."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.postgres import HAVE_POSTGRES, SKIP_REASON, PgServer, postgres_server
from tests.support.postgres import start_again as start_postgres_again
from tests.support.redis_server import HAVE_REDIS, redis_server
from tests.unit.test_replay_store import check_contract, check_outcomes, check_sessions, record
from vllm_sr.clock import FakeClock
from vllm_sr.config.router_replay import RouterReplayPostgres, RouterReplayRedis
from vllm_sr.router.replay.store import ReplayQuery
from vllm_sr.router.replay.writer import ReplayWriter

pytestmark = pytest.mark.slow

needs_postgres = pytest.mark.skipif(not HAVE_POSTGRES, reason=SKIP_REASON)
needs_redis = pytest.mark.skipif(not HAVE_REDIS, reason="needs redis-server")


@pytest.fixture
def pg() -> Iterator[PgServer]:
    pytest.importorskip("psycopg")
    with postgres_server() as server:
        yield server


@pytest.fixture
def redis_sock(tmp_path: Path) -> Iterator[Path]:
    with redis_server(tmp_path) as sock:
        yield sock


def pg_store(  # type: ignore[no-untyped-def]
    pg: PgServer, ttl_s: int = 0, table: str | None = None, clock: FakeClock | None = None
):
    from vllm_sr.router.replay.postgres_store import PostgresReplayStore

    conf = RouterReplayPostgres(**pg.settings, table_name=table)  # type: ignore[arg-type]
    return PostgresReplayStore(conf, ttl_s, clock or FakeClock())


def redis_store(sock: Path, ttl_s: int = 0, prefix: str | None = None):  # type: ignore[no-untyped-def]
    from vllm_sr.router.replay.redis_store import RedisReplayStore

    return RedisReplayStore.from_config(
        RouterReplayRedis(address=f"unix://{sock}", key_prefix=prefix), ttl_s
    )


@needs_postgres
async def test_postgres_store_keeps_the_contract_and_survives_a_new_store(pg: PgServer) -> None:
    store = pg_store(pg)
    await store.connect()
    await check_contract(store)
    await store.close()
    again = pg_store(pg)  # a restarted router: the table is there, the records too
    await again.connect()
    records, last, decisions = await again.read(ReplayQuery())
    assert [r["id"] for r in records] == ["a1", "b1", "a2", "o1"] and last == 4
    assert decisions == ["billing", "coding"]
    await again.close()


@needs_postgres
async def test_postgres_reads_by_session_from_upstreams_columns(pg: PgServer) -> None:
    import psycopg

    store = pg_store(pg, table="replay_sessions")
    await store.connect()
    await check_sessions(store)
    await store.close()
    verdicts = pg_store(pg, table="replay_outcomes", ttl_s=600)  # in upstream's column
    await verdicts.connect()
    await check_outcomes(verdicts)
    await verdicts.close()
    with psycopg.connect(pg.conninfo()) as conn:
        rows = conn.execute(
            "SELECT id, session_id, turn_index FROM replay_sessions ORDER BY vsr_seq"
        ).fetchall()
    # upstream's columns hold them (an upstream router filtering by session_id sees them)
    assert rows[:3] == [("n1", None, None), ("s1a", "sess-1", 0), ("s2a", "sess-2", 0)]


@needs_postgres
async def test_postgres_creates_upstreams_table_under_its_name(pg: PgServer) -> None:
    import psycopg

    store = pg_store(pg, table="replay_custom")
    await store.connect()
    await store.add(record("x"), 10)
    await store.close()
    with psycopg.connect(pg.conninfo()) as conn:
        cols = {
            r[0]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s",
                ("replay_custom",),
            )
        }
        row = conn.execute("SELECT decision, signals, route_diagnostics FROM replay_custom")
        row = row.fetchone()
        assert row is not None
    for col in ("id", "timestamp", "signals", "route_diagnostics", "hallucination_span_details"):
        assert col in cols  # upstream's columns, so an upstream router can share the table
    assert "vsr_seq" in cols
    assert row[0] == "coding" and row[1] == {"keyword": ["code"]}
    assert row[2]["annotations"]["vllm_sr"]["response_path"] == "upstream"


@needs_postgres
async def test_postgres_ttl_hides_and_deletes_old_records(pg: PgServer) -> None:
    import psycopg

    clock = FakeClock()
    store = pg_store(pg, ttl_s=3600, clock=clock)
    await store.connect()
    await store.add(record("old"), 10)
    with psycopg.connect(pg.conninfo(), autocommit=True) as conn:
        conn.execute("UPDATE router_replay_records SET created_at = NOW() - interval '2 hours'")
    await store.add(record("new"), 10)  # within the minute: no delete yet, but not read
    assert [r["id"] for r in (await store.read(ReplayQuery()))[0]] == ["new"]

    def ids() -> list[str]:
        with psycopg.connect(pg.conninfo()) as conn:
            return [
                r[0] for r in conn.execute("SELECT id FROM router_replay_records ORDER BY vsr_seq")
            ]

    assert ids() == ["old", "new"]
    clock.advance(60)
    await store.add(record("later"), 10)  # the minute has passed: expired rows are deleted
    assert ids() == ["new", "later"]
    await store.close()


@needs_postgres
async def test_a_postgres_that_goes_away_is_written_again_once_back(pg: PgServer) -> None:
    clock = FakeClock()
    writer = ReplayWriter(pg_store(pg), clock=clock)
    await writer.start()
    await writer.write(record("before"), 10)
    pg.stop()
    await writer.write(record("while down"), 10)
    await writer.write(record("also lost"), 10)
    assert writer.state == "down"
    assert writer.lost == {"store_error": 1, "store_down": 1}
    start_postgres_again(pg)
    clock.advance(1.0)
    await writer.write(record("triggers the retry"), 10)  # lost; the reconnect runs aside
    if writer._reconnect is not None:
        await writer._reconnect
    assert writer.state == "up"
    await writer.write(record("after"), 10)
    ids = [r["id"] for r in (await writer.read(ReplayQuery()))[0]]
    assert ids == ["before", "after"]
    await writer.close()


@needs_redis
async def test_redis_store_keeps_the_contract_and_survives_a_new_store(redis_sock: Path) -> None:
    store = redis_store(redis_sock, ttl_s=600, prefix="t1:")
    await store.connect()
    await check_contract(store)
    ttl = await store.client.ttl("t1:a1")
    assert 0 < ttl <= 600  # upstream's layout: <prefix><id>, expiring at the TTL
    await store.close()
    again = redis_store(redis_sock, ttl_s=600, prefix="t1:")
    records, last, _ = await again.read(ReplayQuery(decision="coding"))
    assert [r["id"] for r in records] == ["a1", "a2", "o1"] and last == 4
    other = redis_store(redis_sock, prefix="t2:")  # another prefix: another store
    assert (await other.read(ReplayQuery()))[:2] == ([], 0)
    await again.close()
    await other.close()


@needs_redis
async def test_redis_reads_by_session_through_its_index(redis_sock: Path) -> None:
    store = redis_store(redis_sock, ttl_s=600, prefix="t3:")
    await store.connect()
    await check_sessions(store)
    index = f"{store.index}s:sess-1"
    assert await store.client.zcard(index) == 2
    assert 0 < await store.client.ttl(index) <= 600  # goes when its records would
    await store.close()
    verdicts = redis_store(redis_sock, ttl_s=600, prefix="t4:")
    await check_outcomes(verdicts)
    assert 0 < await verdicts.client.ttl("t4:v1") <= 600  # the record keeps its TTL
    await verdicts.close()


@needs_redis
async def test_redis_expired_records_leave_the_index(redis_sock: Path) -> None:
    store = redis_store(redis_sock)
    await store.connect()
    await store.add(record("gone"), 10)
    await store.add(record("kept"), 10)
    await store.client.delete("router_replay:gone")  # as its TTL would
    assert [r["id"] for r in (await store.read(ReplayQuery()))[0]] == ["kept"]
    assert await store.client.zcard(store.index) == 1
    await store.close()


def test_postgres_binaries_run_as_an_unprivileged_user_under_root() -> None:
    """CI runs as root; the fixture must still start a cluster (initdb refuses root)."""
    if not HAVE_POSTGRES:
        pytest.skip(SKIP_REASON)
    pytest.importorskip("psycopg")
    with postgres_server() as server:
        owner = subprocess.run(
            ["stat", "-c", "%U", str(server.socket_dir)], capture_output=True, text=True
        ).stdout.strip()
        assert server.proc.poll() is None and (owner != "root" or not _is_root())


def _is_root() -> bool:
    import os

    return os.geteuid() == 0
