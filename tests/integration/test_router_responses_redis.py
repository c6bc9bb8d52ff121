"""The Responses API's Redis store on a real redis-server (Debian's, started on a temp unix
socket and stopped after): two routers sharing one Redis serve and chain each other's
responses; a response outlives its router (a new store reads it); keys are upstream's
``<key_prefix>response:<id>`` with the TTL; with Redis down a lookup is a 503, never a 404."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import redis

from tests.integration.test_router_cache_redis import redis_server, redis_socket  # noqa: F401
from tests.support.backends import StandInBackend
from tests.support.redis_server import HAVE_REDIS, RedisServer
from tests.support.router_app import AUTO, providers_on, serve_routes, start_router
from vllm_sr.config.routing import Routing
from vllm_sr.config.upstream_global import ResponseAPI
from vllm_sr.router.chat import ChatRouter
from vllm_sr.router.metrics import RouterCollector
from vllm_sr.router.responses.api import ResponsesAPI, build_store

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not HAVE_REDIS, reason="needs redis-server")]
TTL_S = 120


def settings(sock: Path) -> ResponseAPI:
    return ResponseAPI.model_validate(
        {
            "store_backend": "redis",
            "ttl_seconds": TTL_S,
            "redis": {"address": f"unix://{sock}", "key_prefix": "vsr:test", "read_timeout": 1},
        }
    )


@dataclass
class Pods:
    backend: StandInBackend
    chat: ChatRouter
    apis: list[ResponsesAPI]
    clients: list[openai.AsyncOpenAI]


@pytest.fixture
async def pods(redis_socket: Path) -> AsyncIterator[Pods]:  # noqa: F811
    backend = await StandInBackend("llm").start()
    chat = await start_router(providers_on(backend), Routing())
    apis = [ResponsesAPI(build_store(settings(redis_socket))) for _ in range(2)]
    served = [
        await serve_routes(
            {**chat.routes(), **api.routes(lambda: chat)}, cancel_on_disconnect=False
        )
        for api in apis
    ]
    try:
        yield Pods(backend, chat, apis, [one.client() for one in served])
    finally:
        for one in served:
            await one.close()
        for api in apis:
            await api.store.close()
        await chat.backends.close()
        await backend.stop()


async def test_two_routers_share_and_chain_responses(pods: Pods, redis_socket: Path) -> None:  # noqa: F811
    a, b = pods.clients
    first = await a.responses.create(model=AUTO, input="turn one", instructions="Be kind.")
    got = await b.responses.retrieve(first.id)
    assert got.output_text == "llm got: turn one"
    second = await b.responses.create(model=AUTO, input="turn two", previous_response_id=first.id)
    assert pods.backend.received[-1].body["messages"] == [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "turn one"},
        {"role": "assistant", "content": "llm got: turn one"},
        {"role": "user", "content": "turn two"},
    ]
    keys = redis.Redis(unix_socket_path=str(redis_socket))
    key = f"vsr:test:response:{second.id}"
    assert keys.exists(key) == 1 and 0 < keys.ttl(key) <= TTL_S
    items = await a.responses.input_items.list(second.id)
    assert [i.content[0].text for i in items.data] == ["turn two"]
    await a.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        await b.responses.retrieve(first.id)


async def test_a_response_outlives_its_router(pods: Pods, redis_socket: Path) -> None:  # noqa: F811
    made = await pods.clients[0].responses.create(model=AUTO, input="remember me")
    await pods.apis[0].store.close()  # the router goes away; a new one starts on the same Redis
    pods.apis[0].store = build_store(settings(redis_socket))
    got = await pods.clients[0].responses.retrieve(made.id)
    assert got.output_text == "llm got: remember me"


async def test_redis_down_is_a_503_never_a_404(
    pods: Pods,
    redis_server: RedisServer,  # noqa: F811
) -> None:
    made = await pods.clients[0].responses.create(model=AUTO, input="before the outage")
    redis_server.kill()
    with pytest.raises(openai.InternalServerError) as err:
        await pods.clients[1].responses.retrieve(made.id)
    assert err.value.status_code == 503
    assert "response_store_unavailable" in str(err.value.body)
    with pytest.raises(openai.InternalServerError):
        await pods.clients[1].responses.create(
            model=AUTO, input="more", previous_response_id=made.id
        )
    # a request that chains onto nothing is still answered; it says it was not stored
    answered = await pods.clients[1].responses.create(model=AUTO, input="during the outage")
    assert answered.output_text == "llm got: during the outage" and answered.store is False
    assert pods.apis[1].store_failures == 1
    collector = RouterCollector(lambda: pods.chat, lambda: pods.apis[1])
    families = {f.name: f for f in collector.collect()}
    (failed,) = families["vllm_sr_router_responses_store_failures"].samples
    assert failed.labels == {"store": "redis"} and failed.value == 1
    (stored,) = families["vllm_sr_router_responses_stored"].samples
    assert stored.value == 0  # this router stored nothing: its one write failed
