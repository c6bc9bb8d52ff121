"""Router Learning's redis state store on a real redis-server (Debian's, started here on a free
TCP port and stopped after): two routers (each its own process state and its own monotonic
clock, the same wall clock) take turns of one conversation and hold it on its model as one
router would; idle time carries across them; with Redis down the chat is served from the
router's own copy and the failure counted."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import redis

from tests.integration.test_router_learning import (
    AUTO,
    ROUTING,
    Conversation,
    learning,
    picked,
)
from tests.integration.test_serve import free_port
from tests.support.backends import FakeWorkerExchange, StandInBackend
from vllm_sr.clock import FakeClock
from vllm_sr.config.routing import Providers, Routing
from vllm_sr.config.schema import GlobalSection
from vllm_sr.httpserver import HttpServer, Request, Response, StreamResponse, resolve
from vllm_sr.router.backends import BackendSet
from vllm_sr.router.chat import ChatRouter, build_chat_router
from vllm_sr.router.learning.state import LearningState
from vllm_sr.router.metrics import RouterCollector

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]


@pytest.fixture
def redis_port(tmp_path: Path) -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                if redis.Redis(port=port).ping():
                    break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
            time.sleep(0.02)
        yield port
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


class Pod:
    """One router: its own learning state and clock, on the shared backends' endpoints."""

    def __init__(self, chat: ChatRouter, clock: FakeClock, st: Any) -> None:
        self.chat, self.clock, self.st = chat, clock, st


@pytest.fixture
async def pods(redis_port: int) -> AsyncIterator[tuple[Any, Any, Callable[[float], None]]]:
    a = await StandInBackend("a").start()
    b = await StandInBackend("b").start()
    providers = Providers.model_validate(
        {
            "defaults": {"default_model": "a"},
            "models": [
                {"name": "a", "backend_refs": [{"endpoint": a.endpoint}]},
                {"name": "b", "backend_refs": [{"endpoint": b.endpoint}]},
            ],
        }
    )
    block = learning()
    block["state_store"] = {
        "backend": "redis",
        "timeout_ms": 500,
        "redis": {"address": f"127.0.0.1:{redis_port}", "key_prefix": "t:"},
    }
    wall = 1_700_000_000.0
    clocks = [FakeClock(1000.0, wall), FakeClock(50_000.0, wall - 49_000.0)]
    made: list[tuple[Any, ...]] = []
    for clock in clocks:
        backends = BackendSet(providers)
        await backends.start(health_checks=False)
        chat = build_chat_router(
            providers,
            Routing.model_validate(ROUTING),
            exchange=FakeWorkerExchange({"primary"}),
            decision_deployment="primary",
            auto_model_names=[AUTO],
            backends=backends,
            global_=GlobalSection.model_validate({"router": {"learning": block}}),
            learning_state=LearningState(clock=clock),
        )
        routes = chat.routes()

        async def handle(request: Request, routes: Any = routes) -> Response | StreamResponse:
            return await resolve(routes, request)(request)

        server = HttpServer(handle, max_body=1 << 20, read_timeout_s=30)
        _, port = await server.listen_tcp("127.0.0.1", 0)
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0
        )
        made.append((chat, clock, client, server, backends))

    class St:  # what Conversation needs: a client
        def __init__(self, client: Any) -> None:
            self.client = client

    def advance(s: float) -> None:
        for c in clocks:
            c.advance(s)

    try:
        yield (
            Pod(made[0][0], made[0][1], St(made[0][2])),
            Pod(made[1][0], made[1][1], St(made[1][2])),
            advance,
        )
    finally:
        for chat, _clock, client, server, backends in made:
            await client.close()
            await server.close(5.0)
            await chat.learning.state.close()
            await backends.close()
        await a.stop()
        await b.stop()


def on(pod: Pod, talk: Conversation) -> Conversation:
    talk.st = pod.st
    return talk


async def test_two_routers_share_a_conversation(pods: Any, redis_port: int) -> None:
    one, two, advance = pods
    talk = Conversation(one.st, "s1", "c1")
    assert picked(await on(one, talk).say("alpha"))[0] == "a"
    # turns 2 and 3 on the other router, then back: one conversation, min turns 3
    assert picked(await on(two, talk).say("beta"))[:2] == ("a", "protection=hold_current")
    assert picked(await on(one, talk).say("beta"))[:2] == ("a", "protection=hold_current")
    assert picked(await on(two, talk).say("beta"))[:2] == ("b", "protection=allow_switch")
    keys = redis.Redis(port=redis_port).keys("t:*")
    assert keys == [b"t:s1/c1"]
    # idle on both routers' clocks: the next turn, wherever it lands, starts over
    talk2 = Conversation(one.st, "s1", "c2")
    await on(one, talk2).say("alpha")
    advance(301)
    assert picked(await on(two, talk2).say("beta"))[2] == "protection=idle_reset"


async def test_redis_down_serves_from_the_routers_own_copy(pods: Any, redis_port: int) -> None:
    one, _two, _advance = pods
    talk = Conversation(one.st, "s1", "c1")
    await on(one, talk).say("alpha")
    redis.Redis(port=redis_port).shutdown(nosave=True)
    raw = await on(one, talk).say("beta")
    assert picked(raw)[:2] == ("a", "protection=hold_current")  # this router's copy
    assert one.chat.learning.state.store_errors >= 2  # the load and the save
    families = {f.name: f for f in RouterCollector(lambda: one.chat).collect()}
    (sample,) = families["vllm_sr_router_learning_store_errors"].samples
    assert sample.value >= 2
