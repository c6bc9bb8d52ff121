"""The redis learning state store (``global.router.learning.state_store.backend: redis``):
several router processes share each conversation's protection state, so a conversation keeps
its model whichever router takes its next turn.

One string per conversation, ``<key_prefix><identity>`` (default prefix upstream's
``vsr:router-session:v1:``), holding the state's JSON with its wall-clock ``last_seen``, and
expiring ``ttl_seconds`` after the last write (default 24 h). Every operation is bounded by
``timeout_ms`` (default 50 ms, upstream's); a store that fails or is slower is skipped (the
router's own copy is used: fail open) and the failure counted."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from vllm_sr.jsontypes import JsonObject, json_object
from vllm_sr.router.redis_client import redis_client

if TYPE_CHECKING:
    from vllm_sr.config.upstream_learning import LearningStateStore

log = logging.getLogger("vllm_sr.router.learning")

DEFAULT_PREFIX = "vsr:router-session:v1:"
DEFAULT_TIMEOUT_S = 0.050
DEFAULT_TTL_S = 24 * 3600


class SharedConversations:
    def __init__(
        self,
        address: str | None,
        *,
        password: str | None = None,
        database: int = 0,
        key_prefix: str | None = None,
        timeout_s: float | None = None,
        ttl_s: float | None = None,
    ) -> None:
        timeout = timeout_s or DEFAULT_TIMEOUT_S
        self.prefix = key_prefix or DEFAULT_PREFIX
        self.ttl_ms = int((ttl_s or DEFAULT_TTL_S) * 1000)
        self.errors = 0
        # No retries: a store that is down must cost a chat one failed attempt, not a backoff.
        self.client = redis_client(address, db=database, password=password, timeout_s=timeout)

    @classmethod
    def from_config(cls, store: LearningStateStore) -> SharedConversations:
        """From a ``state_store`` whose backend is redis (validation requires its address)."""
        from vllm_sr.config.upstream_learning import LearningRedis

        redis = store.redis or LearningRedis()
        timeout_ms = store.timeout_ms
        return cls(
            redis.address,
            password=redis.password,
            database=redis.database or 0,
            key_prefix=redis.key_prefix,
            timeout_s=timeout_ms / 1000.0 if timeout_ms else None,
            ttl_s=store.ttl_seconds or None,
        )

    async def load(self, key: str) -> JsonObject | None:
        """The conversation's stored state, None when absent, unreadable or the store failed."""
        try:
            raw = await self.client.get(self.prefix + key)
        except (RedisError, OSError) as exc:
            self._failed("load", exc)
            return None
        if raw is None:
            return None
        try:
            doc = json.loads(raw)
        except ValueError:
            return None
        return json_object(doc)

    async def save(self, key: str, doc: JsonObject) -> None:
        try:
            await self.client.set(self.prefix + key, json.dumps(doc), px=self.ttl_ms)
        except (RedisError, OSError) as exc:
            self._failed("save", exc)

    def _failed(self, op: str, exc: BaseException) -> None:
        self.errors += 1
        log.warning("learning state store %s failed (served from this router's copy): %s", op, exc)

    async def close(self) -> None:
        await self.client.aclose()
