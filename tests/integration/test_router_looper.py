"""The confidence looper end to end: the Router-mode handlers in our HTTP server, real
stand-in backends that return logprobs when asked (one with a think time), the official openai
SDK as the client. The loop escalates from the small model to the big one when the small one
is unsure, streams the final answer when asked, sums the usage, reports upstream's
``x-vsr-looper-*`` headers and counts per algorithm, and stops at the caller's deadline; a
backend that fails mid-loop is passed over (on_error: skip) or ends the loop (fail)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from tests.support.backends import StandInBackend
from tests.support.router_app import AUTO, Served, serve_routes, start_router
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.router.chat import ChatRouter
from vllm_sr.wire import DEADLINE_HEADER

THINK_S = 0.05  # the big stand-in's think time


def decision(name: str, block: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "priority": 10,
        "rules": {"operator": "AND", "conditions": [{"type": "keyword", "name": name}]},
        "modelRefs": [{"model": "big"}, {"model": "small"}],
        "algorithm": {"type": "confidence", "confidence": block},
    }


ROUTING = {
    "modelCards": [{"name": "big", "param_size": "70b"}, {"name": "small", "param_size": "8b"}],
    "signals": {
        "keywords": [
            {"name": n, "operator": "OR", "keywords": [n]} for n in ("cascade", "strict", "masked")
        ]
    },
    "decisions": [
        decision(
            "cascade",
            {
                "confidence_method": "hybrid",
                "threshold": 0.72,
                "escalation_order": "small_to_large",
            },
        ),
        decision("strict", {"threshold": 0.72, "on_error": "fail"}),
        {
            **decision("masked", {"threshold": 0.72, "escalation_order": "small_to_large"}),
            "plugins": [{"type": "masking", "configuration": {"enabled": True}}],
        },
    ],
}


@dataclass
class Stack:
    big: StandInBackend
    small: StandInBackend
    chat: ChatRouter
    served: Served
    client: openai.AsyncOpenAI


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    big = await StandInBackend("big").start()
    big.fault, big.slow_s, big.token_prob = "slow", THINK_S, 0.95
    small = await StandInBackend("small").start()
    providers = Providers.model_validate(
        {
            "defaults": {"default_model": "big"},
            "models": [
                {"name": m.name, "backend_refs": [{"endpoint": m.endpoint}]} for m in (big, small)
            ],
        }
    )
    chat = await start_router(providers, Routing.model_validate(ROUTING))
    served = await serve_routes(chat.routes())
    try:
        yield Stack(big, small, chat, served, served.client())
    finally:
        await served.close()
        await chat.backends.close()
        await big.stop()
        await small.stop()


async def ask(stack: Stack, text: str, stream: bool = False) -> tuple[str, Any, Any]:
    options: Any = {"include_usage": True} if stream else None
    raw: Any = await stack.client.chat.completions.with_raw_response.create(
        model=AUTO,
        messages=[{"role": "user", "content": text}],
        stream=stream,
        stream_options=options,
    )
    if stream:
        chunks = [c async for c in raw.parse()]
        text_out = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        usage = [c.usage for c in chunks if c.usage is not None]
        return text_out, raw.headers, usage[-1] if usage else None
    parsed = raw.parse()
    return parsed.choices[0].message.content, raw.headers, parsed


async def test_a_looper_decisions_internal_calls_get_the_masked_request(stack: Stack) -> None:
    text, headers, _ = await ask(stack, "masked: mail john.doe@example.com")
    assert headers["x-vsr-looper-models-used"] == "small,big"
    sent = "masked: mail [EMAIL_ADDRESS_0]"
    assert text == f"big got: {sent}"
    for got in (stack.small.received[-1].body, stack.big.received[-1].body):
        assert got["messages"][-1]["content"] == sent


async def test_unsure_small_model_escalates_to_the_big_one(stack: Stack) -> None:
    text, headers, parsed = await ask(stack, "cascade please")
    assert text == "big got: cascade please"
    assert headers["x-vsr-looper-algorithm"] == "confidence"
    assert headers["x-vsr-looper-models-used"] == "small,big"
    assert headers["x-vsr-looper-iterations"] == "2"
    assert headers["x-vsr-looper-model"] == "big"
    assert headers["x-vsr-selected-model"] == "big"
    assert int(headers["x-vsr-looper-latency-ms"]) >= THINK_S * 1000
    assert headers["x-vsr-looper-total-tokens"] == "4" and parsed.usage.total_tokens == 4
    # the internal calls asked for logprobs (and top_logprobs for the margin), not streamed
    for got in (stack.small.received[-1].body, stack.big.received[-1].body):
        assert got["logprobs"] is True and got["top_logprobs"] == 2 and got["stream"] is False
    # the caller did not ask for logprobs
    assert parsed.choices[0].logprobs is None
    stats = stack.chat.stats
    assert stats.looper_runs[("confidence", "ok")] == 1
    assert stats.looper_calls[("confidence", "small")] == 1
    assert stats.looper_iterations["confidence"] == 2


async def test_sure_small_model_stops_the_loop_and_streams(stack: Stack) -> None:
    stack.small.token_prob = 0.99
    text, headers, usage = await ask(stack, "cascade please", stream=True)
    assert text == "small got: cascade please"
    assert headers["x-vsr-looper-models-used"] == "small"
    assert not stack.big.received
    assert usage is not None and usage.total_tokens == 2


async def test_backend_failing_mid_loop(stack: Stack) -> None:
    stack.small.fault = "503"
    # skip: the failing small model is passed over, the big one answers
    text, headers, _ = await ask(stack, "cascade please", stream=True)
    assert text == "big got: cascade please"
    assert headers["x-vsr-looper-models-used"] == "big"
    # fail: the loop ends with the failure (the chat's own fallback to the default model
    # answers the internal call to small, so take the default down too)
    stack.big.fault = "503"
    with pytest.raises(openai.APIStatusError) as err:
        await ask(stack, "strict please")
    assert err.value.status_code >= 500
    assert stack.chat.stats.looper_runs[("confidence", "error")] == 1


async def test_callers_deadline_bounds_the_loop(stack: Stack) -> None:
    stack.big.slow_s = 2.0  # the big model would answer long after the caller's deadline
    raw: Any = await stack.client.chat.completions.with_raw_response.create(
        model=AUTO,
        messages=[{"role": "user", "content": "cascade please"}],
        extra_headers={DEADLINE_HEADER: "300"},
    )
    # the unsure small answer is the best the loop got within the deadline
    assert raw.parse().choices[0].message.content == "small got: cascade please"
    assert raw.headers["x-vsr-looper-models-used"] == "small"
    assert int(raw.headers["x-vsr-looper-latency-ms"]) < 2000
