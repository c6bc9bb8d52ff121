"""The Responses API's Redis store (``store_backend: redis``), as upstream's
``responsestore/redis_store.go``: one string per response, ``<key_prefix>response:<id>``,
holding its record as JSON and expiring after ``ttl_seconds``; several routers sharing one
Redis see each other's responses, and they survive a router's restart.

A Redis that cannot be reached or answers an error is a 503 ``response_store_unavailable``
(retryable) for the request that needed it: a response is never answered as stored when it was
not, and a lookup never reads a Redis failure as "no such response".
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from vllm_sr.router.redis_client import redis_client as shared_redis_client
from vllm_sr.router.responses.store import DEFAULT_TTL_S, Record, StoreUnavailable

if TYPE_CHECKING:
    from vllm_sr.config.upstream_global import ResponseAPIRedis

RESPONSE_KEY = "response:"  # upstream's ResponseKeyPrefix


def redis_client(settings: ResponseAPIRedis) -> tuple[aioredis.Redis, str]:
    """The client and key prefix for upstream's settings (a zero is upstream's default)."""
    read = settings.read_timeout or 3
    write = settings.write_timeout or 3
    client = shared_redis_client(
        settings.address or None,
        db=settings.db,
        password=settings.password or None,
        # redis-py has one timeout per command, upstream a read and a write one
        timeout_s=None if -1 in (read, write) else float(max(read, write)),
        connect_timeout_s=float(settings.dial_timeout or 5),
        retries={-1: 0, 0: 3}.get(settings.max_retries, settings.max_retries),
        max_connections=settings.pool_size or 10,
    )
    prefix = settings.key_prefix if settings.key_prefix.endswith(":") else settings.key_prefix + ":"
    return client, prefix


class RedisResponseStore:
    kind = "redis"

    def __init__(self, client: aioredis.Redis, prefix: str, ttl_s: float) -> None:
        self.client = client
        self.prefix = prefix
        self.ttl_s = int(ttl_s or DEFAULT_TTL_S)

    def _key(self, response_id: str) -> str:
        return f"{self.prefix}{RESPONSE_KEY}{response_id}"

    async def put(self, record: Record) -> None:
        try:
            await self.client.set(self._key(str(record["id"])), json.dumps(record), ex=self.ttl_s)
        except (RedisError, OSError) as exc:
            raise _down(exc) from None

    async def get(self, response_id: str) -> Record | None:
        try:
            raw = await self.client.get(self._key(response_id))
        except (RedisError, OSError) as exc:
            raise _down(exc) from None
        if raw is None:
            return None
        try:
            doc = json.loads(raw)
        except ValueError:
            return None  # not one of ours
        return doc if isinstance(doc, dict) else None

    async def delete(self, response_id: str) -> bool:
        try:
            return bool(await self.client.delete(self._key(response_id)))
        except (RedisError, OSError) as exc:
            raise _down(exc) from None

    def usage(self) -> int | None:
        return None  # shared with other routers: Redis's own INFO says

    async def close(self) -> None:
        await self.client.aclose()


def _down(exc: BaseException) -> StoreUnavailable:
    return StoreUnavailable(
        f"the Responses API's Redis store cannot be used: {type(exc).__name__}: {exc}",
        retry_after_s=1.0,
    )
