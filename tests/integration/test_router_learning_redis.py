"""Router Learning's redis state store on a real redis-server (Debian's, started here on a free
TCP port and stopped after): two routers (each its own process state and its own monotonic
clock, the same wall clock) take turns of one conversation and hold it on its model as one
router would; idle time carries across them; with Redis down the chat is served from the
router's own copy and the failure counted."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.integration.test_router_learning import (
    ROUTING,
    Conversation,
    learning,
    picked,
)
from tests.integration.test_serve import free_port
from tests.support.backends import StandInBackend
from tests.support.redis_server import HAVE_REDIS, redis_process
from tests.support.router_app import providers_on, serve_routes, start_router
from vllm_sr.clock import FakeClock
from vllm_sr.config.routing import Routing
from vllm_sr.config.schema import GlobalSection
from vllm_sr.router.chat import ChatRouter
from vllm_sr.router.learning.state import LearningState
from vllm_sr.router.metrics import RouterCollector

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not HAVE_REDIS, reason="needs redis-server")]


@pytest.fixture
def redis_port(tmp_path: Path) -> Iterator[int]:
    with redis_process(tmp_path, port=free_port()) as server:
        assert server.port is not None
        yield server.port


class Pod:
    """One router: its own learning state and clock, on the shared backends' endpoints."""

    def __init__(self, chat: ChatRouter, clock: FakeClock, st: Any) -> None:
        self.chat, self.clock, self.st = chat, clock, st


@pytest.fixture
async def pods(redis_port: int) -> AsyncIterator[tuple[Any, Any, Callable[[float], None]]]:
    a = await StandInBackend("a").start()
    b = await StandInBackend("b").start()
    providers = providers_on(a, b)
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
        chat = await start_router(
            providers,
            Routing.model_validate(ROUTING),
            global_=GlobalSection.model_validate({"router": {"learning": block}}),
            learning_state=LearningState(clock=clock),
        )
        served = await serve_routes(chat.routes(), cancel_on_disconnect=False)
        made.append((chat, clock, served.client(), served))

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
        for chat, _clock, _client, served in made:
            await served.close()
            await chat.learning.state.close()
            await chat.backends.close()
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
