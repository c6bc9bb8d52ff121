"""The Redis response-cache store (``global.stores.response_cache.backend_type: redis``): several
router pods share one cache. An entry is one string ``<prefix>e:<exact key>`` (the entry's
JSON, expiring at its TTL); the semantic tier is one hash per group ``<prefix>g:<group>``
mapping exact keys to their embeddings (it expires with its longest-lived entry; a member
whose entry has expired is removed when a lookup meets it).

Connection (``global.stores.response_cache.redis``): ``url`` (vllm-sr's: any redis-py URL,
``redis://host:port/db`` or ``unix:///path/redis.sock``), else upstream's
``connection{host, port, database, password, timeout}``; ``index.prefix`` (default
``vsr:rc:``). A store that cannot be reached raises :class:`CacheUnavailable`: the chat is
served uncached and the failure counted, never failed."""

from __future__ import annotations

import base64
from collections.abc import Mapping

import numpy
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from vllm_sr.errors import VllmSrError
from vllm_sr.jsontypes import json_object
from vllm_sr.router.cache.store import Entry, Vector, normalise
from vllm_sr.router.redis_client import redis_client as shared_redis_client

DEFAULT_PREFIX = "vsr:rc:"
DEFAULT_TIMEOUT_S = 1.0  # a cache that answers slower than this is treated as down


class CacheUnavailable(VllmSrError):
    code = "cache_unavailable"
    http_status = 503
    retryable = True


def redis_client(settings: Mapping[str, object] | None) -> tuple[aioredis.Redis, str]:
    """The client and key prefix for ``settings`` (the store's ``redis`` mapping)."""
    settings = dict(settings or {})
    conn = json_object(settings.get("connection")) or {}
    index = json_object(settings.get("index")) or {}
    prefix = str(index.get("prefix") or DEFAULT_PREFIX)
    host, port = conn.get("host") or "localhost", conn.get("port") or 6379
    client = shared_redis_client(
        f"{host}:{port}",
        url=str(settings["url"]) if settings.get("url") else None,
        db=int(_number(conn.get("database"), 0)),
        password=str(conn["password"]) if conn.get("password") else None,
        timeout_s=_number(conn.get("timeout"), DEFAULT_TIMEOUT_S),
    )
    return client, prefix


def _number(value: object, default: float) -> float:
    """A number written as one or as a string; ``default`` when unset (0 and "" too)."""
    if not value:
        return default
    if isinstance(value, int | float | str):
        return float(value)
    raise ValueError(f"expected a number, got {value!r}")


class RedisStore:
    kind = "redis"

    def __init__(self, client: aioredis.Redis, prefix: str = DEFAULT_PREFIX) -> None:
        self.client = client
        self.prefix = prefix

    def usage(self) -> None:
        return None  # shared with other routers: its size is Redis's own INFO

    async def get(self, key: str) -> Entry | None:
        try:
            raw = await self.client.get(self.prefix + "e:" + key)
        except (RedisError, OSError) as exc:
            raise _down(exc) from None
        return None if raw is None else _entry(raw)

    async def nearest(
        self, group: str, vector: Vector, threshold: float
    ) -> tuple[Entry, float] | None:
        gkey = self.prefix + "g:" + group
        try:
            members = await self.client.hgetall(gkey)
            if not members:
                return None
            query = normalise(vector)
            scored = []
            for key, raw in members.items():
                try:
                    vec = numpy.frombuffer(base64.b64decode(raw), dtype=numpy.float32)
                except ValueError:
                    continue  # not one of ours: never a hit
                if vec.shape == query.shape:
                    scored.append((float(vec @ query), key))
            scored.sort(reverse=True)
            for sim, key in scored:
                if sim < threshold:
                    return None
                name = key.decode() if isinstance(key, bytes) else str(key)
                raw_entry = await self.client.get(self.prefix + "e:" + name)
                entry = None if raw_entry is None else _entry(raw_entry)
                if entry is not None:
                    return entry, sim
                await self.client.hdel(gkey, key)
        except (RedisError, OSError) as exc:
            raise _down(exc) from None
        return None

    async def put(self, entry: Entry) -> None:
        ttl = max(1, round(entry.expires - entry.created))
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.set(self.prefix + "e:" + entry.key, entry.to_json(), ex=ttl)
                if entry.group is not None and entry.vector is not None:
                    gkey = self.prefix + "g:" + entry.group
                    vec = base64.b64encode(entry.vector.astype(numpy.float32).tobytes())
                    pipe.hset(gkey, entry.key, vec)
                    pipe.expire(gkey, ttl, nx=True)
                    pipe.expire(gkey, ttl, gt=True)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            raise _down(exc) from None

    async def close(self) -> None:
        await self.client.aclose()


def _down(exc: BaseException) -> CacheUnavailable:
    return CacheUnavailable(f"the Redis response cache cannot be used: {type(exc).__name__}: {exc}")


def _entry(raw: bytes | str) -> Entry | None:
    """An entry as stored, or None for a value that is not one (written by something else, or
    by another version): a miss, never an error."""
    try:
        return Entry.from_json(raw)
    except (ValueError, KeyError, TypeError):
        return None
