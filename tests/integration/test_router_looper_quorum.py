"""A looper call cancelled because its round reached its quorum is not its backend's fault: on
real sockets, a fusion panel of a fast model and a slow one (two backends that hold every chat,
ejection after one 5xx), its quorum one answer. The slow model's calls are cut off each time;
they count as requests, never as errors (the inventory, ``vllm_sr_backend_errors``) nor toward
ejection, and the backends stay healthy."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import openai
import pytest

from tests.support.backends import StandInBackend
from tests.support.router_app import AUTO, Served, serve_routes, start_router
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.router.chat import ChatRouter
from vllm_sr.router.metrics import backend_families

ROUTING = {
    "signals": {"keywords": [{"name": "fuse", "operator": "OR", "keywords": ["fuse"]}]},
    "decisions": [
        {
            "name": "fuse",
            "priority": 10,
            "rules": {"operator": "AND", "conditions": [{"type": "keyword", "name": "fuse"}]},
            "modelRefs": [{"model": "fast"}, {"model": "slow"}],
            "algorithm": {
                "type": "fusion",
                "fusion": {
                    "model": "fast",
                    "analysis_models": ["fast", "slow"],
                    "min_successful_responses": 1,
                    "include_intermediate_responses": True,
                },
            },
        }
    ],
}


@dataclass
class Stack:
    fast: StandInBackend
    slow: list[StandInBackend]
    chat: ChatRouter
    client: openai.AsyncOpenAI


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    fast = await StandInBackend("fast").start()
    slow = [await StandInBackend(f"slow{i}").start() for i in range(2)]
    for backend in slow:
        backend.hold = asyncio.Event()  # answers only once the test is over
    fast.hold = asyncio.Event()  # answers once the slow call has reached its backend
    providers = Providers.model_validate(
        {
            "defaults": {"default_model": "fast"},
            "models": [
                {"name": "fast", "backend_refs": [{"endpoint": fast.endpoint}]},
                {
                    "name": "slow",
                    "backend_refs": [{"endpoint": b.endpoint} for b in slow],
                    "reliability": {"consecutive_5xx": 1, "max_ejection_percent": 100},
                },
            ],
        }
    )
    chat = await start_router(providers, Routing.model_validate(ROUTING))
    served: Served = await serve_routes(chat.routes())
    try:
        yield Stack(fast, slow, chat, served.client())
    finally:
        for backend in [fast, *slow]:
            assert backend.hold is not None
            backend.hold.set()
        await served.close()
        await chat.backends.close()
        for backend in [fast, *slow]:
            await backend.stop()


async def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def fuse(stack: Stack, asked_before: int) -> str:
    """One fused chat; the fast model answers once the slow one's call is at its backend."""
    assert stack.fast.hold is not None
    stack.fast.hold.clear()

    async def release_fast() -> None:
        await wait_for(lambda: sum(len(b.received) for b in stack.slow) > asked_before)
        assert stack.fast.hold is not None
        stack.fast.hold.set()

    releasing = asyncio.ensure_future(release_fast())
    try:
        raw = await stack.client.chat.completions.with_raw_response.create(
            model=AUTO, messages=[{"role": "user", "content": "fuse this"}]
        )
    finally:
        await releasing
    assert raw.headers["x-vsr-looper-algorithm"] == "fusion"
    return raw.parse().choices[0].message.content or ""


def metric(chat: ChatRouter, name: str, model: str) -> float:
    return sum(
        sample.value
        for family in backend_families(chat)
        for sample in family.samples
        if sample.name == name and sample.labels["model"] == model
    )


async def test_a_call_cut_off_at_the_quorum_is_not_a_backend_error(stack: Stack) -> None:
    for asked in range(3):  # more cut-off calls than consecutive_5xx
        text = await fuse(stack, asked)
        assert text.startswith("fast got: You are the Fusion calling model")
        assert "Response 1 (fast)" in text and "(slow)" not in text
    backends = stack.chat.backends
    slow = backends.models["slow"]
    assert sum(len(b.received) for b in stack.slow) == 3  # each call reached a backend
    assert [b.inflight for b in slow] == [0, 0]
    assert sum(b.requests for b in slow) == 3
    assert [b.errors for b in slow] == [0, 0]
    assert metric(stack.chat, "vllm_sr_backend_requests_total", "slow") == 3
    assert metric(stack.chat, "vllm_sr_backend_errors_total", "slow") == 0
    assert [backends.outliers["slow"].ejected(b.index) for b in slow] == [False, False]
    assert all(backends.usable(b) for b in slow)
    assert [b.health.failures for b in slow] == [0, 0]
