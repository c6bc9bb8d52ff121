"""The redis router_replay store (``store_backend: redis``).

As upstream keeps them: one string per record, ``<key_prefix><id>`` (default prefix
``router_replay:``), the record's JSON, expiring ``ttl_seconds`` after it was written; so an
upstream router reading the same Redis lists ours. vllm-sr's reads go by ``seq``, which
upstream's records lack: a counter ``vsr-replay-seq:<prefix>`` gives each record its seq, and
sorted sets (seq -> id) index them, ``vsr-replay-index:<prefix>`` for all,
``vsr-replay-index:<prefix>d:<decision>`` per decision, ``...r:<recipe>`` per recipe and
``...s:<session_id>`` per session (records with a ``session_id``), with the decisions in the
set
``vsr-replay-decisions:<prefix>``. Those keys sit outside ``<prefix>*`` so that upstream's
scan of the prefix meets only records. An index entry whose record has expired is removed
when a read meets it."""

from __future__ import annotations

import json
from typing import cast

import redis.asyncio as aioredis
from redis.exceptions import RedisError, WatchError

from vllm_sr.config.router_replay import DEFAULT_KEY_PREFIX, RouterReplayRedis
from vllm_sr.router.redis_client import redis_client as shared_redis_client
from vllm_sr.router.replay.envexpand import expand_env
from vllm_sr.router.replay.store import (
    ReadResult,
    Record,
    ReplayQuery,
    StoreUnavailable,
    with_outcome,
)

TIMEOUT_S = 2.0  # a store slower than this is treated as down
DEFAULT_POOL = 10
APPEND_TRIES = 5


def redis_client(conf: RouterReplayRedis) -> aioredis.Redis:
    """The client for ``conf``: ``address`` ``host:port`` or a Unix socket path. No retries: a
    failed write marks the store down (writer.py)."""
    return shared_redis_client(
        expand_env(conf.address or "localhost:6379"),
        db=conf.db,
        password=expand_env(conf.password) if conf.password else None,
        timeout_s=TIMEOUT_S,
        max_connections=conf.pool_size or DEFAULT_POOL,
        tls=conf.use_tls,
        tls_verify=not conf.tls_skip_verify,
    )


class RedisReplayStore:
    kind = "redis"

    def __init__(self, client: aioredis.Redis, prefix: str | None, ttl_s: int) -> None:
        self.client = client
        self.prefix = prefix or DEFAULT_KEY_PREFIX
        self.ttl_s = ttl_s
        self.seq_key = "vsr-replay-seq:" + self.prefix
        self.index = "vsr-replay-index:" + self.prefix
        self.decisions_key = "vsr-replay-decisions:" + self.prefix

    @classmethod
    def from_config(cls, conf: RouterReplayRedis | None, ttl_s: int) -> RedisReplayStore:
        conf = conf or RouterReplayRedis()
        return cls(redis_client(conf), conf.key_prefix, ttl_s)

    async def connect(self) -> None:
        try:
            await self.client.ping()
        except (RedisError, OSError) as exc:
            raise _down(exc) from None

    async def add(self, record: Record, max_records: int) -> int:
        """``max_records`` is not applied: a shared store is bounded by its TTL (upstream)."""
        decision = str(record.get("decision") or "")
        rid, session = str(record["id"]), record.get("session_id")
        try:
            seq = int(await self.client.incr(self.seq_key))
            doc = json.dumps({**record, "seq": seq}, ensure_ascii=False)
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.set(self.prefix + rid, doc, ex=self.ttl_s or None)
                pipe.zadd(self.index, {rid: seq})
                pipe.zadd(f"{self.index}d:{decision}", {rid: seq})
                pipe.zadd(f"{self.index}r:{record.get('recipe') or ''}", {rid: seq})
                if session:
                    pipe.zadd(f"{self.index}s:{session}", {rid: seq})
                    if self.ttl_s:  # a session's index goes when its records would have
                        pipe.expire(f"{self.index}s:{session}", self.ttl_s)
                pipe.sadd(self.decisions_key, decision)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            raise _down(exc) from None
        return seq

    async def read(self, query: ReplayQuery) -> ReadResult:
        """From the narrowest index (session, else decision, else recipe, else all); the
        other filters are applied here."""
        if query.session:
            index = f"{self.index}s:{query.session}"
        elif query.decision:
            index = f"{self.index}d:{query.decision}"
        elif query.recipe:
            index = f"{self.index}r:{query.recipe}"
        else:
            index = self.index
        found: list[Record] = []
        start = query.since
        try:
            while len(found) < query.limit:
                ids = cast(
                    list[tuple[bytes, float]],
                    await self.client.zrangebyscore(
                        index, f"({start}", "+inf", start=0, num=query.limit, withscores=True
                    ),
                )
                if not ids:
                    break
                docs = await self.client.mget([self.prefix + _text(i) for i, _ in ids])
                gone = []
                for (rid, score), doc in zip(ids, docs, strict=True):
                    rec = _record(doc)
                    if rec is None:
                        gone.append(rid)
                    elif query.matches(rec):
                        found.append(rec)
                    start = int(score)
                if gone:  # expired (or not ours): out of both indexes
                    await self.client.zrem(self.index, *gone)
                    if index != self.index:
                        await self.client.zrem(index, *gone)
            last = int(await self.client.get(self.seq_key) or 0)
            decisions = sorted(_text(d) for d in await self.client.smembers(self.decisions_key))
        except (RedisError, OSError) as exc:
            raise _down(exc) from None
        return found[: query.limit], last, decisions

    async def get(self, record_id: str) -> Record | None:
        try:
            return _record(await self.client.get(self.prefix + record_id))
        except (RedisError, OSError) as exc:
            raise _down(exc) from None

    async def append_outcome(self, record_id: str, outcome: Record) -> bool:
        """Read, add, write back with the key's TTL kept; another writer in between (a verdict
        posted to another router) makes it start over (WATCH), at most a few times."""
        key = self.prefix + record_id
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                for _ in range(APPEND_TRIES):
                    try:
                        await pipe.watch(key)
                        rec = _record(await pipe.get(key))
                        if rec is None:
                            return False
                        rec["outcomes"] = with_outcome(rec, outcome)
                        pipe.multi()
                        pipe.set(key, json.dumps(rec, ensure_ascii=False), keepttl=True)
                        await pipe.execute()
                        return True
                    except WatchError:
                        continue
        except (RedisError, OSError) as exc:
            raise _down(exc) from None
        raise StoreUnavailable(f"the redis router_replay record {record_id!r} kept changing")

    async def close(self) -> None:
        await self.client.aclose()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _record(doc: bytes | str | None) -> Record | None:
    if doc is None:
        return None
    try:
        rec = json.loads(doc)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) and "seq" in rec else None


def _down(exc: BaseException) -> StoreUnavailable:
    return StoreUnavailable(
        f"the redis router_replay store cannot be used: {type(exc).__name__}: {exc}"
    )
