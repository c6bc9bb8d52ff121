"""The request-time selectors end to end: the Router-mode handlers in our HTTP server, real
stand-in OpenAI-compatible backends, the official openai SDK as the client, and the fake
worker exchange (toy embeddings: texts that share words point the same way).

- prompt: a helper model (its own stand-in) is asked through our backends and its JSON choice
  routes the chat, streamed or not; a helper that answers nonsense, fails or is too slow sends
  the chat to the first modelRef; the caller's deadline bounds the helper call (504 when it
  runs out); eval never asks the helper.
- router_dc routes by the modelCards' descriptions (asked of the decision deployment once);
  automix by quality; hybrid by its components."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from tests.support.backends import FakeWorkerExchange, StandInBackend, last_user_text
from tests.support.router_app import AUTO, Served, serve_routes, start_router
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.config.schema import GlobalSection
from vllm_sr.router.chat import ChatRouter
from vllm_sr.router.metrics import RouterCollector


class Judge(StandInBackend):
    """A helper model: for a json_object request, names ``big`` when the user text says
    "hard", else ``small``; ``reply`` overrides what it says; a fault answers as the plain
    stand-in does (slow, 503)."""

    def __init__(self) -> None:
        super().__init__("judge")
        self.reply: str | None = None
        self.bodies: list[dict[str, Any]] = []

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("response_format") != {"type": "json_object"} or self.fault is not None:
            return await super().chat(request)
        self.bodies.append(body)
        text = last_user_text(body)
        choice = {"selected_model": "big" if "hard" in text else "small", "rationale": "why"}
        content = self.reply if self.reply is not None else json.dumps(choice)
        return web.json_response(
            {
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
                "usage": {"prompt_tokens": 40, "completion_tokens": 9, "total_tokens": 49},
            }
        )


def decision(name: str, algorithm: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "priority": 10,
        "rules": {"operator": "AND", "conditions": [{"type": "keyword", "name": name}]},
        "modelRefs": [{"model": "small"}, {"model": "big"}],
        "algorithm": algorithm,
    }


ROUTING = {
    "modelCards": [
        {
            "name": "small",
            "quality_score": 0.5,
            "description": "poetry stories lyrics",
        },
        {"name": "big", "quality_score": 0.9, "description": "algebra proofs calculus"},
    ],
    "signals": {
        "keywords": [
            {"name": n, "operator": "OR", "keywords": [n]}
            for n in ("ask", "slowask", "dc", "mix", "hyb")
        ]
    },
    "decisions": [
        decision(
            "ask",
            {
                "type": "prompt",
                "prompt": {"model": "judge", "instructions": "Pick big for hard things."},
            },
        ),
        decision(
            "slowask",
            {
                "type": "prompt",
                "prompt": {"model": "judge", "instructions": "x", "timeout_seconds": 1},
            },
        ),
        decision("dc", {"type": "router_dc", "router_dc": {"temperature": 0.1}}),
        decision("mix", {"type": "automix"}),
        decision("hyb", {"type": "hybrid", "hybrid": {"cost_weight": 1.0}}),
    ],
}


@dataclass
class Stack:
    small: StandInBackend
    big: StandInBackend
    judge: Judge
    exchange: FakeWorkerExchange
    chat: ChatRouter
    served: Served
    client: openai.AsyncOpenAI


async def build(judges: int = 1, global_: GlobalSection | None = None) -> tuple[Stack, list[Judge]]:
    """The stack; the helper model ``judge`` has ``judges`` backends, retried on 5xx."""
    small = await StandInBackend("small").start()
    big = await StandInBackend("big").start()
    helpers = [Judge() for _ in range(judges)]
    for judge in helpers:
        await judge.start()
    models: list[dict[str, Any]] = [
        {
            "name": name,
            "pricing": {"prompt_per_1m": price},
            "backend_refs": [{"endpoint": b.endpoint}],
        }
        for name, price, b in (("small", 1.0, small), ("big", 10.0, big))
    ]
    models.append(
        {
            "name": "judge",
            "backend_refs": [{"endpoint": j.endpoint} for j in helpers],
            "reliability": {"retry_count": 1, "retry_on": "5xx"},
        }
    )
    providers = Providers.model_validate({"defaults": {"default_model": "small"}, "models": models})
    exchange = FakeWorkerExchange({"primary"})
    chat = await start_router(
        providers, Routing.model_validate(ROUTING), exchange=exchange, global_=global_
    )
    served = await serve_routes(chat.routes())
    return Stack(small, big, helpers[0], exchange, chat, served, served.client()), helpers


async def close(stack: Stack, helpers: list[Judge]) -> None:
    await stack.served.close()
    await stack.chat.backends.close()
    for b in (stack.small, stack.big, *helpers):
        await b.stop()


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    built, helpers = await build()
    try:
        yield built
    finally:
        await close(built, helpers)


async def ask(stack: Stack, text: str, stream: bool = False, **headers: str) -> Any:
    raw: Any = await stack.client.chat.completions.with_raw_response.create(
        model=AUTO,
        messages=[{"role": "user", "content": text}],
        stream=stream,
        extra_headers=headers or None,
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


async def test_prompt_asks_the_helper_through_our_backends(stack: Stack) -> None:
    for stream in (False, True):
        headers = await ask(stack, "ask a hard question", stream=stream)
        assert headers["x-vsr-selected-model"] == "big"
        assert headers["x-vsr-selected-algorithm"] == "prompt"
        headers = await ask(stack, "ask an easy one", stream=stream)
        assert headers["x-vsr-selected-model"] == "small"
    bodies = stack.judge.bodies
    assert len(bodies) == 4
    helper = bodies[0]
    assert helper["model"] == "judge" and helper["stream"] is False
    assert (helper["temperature"], helper["max_completion_tokens"]) == (0, 512)
    assert helper["messages"][0]["content"].startswith("Pick big for hard things.")
    assert "- big: algebra proofs calculus" in helper["messages"][0]["content"]
    assert helper["messages"][1] == {"role": "user", "content": "ask a hard question"}
    assert len(stack.big.received) == 2 and len(stack.small.received) == 2
    # the helper's answers are observed for its model, like any answer of it
    assert stack.chat.inventory()["selection"]["judge"]["ttft"]["samples"] == 4
    # eval reports execution_required and never asks the helper
    doc = await evaluate(stack, "ask a hard question")
    assert (doc["selection_status"], doc["selection_method"]) == ("execution_required", "prompt")
    assert "selected_model" not in doc
    assert len(bodies) == 4


async def test_prompt_failures_fall_back_to_the_first_model_ref(stack: Stack) -> None:
    stack.judge.reply = '{"selected_model": "gpt-9", "rationale": "mine"}'  # undeclared
    assert (await ask(stack, "ask a hard question"))["x-vsr-selected-model"] == "small"
    stack.judge.reply = "no json here"
    headers = await ask(stack, "ask a hard question", stream=True)
    assert headers["x-vsr-selected-model"] == "small"
    assert headers["x-vsr-selected-algorithm"] == "prompt"
    stack.judge.reply = None
    stack.judge.fault = "503"  # the helper's backend fails
    assert (await ask(stack, "ask a hard question"))["x-vsr-selected-model"] == "small"
    # too slow for the block's timeout_seconds (1 s): the first modelRef, after about 1 s
    stack.judge.fault, stack.judge.slow_s = "slow", 3.0
    started = time.monotonic()
    assert (await ask(stack, "slowask a hard question"))["x-vsr-selected-model"] == "small"
    assert 0.9 < time.monotonic() - started < 2.5
    assert len(stack.big.received) == 0
    # each fallback counted by method, decision and upstream's reason, on /metrics too
    families = {m.name: m for m in RouterCollector(lambda: stack.chat).collect()}
    samples = {
        (x.labels["decision"], x.labels["reason"]): x.value
        for x in families["vllm_sr_router_selector_fallbacks"].samples
        if x.name.endswith("_total")
    }
    assert samples == {
        ("ask", "selector_undeclared_candidate"): 1,
        ("ask", "selector_invalid_output"): 1,
        ("ask", "selector_invocation_failed"): 1,
        ("slowask", "selector_timeout"): 1,
    }


async def test_the_helper_call_is_retried_on_the_helper_models_other_backend() -> None:
    stack, helpers = await build(judges=2)
    try:
        for judge in helpers:
            judge.fault = "503"
        # both fail: after one retry, the first modelRef
        assert (await ask(stack, "ask a hard question"))["x-vsr-selected-model"] == "small"
        assert sum(len(j.received) for j in helpers) == 2
        helpers[1].fault = None  # one fails: the retry on the other answers
        for _ in range(4):
            assert (await ask(stack, "ask a hard question"))["x-vsr-selected-model"] == "big"
        assert len(helpers[1].bodies) == 4
    finally:
        await close(stack, helpers)


async def test_the_callers_deadline_bounds_the_helper_call(stack: Stack) -> None:
    stack.judge.fault, stack.judge.slow_s = "slow", 3.0
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as err:
        await ask(stack, "ask a hard question", **{"X-Request-Timeout-Ms": "400"})
    assert err.value.status_code == 504
    assert time.monotonic() - started < 2.0
    assert len(stack.big.received) == len(stack.small.received) == 0


async def test_router_dc_automix_and_hybrid(stack: Stack) -> None:
    # router_dc: the query's words meet one model's description
    headers = await ask(stack, "dc algebra proofs")
    assert (headers["x-vsr-selected-model"], headers["x-vsr-selected-algorithm"]) == (
        "big",
        "router_dc",
    )
    assert (await ask(stack, "dc poetry lyrics", stream=True))["x-vsr-selected-model"] == "small"
    descriptions = [
        task
        for _, body in stack.exchange.bodies
        for task in body["tasks"]
        if task["id"] == "router_dc_models"
    ]
    assert len(descriptions) == 1  # asked once, then kept
    assert sorted(descriptions[0]["embeddings"]["input"]) == [
        "algebra proofs calculus",
        "poetry stories lyrics",
    ]
    # automix (no global settings: quality only) -> big (0.9 against 0.5)
    headers = await ask(stack, "mix it")
    assert (headers["x-vsr-selected-model"], headers["x-vsr-selected-algorithm"]) == (
        "big",
        "automix",
    )
    # hybrid: router_dc's component (min-max normalised: the nearer description scores 1)
    # outweighs automix's quality, and the cheaper model's cost bonus
    headers = await ask(stack, "hyb algebra proofs")
    assert (headers["x-vsr-selected-model"], headers["x-vsr-selected-algorithm"]) == (
        "big",
        "hybrid",
    )
    assert (await ask(stack, "hyb poetry lyrics"))["x-vsr-selected-model"] == "small"
    for text, method in (("dc algebra", "router_dc"), ("mix", "automix"), ("hyb", "hybrid")):
        doc = await evaluate(stack, text)
        assert (doc["selection_status"], doc["selection_method"]) == ("execution_required", method)


async def test_global_model_selection_settings_reach_the_selectors() -> None:
    """``global.router.model_selection``: automix made cost-aware picks the ten times cheaper
    small over big's better quality; router_dc's min_similarity out of reach sends the chat to
    the first modelRef whatever the description says."""
    model_selection = {
        "automix": {"cost_aware_routing": True, "cost_quality_tradeoff": 1.0},
        "router_dc": {"min_similarity": 1.0},
    }
    glob = GlobalSection.model_validate({"router": {"model_selection": model_selection}})
    stack, helpers = await build(global_=glob)
    try:
        assert (await ask(stack, "mix it"))["x-vsr-selected-model"] == "small"
        assert (await ask(stack, "dc algebra proofs"))["x-vsr-selected-model"] == "small"
    finally:
        await close(stack, helpers)
