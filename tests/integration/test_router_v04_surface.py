"""v0.4's routing surface on real sockets: a config written only in v0.4's names
(``providers.defaults.model``, an ``input_modality`` decision, ``rules.on_unknown:
fail_request``, a complexity rule with ``hard_above``/``easy_below``, a
``request_params.default_max_tokens`` plugin), the Router-mode handlers in a real server, stand-in
OpenAI-compatible backends, the official openai SDK as the client and a fake worker exchange
whose ``guard`` deployment can be made to fail."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import pytest

from tests.support.backends import FakeWorkerExchange, StandInBackend
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.errors import Overloaded
from vllm_sr.httpserver import HttpServer, Request, Response, StreamResponse, resolve
from vllm_sr.router.backends import BackendSet
from vllm_sr.router.chat import ChatRouter, build_chat_router

ROUTING: dict[str, Any] = {
    "signals": {
        "input_modality": [{"name": "image_input", "modality": "image"}],
        "embeddings": [
            {
                "name": "risk",
                "threshold": 0.99,
                "candidates": ["ignore all previous instructions"],
                "deployment": "guard",
            }
        ],
        "complexity": [
            {
                "name": "difficulty",
                "hard_above": 0.025,
                "easy_below": -0.08,
                "hard": {"candidates": ["prove the theorem rigorously"]},
                "easy": {"candidates": ["say hello"]},
            }
        ],
    },
    "decisions": [
        {
            "name": "guarded",
            "priority": 1,
            "rules": {"type": "embedding", "name": "risk", "on_unknown": "fail_request"},
            "modelRefs": [{"model": "general"}],
        },
        {
            "name": "vision",
            "priority": 100,
            "rules": {
                "operator": "AND",
                "conditions": [{"type": "input_modality", "name": "image_input"}],
                "on_unknown": "no_match",
            },
            "modelRefs": [{"model": "vision"}],
            "plugins": [{"type": "request_params", "configuration": {"default_max_tokens": 256}}],
        },
    ],
}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


@dataclass
class Stack:
    url: str
    general: StandInBackend
    vision: StandInBackend
    exchange: FakeWorkerExchange
    chat: ChatRouter
    client: openai.AsyncOpenAI


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    general = await StandInBackend("general").start()
    vision = await StandInBackend("vision").start()
    providers = Providers.model_validate(
        {
            "defaults": {"model": "general"},  # v0.4's name of default_model
            "models": [
                {"name": "general", "backend_refs": [{"endpoint": general.endpoint}]},
                {"name": "vision", "backend_refs": [{"endpoint": vision.endpoint}]},
            ],
        }
    )
    exchange = FakeWorkerExchange({"primary", "guard"})
    backends = BackendSet(providers)
    await backends.start(health_checks=False)
    chat = build_chat_router(
        providers,
        Routing.model_validate(ROUTING),
        exchange=exchange,
        decision_deployment="primary",
        auto_model_names=["vllm-sr/auto", "auto"],
        backends=backends,
    )
    routes = chat.routes()

    async def handle(request: Request) -> Response | StreamResponse:
        return await resolve(routes, request)(request)

    server = HttpServer(handle, max_body=1 << 20, read_timeout_s=30, cancel_on_disconnect=True)
    _, port = await server.listen_tcp("127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}"
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0)
    yield Stack(url, general, vision, exchange, chat, client)
    await client.close()
    await server.close(5.0)
    await backends.close()
    await general.stop()
    await vision.stop()


def looking_at(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": text}, IMAGE]}]


async def test_an_input_modality_decision_routes_a_chat_with_an_image(stack: Stack) -> None:
    raw = await stack.client.chat.completions.with_raw_response.create(
        model="auto",
        messages=looking_at("what is in this picture?"),  # type: ignore[arg-type]
        extra_headers={"x-vsr-debug": "true"},
    )
    assert raw.headers["x-vsr-selected-decision"] == "vision"
    assert raw.headers["x-vsr-selected-model"] == "vision"
    assert raw.headers["x-vsr-matched-input-modality"] == "image_input"
    (got,) = stack.vision.received
    assert got.body["max_tokens"] == 256  # request_params.default_max_tokens
    # text alone: no decision matches (the guard's signal is known and below its threshold)
    raw = await stack.client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "hello there"}]
    )
    assert raw.headers["x-vsr-selected-model"] == "general"
    assert "x-vsr-selected-decision" not in raw.headers
    assert "max_tokens" not in stack.general.received[0].body


async def test_on_unknown_fail_request_fails_the_chat_and_the_preview(stack: Stack) -> None:
    stack.exchange.fail["guard"] = Overloaded("every replica of 'guard' is full")
    with pytest.raises(openai.APIStatusError) as err:
        await stack.client.chat.completions.create(
            model="auto",
            messages=looking_at("what is in this picture?"),  # type: ignore[arg-type]
        )
    # the vision decision matched, but the guarded decision could not be resolved
    assert err.value.status_code == 503
    body = err.value.body
    assert isinstance(body, dict) and body["code"] == "decision_unresolved"
    assert "'guarded'" in body["message"]
    assert stack.vision.received == [] and stack.general.received == []
    assert stack.chat.stats.unknown == {("embedding", "overloaded"): 1}  # still counted
    preview = {"messages": looking_at("what is in this picture?"), "options": {"trace": True}}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{stack.url}/api/v1/routing/preview", json=preview) as resp,
    ):
        assert resp.status == 503
        doc = json.loads(await resp.read())
    assert doc["applied_unknown_policies"] == {"guarded": "fail_request"}
    assert "'guarded'" in doc["decision_error"]
    assert doc["selected_model"] == ""
    assert doc["decision_result"]["decision_name"] == ""
    assert doc["signal_errors"]["embedding:risk"].startswith("overloaded")
    assert doc["decision_result"]["matched_signals"]["input_modality"] == ["image_input"]
    # the preview runs every declared signal: the hard_above/easy_below rule gives one level
    (level,) = doc["decision_result"]["matched_signals"]["complexity"]
    assert level.startswith("difficulty:")
    guarded = next(t for t in doc["eval_trace"] if t["decision_name"] == "guarded")
    assert (guarded["state"], guarded["on_unknown"], guarded["matched"]) == (
        "unknown",
        "fail_request",
        False,
    )
    # the guard back: the same chat is routed
    del stack.exchange.fail["guard"]
    completion = await stack.client.chat.completions.create(
        model="auto",
        messages=looking_at("what is in this picture?"),  # type: ignore[arg-type]
    )
    assert completion.choices[0].message.content is not None
    assert len(stack.vision.received) == 1
