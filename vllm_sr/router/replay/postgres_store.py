"""The postgres router_replay store (``store_backend: postgres``), on psycopg 3.

``connect`` opens one connection (autocommit) and creates upstream's table when it is missing
(postgres_codec.CREATE_TABLE). One connection, used by one statement at a time: a router
writes one small row per routed chat, far below what one connection carries, and a single
connection keeps a dead server's cost to one failed attempt. Records older than
``ttl_seconds`` (by ``created_at``, as upstream deletes them) are left out of reads and
deleted at most once a minute after a write. A failure closes the connection and raises
:class:`StoreUnavailable`; the writer reconnects later (writer.py)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import NotRequired, TypedDict

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow
from psycopg.types.json import Jsonb

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.config.router_replay import DEFAULT_TABLE, RouterReplayPostgres
from vllm_sr.router.replay import postgres_codec as codec
from vllm_sr.router.replay.envexpand import expand_env
from vllm_sr.router.replay.store import ReadResult, Record, ReplayQuery, StoreUnavailable

CONNECT_TIMEOUT_S = 2  # libpq's connect_timeout (whole seconds)
CLEANUP_EVERY_S = 60.0


class ConnectionParams(TypedDict):
    host: str
    port: int
    dbname: str
    user: str
    sslmode: str
    connect_timeout: int
    password: NotRequired[str]


def connection_params(conf: RouterReplayPostgres) -> ConnectionParams:
    """libpq parameters of ``conf`` (upstream's defaults; ``${VAR}`` expanded)."""
    if not conf.database or not conf.user:
        raise StoreUnavailable(
            "the postgres router_replay store needs global.services.router_replay.postgres "
            "database and user; accepted: both set"
        )
    params: ConnectionParams = {
        "host": expand_env(conf.host or "localhost"),
        "port": conf.port or 5432,
        "dbname": expand_env(conf.database),
        "user": expand_env(conf.user),
        "sslmode": conf.ssl_mode or "disable",
        "connect_timeout": CONNECT_TIMEOUT_S,
    }
    if conf.password:
        params["password"] = expand_env(conf.password)
    return params


class PostgresReplayStore:
    kind = "postgres"

    def __init__(
        self,
        conf: RouterReplayPostgres | None,
        ttl_s: int,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.conf = conf or RouterReplayPostgres()
        self.table = self.conf.table_name or DEFAULT_TABLE
        self.ttl_s = ttl_s
        self.clock = clock
        self.conn: psycopg.AsyncConnection[TupleRow] | None = None
        self.lock = asyncio.Lock()
        self.next_cleanup = 0.0
        t = sql.Identifier(self.table)
        cols = sql.SQL(", ").join(map(sql.Identifier, codec.INSERT_COLUMNS))
        marks = sql.SQL(", ").join(sql.Placeholder() * len(codec.INSERT_COLUMNS))
        self.insert = sql.SQL("INSERT INTO {} ({}) VALUES ({}) RETURNING vsr_seq").format(
            t, cols, marks
        )
        self.select = sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(map(sql.Identifier, codec.SELECT_COLUMNS)), t
        )
        self.create = sql.SQL(codec.CREATE_TABLE.replace("{t}", self.table))
        self.add_seq = sql.SQL(codec.ADD_SEQ.replace("{t}", self.table))

    async def connect(self) -> None:
        async with self.lock:
            await self._drop()
            try:
                conn = await psycopg.AsyncConnection.connect(
                    **connection_params(self.conf), autocommit=True
                )
            except psycopg.Error as exc:
                raise _down(exc) from None
            try:
                await conn.execute(self.create)
                has_seq = await (await conn.execute(codec.HAS_SEQ, (self.table,))).fetchone()
                if has_seq is None:
                    await conn.execute(self.add_seq)
            except psycopg.Error as exc:
                await conn.close()
                raise _down(exc) from None
            self.conn = conn

    async def add(self, record: Record, max_records: int) -> int:
        """``max_records`` is not applied: a shared store is bounded by its TTL (upstream)."""
        async with self.lock:
            conn = self._conn()
            try:
                cur = await conn.execute(self.insert, codec.encode(record))
                row = await cur.fetchone()
                if self.ttl_s > 0 and self.clock.monotonic() >= self.next_cleanup:
                    self.next_cleanup = self.clock.monotonic() + CLEANUP_EVERY_S
                    await conn.execute(
                        sql.SQL(
                            "DELETE FROM {} WHERE created_at < NOW() - make_interval(secs => %s)"
                        ).format(sql.Identifier(self.table)),
                        (self.ttl_s,),
                    )
            except psycopg.Error as exc:
                await self._drop()
                raise _down(exc) from None
        assert row is not None
        return int(row[0])

    async def read(self, query: ReplayQuery) -> ReadResult:
        where: list[sql.Composable] = [sql.SQL("vsr_seq > %s")]
        args: list[object] = [query.since]
        for column, value in (
            ("decision", query.decision),
            ("recipe", query.recipe),
            ("session_id", query.session),
        ):
            if value:
                where.append(sql.SQL("{} = %s").format(sql.Identifier(column)))
                args.append(value)
        where += self._fresh(args)
        statement = sql.SQL("{} WHERE {} ORDER BY vsr_seq LIMIT %s").format(
            self.select, sql.SQL(" AND ").join(where)
        )
        t = sql.Identifier(self.table)
        async with self.lock:
            conn = self._conn()
            try:
                rows = await (await conn.execute(statement, (*args, query.limit))).fetchall()
                cur = await conn.execute(sql.SQL("SELECT max(vsr_seq) FROM {}").format(t))
                top = await cur.fetchone()
                cur = await conn.execute(
                    sql.SQL("SELECT DISTINCT decision FROM {} WHERE decision IS NOT NULL").format(t)
                )
                names = [r[0] for r in await cur.fetchall()]
            except psycopg.Error as exc:
                await self._drop()
                raise _down(exc) from None
        last = int(top[0]) if top is not None and top[0] is not None else 0
        return [codec.decode(r) for r in rows], last, sorted(names)

    async def get(self, record_id: str) -> Record | None:
        args: list[object] = [record_id]
        where: list[sql.Composable] = [sql.SQL("id = %s"), *self._fresh(args)]
        query = sql.SQL("{} WHERE {}").format(self.select, sql.SQL(" AND ").join(where))
        async with self.lock:
            conn = self._conn()
            try:
                row = await (await conn.execute(query, args)).fetchone()
            except psycopg.Error as exc:
                await self._drop()
                raise _down(exc) from None
        return codec.decode(row) if row is not None else None

    async def append_outcome(self, record_id: str, outcome: Record) -> bool:
        """One UPDATE appending to upstream's ``outcomes`` JSONB array (atomic in postgres)."""
        args: list[object] = [Jsonb([outcome]), record_id]
        where: list[sql.Composable] = [sql.SQL("id = %s"), *self._fresh(args)]
        query = sql.SQL(
            "UPDATE {} SET outcomes = COALESCE(outcomes, '[]'::jsonb) || %s WHERE {}"
        ).format(sql.Identifier(self.table), sql.SQL(" AND ").join(where))
        async with self.lock:
            conn = self._conn()
            try:
                cur = await conn.execute(query, args)
            except psycopg.Error as exc:
                await self._drop()
                raise _down(exc) from None
        return cur.rowcount > 0

    def _fresh(self, args: list[object]) -> list[sql.Composable]:
        """The TTL's condition (none without a TTL); its argument goes on ``args``."""
        if self.ttl_s <= 0:
            return []
        args.append(self.ttl_s)
        return [sql.SQL("created_at >= NOW() - make_interval(secs => %s)")]

    def _conn(self) -> psycopg.AsyncConnection[TupleRow]:
        if self.conn is None or self.conn.closed:
            raise StoreUnavailable("the postgres router_replay store is not connected")
        return self.conn

    async def _drop(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None and not conn.closed:
            with contextlib.suppress(psycopg.Error):
                await conn.close()

    async def close(self) -> None:
        async with self.lock:
            await self._drop()


def _down(exc: BaseException) -> StoreUnavailable:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return StoreUnavailable(
        f"the postgres router_replay store cannot be used: {type(exc).__name__}: {text}"
    )
