"""The latency_aware and multi_factor selectors end to end: the Router-mode handlers in our
HTTP server, real stand-in OpenAI-compatible backends with think times, the official openai
SDK as the client. latency_aware moves traffic to the model whose answers (streamed ones
included) came faster; multi_factor's weights pick by quality or by price, and its SLO filter
drops a model once its observed TTFT breaks the ceiling. ``/api/v1/eval`` previews the same
choice, and the inventory shows what was observed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import pytest

from tests.support.backends import StandInBackend
from tests.support.router_app import AUTO, Served, serve_routes, start_router
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.router.chat import ChatRouter

THINK_S = 0.25  # the slow stand-in's think time before each answer


def keyword_decision(name: str, algorithm: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "priority": 10,
        "rules": {"operator": "AND", "conditions": [{"type": "keyword", "name": name}]},
        "modelRefs": [{"model": "slow"}, {"model": "fast"}],
        "algorithm": algorithm,
    }


ROUTING = {
    "modelCards": [
        {"name": "slow", "quality_score": 0.9},
        {"name": "fast", "quality_score": 0.3},
    ],
    "signals": {
        "keywords": [
            {"name": n, "operator": "OR", "keywords": [n]}
            for n in ("speed", "quality", "cheap", "guarded")
        ]
    },
    "decisions": [
        keyword_decision(
            "speed",
            {
                "type": "latency_aware",
                "latency_aware": {"tpot_percentile": 50, "ttft_percentile": 50},
            },
        ),
        keyword_decision(
            "quality",
            {"type": "multi_factor", "multi_factor": {"weights": {"quality": 1, "cost": 0.1}}},
        ),
        keyword_decision(
            "cheap",
            {"type": "multi_factor", "multi_factor": {"weights": {"quality": 0.1, "cost": 1}}},
        ),
        keyword_decision(
            "guarded",
            {
                "type": "multi_factor",
                "multi_factor": {
                    "weights": {"quality": 1, "cost": 0.1},
                    "slo": {"max_ttft_ms": THINK_S * 1000 / 2},
                    "latency_percentile": 50,
                },
            },
        ),
    ],
}


@dataclass
class Stack:
    slow: StandInBackend
    fast: StandInBackend
    chat: ChatRouter
    served: Served
    client: openai.AsyncOpenAI


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    slow = await StandInBackend("slow").start()
    slow.fault, slow.slow_s = "slow", THINK_S
    fast = await StandInBackend("fast").start()
    providers = Providers.model_validate(
        {
            "defaults": {"default_model": "slow"},
            "models": [
                {
                    "name": "slow",
                    "pricing": {"prompt_per_1m": 10.0},
                    "backend_refs": [{"endpoint": slow.endpoint}],
                },
                {
                    "name": "fast",
                    "pricing": {"prompt_per_1m": 1.0},
                    "backend_refs": [{"endpoint": fast.endpoint}],
                },
            ],
        }
    )
    chat = await start_router(providers, Routing.model_validate(ROUTING))
    served = await serve_routes(chat.routes())
    try:
        yield Stack(slow, fast, chat, served, served.client())
    finally:
        await served.close()
        await chat.backends.close()
        await slow.stop()
        await fast.stop()


async def ask(
    client: openai.AsyncOpenAI, text: str, model: str = AUTO, stream: bool = False
) -> Any:
    raw: Any = await client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": text}], stream=stream
    )
    if stream:
        parts = [c.choices[0].delta.content or "" async for c in raw.parse() if c.choices]
        assert "".join(parts)
    else:
        assert raw.parse().choices[0].message.content
    return raw.headers


async def evaluate(stack: Stack, text: str) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{stack.served.url}/api/v1/eval", json={"text": text}) as answer,
    ):
        assert answer.status == 200
        doc = await answer.json()
        assert isinstance(doc, dict)
        return doc


async def test_latency_aware_moves_traffic_to_the_faster_model(stack: Stack) -> None:
    # no observations: the first modelRef (slow)
    headers = await ask(stack.client, "speed please")
    assert headers["x-vsr-selected-model"] == "slow"
    assert headers["x-vsr-selected-algorithm"] == "latency_aware"
    # fast has no observations yet: it is not a candidate (upstream's rule)
    headers = await ask(stack.client, "speed please", stream=True)
    assert headers["x-vsr-selected-model"] == "slow"
    # one streamed chat asked of fast by name is observed too
    await ask(stack.client, "hello", model="fast", stream=True)
    seen = stack.chat.inventory()["selection"]
    assert seen["fast"]["ttft"]["samples"] == 1 and seen["fast"]["tpot"]["samples"] == 1
    assert seen["slow"]["ttft"]["samples"] == 2
    assert seen["slow"]["ttft"]["p50_ms"] >= THINK_S * 1000 > seen["fast"]["ttft"]["p50_ms"]
    for stream in (False, True):
        headers = await ask(stack.client, "speed please", stream=stream)
        assert headers["x-vsr-selected-model"] == "fast"
        assert headers["x-vsr-selected-algorithm"] == "latency_aware"
    doc = await evaluate(stack, "speed please")
    assert doc["decision_result"]["algorithm"] == "latency_aware"
    assert (doc["selection_status"], doc["selection_method"]) == ("selected", "latency_aware")
    assert doc["selected_model"] == "fast"
    assert len(stack.fast.received) == 3


async def test_multi_factor_weights_and_slo_filter(stack: Stack) -> None:
    # nothing observed yet: the SLO drops nobody and quality wins the guarded decision
    doc = await evaluate(stack, "guarded please")
    assert (doc["selected_model"], doc["selection_method"]) == ("slow", "multi_factor")
    # weights: quality first -> slow (0.9); price first -> fast ($1 against $10)
    assert (await ask(stack.client, "quality please"))["x-vsr-selected-model"] == "slow"
    headers = await ask(stack.client, "cheap please")
    assert headers["x-vsr-selected-model"] == "fast"
    assert headers["x-vsr-selected-algorithm"] == "multi_factor"
    doc = await evaluate(stack, "quality please")
    assert (doc["selection_status"], doc["selection_method"]) == ("selected", "multi_factor")
    assert doc["selected_model"] == "slow"
    # the SLO: slow's observed TTFT (its think time) is above the guarded decision's ceiling,
    # so slow is dropped and the quality-weighted decision goes to fast
    headers = await ask(stack.client, "guarded please")
    assert headers["x-vsr-selected-model"] == "fast"
    assert headers["x-vsr-selected-algorithm"] == "multi_factor"
    doc = await evaluate(stack, "guarded please")
    assert (doc["selected_model"], doc["selection_status"]) == ("fast", "selected")
    assert "slow:ttft_p50=" in doc["selection_reason"]
    assert len(stack.slow.received) == 1
