"""router_replay's stores (``global.services.router_replay.store_backend``): memory, redis,
postgres (``store``, ``redis_store``, ``postgres_store``), and the writer that keeps a store
that is down from ever failing a chat (``writer``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.router.replay.store import MemoryReplayStore, ReplayStore
from vllm_sr.router.replay.writer import ReplayWriter

if TYPE_CHECKING:
    from vllm_sr.config.router_replay import RouterReplay


def build_store(conf: RouterReplay | None, clock: Clock = SYSTEM_CLOCK) -> ReplayStore:
    """The store ``conf`` (a ``RouterReplay``, None: memory without TTL) names; the redis and
    postgres clients are imported only when used."""
    if conf is None:
        return MemoryReplayStore(0, clock)
    backend = conf.backend
    if backend == "redis":
        from vllm_sr.router.replay.redis_store import RedisReplayStore

        return RedisReplayStore.from_config(conf.redis, conf.ttl_seconds)
    if backend == "postgres":
        from vllm_sr.router.replay.postgres_store import PostgresReplayStore

        return PostgresReplayStore(conf.postgres, conf.ttl_seconds, clock)
    # milvus and qdrant are refused at load
    return MemoryReplayStore(conf.ttl_seconds, clock)


def build_writer(conf: RouterReplay | None, clock: Clock = SYSTEM_CLOCK) -> ReplayWriter:
    async_writes = conf is not None and conf.async_writes
    return ReplayWriter(build_store(conf, clock), async_writes=async_writes, clock=clock)
