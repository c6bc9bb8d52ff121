"""The chat flow on real sockets: the Router-mode handlers in a real aiohttp server, two real
stand-in OpenAI-compatible backends (one more that is down), the official openai SDK as the
client, and a fake exchange that answers bundles in the worker's own format."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import pytest

from tests.support.backends import FakeWorkerExchange, StandInBackend
from tests.support.workers import free_tcp_port
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.errors import DeadlineExceeded, Overloaded, Unavailable
from vllm_sr.httpserver import HttpServer, Request, Response, StreamResponse, resolve
from vllm_sr.router.backends import BackendSet
from vllm_sr.router.chat import ChatRouter, build_chat_router, engine_mode_chat

ROUTING: dict[str, Any] = {
    "strategy": "priority",
    "signals": {
        "keywords": [{"name": "code", "operator": "OR", "keywords": ["code", "debug"]}],
        "embeddings": [
            {
                "name": "billing",
                "threshold": 0.6,
                "aggregation_method": "max",
                "candidates": ["refund my order", "I was charged twice"],
            }
        ],
        "domains": [
            {"name": "math", "description": "Mathematics", "examples": ["solve this integral"]},
            {"name": "law", "description": "contract law court"},
        ],
    },
    "decisions": [
        {
            "name": "coding",
            "priority": 100,
            "rules": {"operator": "AND", "conditions": [{"type": "keyword", "name": "code"}]},
            "modelRefs": [{"model": "coder"}],
        },
        {
            "name": "billing",
            "priority": 50,
            "rules": {"operator": "OR", "conditions": [{"type": "embedding", "name": "billing"}]},
            "modelRefs": [{"model": "offline"}],
        },
        {
            "name": "maths",
            "priority": 10,
            "rules": {"operator": "OR", "conditions": [{"type": "domain", "name": "math"}]},
            "modelRefs": [{"model": "offline"}, {"model": "coder"}],
        },
    ],
}


@dataclass
class Stack:
    url: str
    general: StandInBackend
    coder: StandInBackend
    exchange: FakeWorkerExchange
    chat: ChatRouter
    client: openai.AsyncOpenAI


@pytest.fixture
async def stack(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Stack]:
    monkeypatch.setenv("CODER_TOKEN", "sk-secret-coder-token")
    general = await StandInBackend("general").start()
    coder = await StandInBackend("coder").start()
    providers = Providers.model_validate(
        {
            "defaults": {"default_model": "general"},
            "models": [
                {
                    "name": "general",
                    "provider_model_id": "qwen3-8b",
                    "backend_refs": [{"endpoint": general.endpoint}],
                },
                {
                    "name": "coder",
                    "provider_model_id": "coder-7b",
                    "backend_refs": [
                        {"base_url": f"http://{coder.endpoint}/v1", "api_key_env": "CODER_TOKEN"}
                    ],
                },
                {"name": "offline", "backend_refs": [{"endpoint": f"127.0.0.1:{free_tcp_port()}"}]},
            ],
        }
    )
    exchange = FakeWorkerExchange({"primary"})
    backends = BackendSet(providers)
    await backends.start(health_checks=False)
    await backends.check_due()  # one round of health checks: "offline" is down
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
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="caller-key", max_retries=0)
    yield Stack(url, general, coder, exchange, chat, client)
    await client.close()
    await server.close(5.0)
    await backends.close()
    await general.stop()
    await coder.stop()


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]


async def test_auto_routes_by_keyword_and_rewrites_only_the_model(stack: Stack) -> None:
    raw = await stack.client.chat.completions.with_raw_response.create(
        model="vllm-sr/auto",
        messages=user("please debug this code"),  # type: ignore[arg-type]
        temperature=0.25,
        extra_body={"custom_field": {"kept": [1, 2]}},
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == "coder got: please debug this code"
    assert raw.headers["x-vsr-selected-decision"] == "coding"
    assert raw.headers["x-vsr-selected-model"] == "coder"
    assert "keyword:code" in raw.headers["x-vsr-matched-signals"].split(",")
    assert "x-vsr-routing-fallback" not in raw.headers
    (got,) = stack.coder.received
    assert got.body["model"] == "coder-7b"
    assert got.body["temperature"] == 0.25
    assert got.body["custom_field"] == {"kept": [1, 2]}
    assert got.body["messages"] == user("please debug this code")
    assert got.headers["Authorization"] == "Bearer sk-secret-coder-token"  # not the caller's
    assert stack.general.received == []
    assert stack.exchange.calls["primary"] == 1  # one bundle for the request (with candidates)


async def test_each_routed_chat_costs_exactly_one_exchange(stack: Stack) -> None:
    for text in ("I was charged twice for my order", "solve this integral please", "hi"):
        await stack.client.chat.completions.create(model="auto", messages=user(text))  # type: ignore[arg-type]
    assert stack.exchange.calls["primary"] == 3
    candidates = [
        b for _, b in stack.exchange.bodies if any(t["id"] == "candidates" for t in b["tasks"])
    ]
    assert len(candidates) == 1  # embedded once per config generation


async def test_embedding_and_domain_decisions_and_model_fallbacks(stack: Stack) -> None:
    raw = await stack.client.chat.completions.with_raw_response.create(
        model="auto",
        messages=user("I was charged twice for my order"),  # type: ignore[arg-type]
    )
    assert raw.headers["x-vsr-selected-decision"] == "billing"
    assert "embedding:billing" in raw.headers["x-vsr-matched-signals"]
    # billing's only model is down: the default model, and the answer says why
    assert raw.headers["x-vsr-selected-model"] == "general"
    assert raw.headers["x-vsr-routing-fallback"] == "models_unhealthy"
    raw = await stack.client.chat.completions.with_raw_response.create(
        model="auto",
        messages=user("solve this integral equation"),  # type: ignore[arg-type]
    )
    assert raw.headers["x-vsr-selected-decision"] == "maths"
    assert "domain:math" in raw.headers["x-vsr-matched-signals"]
    assert raw.headers["x-vsr-selected-model"] == "coder"  # the first healthy modelRef
    assert "x-vsr-routing-fallback" not in raw.headers
    stats = stack.chat.stats
    assert stats.decisions[("billing", "general")] == 1
    assert stats.decisions[("maths", "coder")] == 1
    assert stats.fallbacks["models_unhealthy"] == 1


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (Overloaded("every replica is full"), "overloaded"),
        (Unavailable("no ready replica"), "unavailable"),
        (DeadlineExceeded("the deadline passed"), "timeout"),
    ],
)
async def test_a_failed_deployment_leaves_only_its_signals_unknown(
    stack: Stack, error: Exception, reason: str
) -> None:
    stack.exchange.raise_error = error  # type: ignore[assignment]
    raw = await stack.client.chat.completions.with_raw_response.create(
        model="auto",
        messages=user("please debug this code"),  # type: ignore[arg-type]
    )
    # the keyword decision needs nothing of the failed deployment: it still routes
    assert raw.parse().choices[0].message.content.startswith("coder got:")  # type: ignore[union-attr]
    assert raw.headers["x-vsr-selected-decision"] == "coding"
    assert raw.headers["x-vsr-selected-model"] == "coder"
    assert "x-vsr-routing-fallback" not in raw.headers
    # the signals the deployment answers are named unknown, and counted by family and reason
    unknown = raw.headers["x-vsr-unknown-signals"].split(",")
    assert unknown == ["domain:math", "embedding:billing"]
    assert "keyword:code" in raw.headers["x-vsr-matched-signals"].split(",")
    stats = stack.chat.stats
    assert stats.unknown == {("domain", reason): 1, ("embedding", reason): 1}
    assert stats.fallbacks == {}


async def test_no_decision_with_unknown_signals_is_a_routing_fallback(stack: Stack) -> None:
    stack.exchange.raise_error = Overloaded("every replica is full")
    raw = await stack.client.chat.completions.with_raw_response.create(
        model="auto",
        messages=user("I was charged twice for my order"),  # type: ignore[arg-type]
    )
    assert raw.parse().choices[0].message.content.startswith("general got:")  # type: ignore[union-attr]
    assert raw.headers["x-vsr-routing-fallback"] == "signals:overloaded"
    assert raw.headers["x-vsr-selected-model"] == "general"
    assert "x-vsr-selected-decision" not in raw.headers
    assert raw.headers["x-vsr-unknown-signals"] == "domain:math,embedding:billing"
    assert stack.chat.stats.fallbacks["signals:overloaded"] == 1


async def test_a_bad_worker_answer_makes_its_signals_unknown_as_failed(stack: Stack) -> None:
    stack.exchange.status = 500
    raw = await stack.client.chat.completions.with_raw_response.create(
        model="auto",
        messages=user("hello"),  # type: ignore[arg-type]
    )
    assert raw.headers["x-vsr-routing-fallback"] == "signals:failed"
    assert raw.headers["x-vsr-unknown-signals"] == "domain:math,embedding:billing"
    assert stack.chat.stats.unknown[("embedding", "failed")] == 1


async def test_eval_lists_unknown_signals_with_their_error(stack: Stack) -> None:
    stack.exchange.raise_error = Unavailable("no ready replica")
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{stack.url}/api/v1/eval", json={"text": "please debug this code"}) as r,
    ):
        assert r.status == 200
        doc = await r.json()
    assert doc["signal_errors"] == {
        "domain:law": "unavailable: no ready replica",
        "domain:math": "unavailable: no ready replica",
        "embedding:billing": "unavailable: no ready replica",
    }
    result = doc["decision_result"]
    assert result["decision_name"] == "coding"
    assert result["matched_signals"] == {"keywords": ["code"]}
    # an unknown signal is neither matched nor unmatched
    assert "embeddings" not in result["unmatched_signals"]
    assert "domains" not in result["unmatched_signals"]


async def test_a_model_named_directly_skips_the_signals(stack: Stack) -> None:
    raw = await stack.client.chat.completions.with_raw_response.create(
        model="general",
        messages=user("please debug this code"),  # type: ignore[arg-type]
    )
    assert raw.headers["x-vsr-selected-model"] == "general"
    assert "x-vsr-selected-decision" not in raw.headers
    assert stack.exchange.calls["primary"] == 0
    assert stack.general.received[0].body["model"] == "qwen3-8b"


async def test_stream_chunks_pass_through_as_they_arrive(stack: Stack) -> None:
    stack.coder.gate = asyncio.Event()
    raw = await stack.client.chat.completions.with_raw_response.create(
        model="auto",
        messages=user("debug my code now"),  # type: ignore[arg-type]
        stream=True,
    )
    assert raw.headers["x-vsr-selected-model"] == "coder"
    stream = raw.parse()
    assert isinstance(stream, openai.AsyncStream)
    it = stream.__aiter__()
    first = await asyncio.wait_for(it.__anext__(), 10)
    # the backend holds every later chunk until the gate opens: the first one got through alone
    assert first.choices[0].delta.content == "coder got:"
    assert stack.coder.received[0].body["stream"] is True
    stack.coder.gate.set()
    rest = [chunk async for chunk in it]
    text = "".join(c.choices[0].delta.content or "" for c in [first, *rest])
    assert text == "coder got: debug my code now"
    assert rest[-1].choices[0].finish_reason == "stop"


async def test_unknown_model_is_upstreams_400_naming_the_known_models(stack: Stack) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await stack.client.chat.completions.create(model="gpt-9", messages=user("x"))  # type: ignore[arg-type]
    err = info.value.body
    assert isinstance(err, dict)
    assert err["code"] == "model_not_found"
    assert err["type"] == "invalid_request_error"
    for name in ("vllm-sr/auto", "auto", "general", "coder", "offline"):
        assert name in err["message"]


async def test_backend_errors_pass_through_typed(stack: Stack) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await stack.client.chat.completions.create(model="general", messages=user("FAIL 400"))  # type: ignore[arg-type]
    assert info.value.body == {"message": "general says no", "type": "invalid_request_error"}
    with pytest.raises(openai.InternalServerError) as err500:
        await stack.client.chat.completions.create(model="general", messages=user("PLAIN 500"))  # type: ignore[arg-type]
    body = err500.value.body
    assert isinstance(body, dict) and body["code"] == "backend_error"
    assert "upstream exploded" in body["message"] and body["retryable"] is True


async def test_an_unreachable_backend_is_502_and_marked_unhealthy(stack: Stack) -> None:
    offline = stack.chat.backends.models["offline"][0]
    offline.health.state = "unknown"
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            f"{stack.url}/v1/chat/completions",
            json={"model": "offline", "messages": user("hi")},
        ) as resp,
    ):
        assert resp.status == 502
        body = await resp.json()
    assert body["error"]["code"] == "backend_unavailable"
    assert offline.health.state == "unhealthy"
    assert offline.errors == 1


async def test_models_lists_auto_names_and_backends(stack: Stack) -> None:
    page = await stack.client.models.list()
    ids = [m.id for m in page.data]
    assert ids == ["vllm-sr/auto", "auto", "general", "coder", "offline"]
    states = {m.id: m.model_extra.get("state") for m in page.data if m.model_extra}
    assert states["general"] == "healthy" and states["offline"] == "unhealthy"


async def test_bad_bodies_are_400(stack: Stack) -> None:
    async with aiohttp.ClientSession() as s:
        for payload in (b"not json", b"[]", b'{"model": "auto"}', b'{"messages": []}'):
            async with s.post(f"{stack.url}/v1/chat/completions", data=payload) as resp:
                assert resp.status == 400, payload
                assert (await resp.json())["error"]["code"] == "invalid_request"


async def test_the_token_is_never_logged(stack: Stack, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    await stack.client.chat.completions.create(model="coder", messages=user("hi"))  # type: ignore[arg-type]
    stack.exchange.raise_error = Overloaded("full")
    await stack.client.chat.completions.create(model="auto", messages=user("x"))  # type: ignore[arg-type]
    assert "sk-secret-coder-token" not in caplog.text
    assert "sk-secret-coder-token" not in json.dumps(stack.chat.inventory())


async def test_engine_mode_chat_is_a_typed_404() -> None:
    server = HttpServer(engine_mode_chat, max_body=1 << 20, read_timeout_s=30)
    _, port = await server.listen_tcp("127.0.0.1", 0)
    try:
        async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k") as c:
            with pytest.raises(openai.NotFoundError) as info:
                await c.chat.completions.create(model="auto", messages=user("x"))  # type: ignore[arg-type]
        body = info.value.body
        assert isinstance(body, dict) and body["code"] == "engine_mode"
        assert "Engine mode" in body["message"]
    finally:
        await server.close(5.0)
