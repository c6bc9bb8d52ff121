"""The Redis response-cache store on a real redis-server (Debian's, started here on a temp unix
socket and stopped after): two routers sharing one Redis serve each other's entries, exact and
semantic; with Redis down a chat is served uncached and the failure counted."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import openai
import pytest
import redis

from tests.integration.test_router_plugins import AUTO, DECISIONS, SIGNALS
from tests.support.backends import StandInBackend
from tests.support.redis_server import HAVE_REDIS, RedisServer, redis_process
from tests.support.router_app import serve_routes, start_router
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.config.schema import GlobalSection
from vllm_sr.router.chat import ChatRouter

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not HAVE_REDIS, reason="needs redis-server")]


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_process(tmp_path) as server:
        yield server


@pytest.fixture
def redis_socket(redis_server: RedisServer) -> Path:
    assert redis_server.sock is not None
    return redis_server.sock


@pytest.fixture
async def pods(
    redis_socket: Path,
) -> AsyncIterator[tuple[list[ChatRouter], list[openai.AsyncOpenAI], StandInBackend, Path]]:
    general = await StandInBackend("general").start()
    coder = await StandInBackend("coder").start()
    providers = Providers.model_validate(
        {
            "defaults": {"default_model": "general"},
            "models": [
                {"name": "general", "backend_refs": [{"endpoint": general.endpoint}]},
                {"name": "coder", "backend_refs": [{"endpoint": coder.endpoint}]},
                {"name": "broken", "backend_refs": [{"endpoint": coder.endpoint}]},
                {"name": "dead", "backend_refs": [{"endpoint": coder.endpoint}]},
            ],
        }
    )
    routing = Routing.model_validate({"signals": SIGNALS, "decisions": DECISIONS})
    global_ = GlobalSection.model_validate(
        {
            "stores": {
                "response_cache": {
                    "backend_type": "redis",
                    "redis": {"url": f"unix://{redis_socket}"},
                }
            }
        }
    )
    chats, clients, served = [], [], []
    for _ in range(2):  # two router pods, each with its own backends and exchange
        chat = await start_router(providers, routing, global_=global_)
        one = await serve_routes(chat.routes())
        chats.append(chat)
        clients.append(one.client(headers={"x-authz-user-id": "alice"}))
        served.append(one)
    try:
        yield chats, clients, general, redis_socket
    finally:
        for one in served:
            await one.close()
        for chat in chats:
            await chat.backends.close()
            if chat.cache is not None:
                await chat.cache.store.close()
        await general.stop()
        await coder.stop()


async def test_two_routers_share_exact_and_semantic_entries(pods) -> None:  # type: ignore[no-untyped-def]
    (a, b), (ca, cb), general, _ = pods
    assert a.cache is not None and a.cache.store.kind == "redis"
    first = await ca.chat.completions.with_raw_response.create(
        model=AUTO, messages=[{"role": "user", "content": "cacheme shared between pods"}]
    )
    started = time.monotonic()
    hit = await cb.chat.completions.with_raw_response.create(
        model=AUTO, messages=[{"role": "user", "content": "cacheme shared between pods"}]
    )
    assert time.monotonic() - started < 1.0
    assert hit.headers["x-vsr-cache-hit"] == "true"
    assert hit.parse().choices[0].message.content == first.parse().choices[0].message.content
    assert len(general.received) == 1
    # semantic: written by pod a, found by pod b with a different exact text
    await ca.chat.completions.create(
        model=AUTO, messages=[{"role": "user", "content": "I was charged twice for my order"}]
    )
    sem = await cb.chat.completions.with_raw_response.create(
        model=AUTO, messages=[{"role": "user", "content": "I was charged twice for my order!"}]
    )
    assert sem.headers["x-vsr-cache-hit"] == "true"
    assert b.cache is not None and b.cache.stats.hits[("billing", "semantic")] == 1


async def test_redis_down_serves_uncached_and_counts(pods, redis_server) -> None:  # type: ignore[no-untyped-def]
    (a, _), (ca, _), general, _ = pods
    redis_server.kill()
    for _ in range(2):
        answer = await ca.chat.completions.create(
            model=AUTO, messages=[{"role": "user", "content": "cacheme while redis is down"}]
        )
        assert answer.choices[0].message.content == "general got: cacheme while redis is down"
    assert len(general.received) == 2
    assert a.cache is not None and a.cache.stats.errors["redis"] >= 2


async def test_a_value_that_is_not_an_entry_is_a_miss(pods) -> None:  # type: ignore[no-untyped-def]
    (_, b), (ca, cb), general, sock = pods
    await ca.chat.completions.create(
        model=AUTO, messages=[{"role": "user", "content": "cacheme then garbage"}]
    )
    r = redis.Redis(unix_socket_path=str(sock))
    keys = r.keys("vsr:rc:e:*")
    assert keys  # pod a wrote its entry
    for key in keys:
        r.set(key, b"not an entry")
    answer = await cb.chat.completions.with_raw_response.create(
        model=AUTO, messages=[{"role": "user", "content": "cacheme then garbage"}]
    )
    assert "x-vsr-cache-hit" not in answer.headers
    assert len(general.received) == 2
    assert b.cache is not None and not b.cache.stats.errors
