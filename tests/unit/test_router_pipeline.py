"""The chat pipeline's stages (vllm_sr/router/pipeline.py), each a function over one
``ChatRun``, tested alone: parsing, the recipe, signals, decision, selection, the query
embedding, the eval's stages, and the plugin stages (vllm_sr/router/chat_plugins.py,
vllm_sr/router/outgoing.py). No backend is called here (tests/integration/test_router_pipeline.py
sends chats through every stage)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.backends import FakeWorkerExchange
from vllm_sr import wire
from vllm_sr.clock import FakeClock
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.errors import InvalidRequest, Overloaded
from vllm_sr.httpserver import Request
from vllm_sr.router import chat_plugins, outgoing, pipeline
from vllm_sr.router.answers import ModelNotAvailable
from vllm_sr.router.backends import BackendSet
from vllm_sr.router.chat import ChatRouter, build_chat_router
from vllm_sr.router.pipeline import ChatRun

ROUTING: dict[str, Any] = {
    "signals": {
        "keywords": [{"name": "code", "operator": "OR", "keywords": ["code"]}],
        "embeddings": [
            {"name": "billing", "threshold": 0.6, "candidates": ["refund my order please"]}
        ],
    },
    "decisions": [
        {
            "name": "coding",
            "priority": 100,
            "rules": {"operator": "AND", "conditions": [{"type": "keyword", "name": "code"}]},
            "modelRefs": [{"model": "coder", "use_reasoning": True}],
            "plugins": [
                {"type": "system_prompt", "configuration": {"system_prompt": "be terse"}},
                {"type": "request_params", "configuration": {"blocked_params": ["seed"]}},
            ],
        },
        {
            "name": "billing",
            "priority": 50,
            "rules": {"operator": "OR", "conditions": [{"type": "embedding", "name": "billing"}]},
            "modelRefs": [{"model": "general"}],
            "plugins": [{"type": "fast_response", "configuration": {"message": "ask billing"}}],
        },
    ],
}
PROVIDERS: dict[str, Any] = {
    "defaults": {"default_model": "general"},
    "models": [
        {"name": "general", "backend_refs": [{"endpoint": "127.0.0.1:9"}]},
        {"name": "coder", "backend_refs": [{"endpoint": "127.0.0.1:9"}]},
    ],
}


def make_chat(exchange: FakeWorkerExchange | None = None) -> ChatRouter:
    providers = Providers.model_validate(PROVIDERS)
    return build_chat_router(
        providers,
        Routing.model_validate(ROUTING),
        exchange=exchange or FakeWorkerExchange({"primary"}),
        decision_deployment="primary",
        auto_model_names=["auto"],
        entrypoints={},
        backends=BackendSet(providers, FakeClock()),
        cache=False,
    )


def chat_run(
    text: str, model: str = "auto", headers: dict[str, str] | None = None, **extra: Any
) -> ChatRun:
    body = {"model": model, "messages": [{"role": "user", "content": text}], **extra}
    request = Request("POST", "/v1/chat/completions", "", headers or {}, json.dumps(body).encode())
    return ChatRun(request, 1000.0)


async def routed(chat: ChatRouter, text: str, **extra: Any) -> ChatRun:
    """A run through parse, recipe, signals, decision and selection."""
    run = chat_run(text, **extra)
    pipeline.parse(run, run.started)
    pipeline.recipe_stage(chat, run)
    await pipeline.signals_stage(run)
    pipeline.decision_stage(run)
    pipeline.query_stage(chat, run)
    await pipeline.selection_stage(run)
    return run


def test_parse_reads_body_view_deadline_debug_and_stream() -> None:
    run = chat_run(
        "fix my code", headers={wire.DEADLINE_KEY: "250", "x-vsr-debug": "true"}, stream=True
    )
    pipeline.parse(run, now=50.0)
    assert run.body["model"] == "auto"
    assert run.view is not None and run.view.text == "fix my code"
    assert run.deadline == pytest.approx(50.25)
    assert run.debug and run.stream
    quiet = chat_run("hi")
    pipeline.parse(quiet, now=50.0)
    assert quiet.deadline is None and not quiet.debug and not quiet.stream


def test_parse_refuses_a_chat_without_messages() -> None:
    run = ChatRun(Request("POST", "/", "", {}, b'{"model": "auto", "messages": []}'), 0.0)
    with pytest.raises(InvalidRequest, match="messages"):
        pipeline.parse(run, 0.0)


def test_recipe_stage_auto_name_concrete_model_and_unknown_model() -> None:
    chat = make_chat()
    auto = chat_run("hi")
    pipeline.parse(auto, 0.0)
    pipeline.recipe_stage(chat, auto)
    assert auto.recipe == "default" and auto.router is chat.router and auto.result is None
    named = chat_run("hi", model="coder")
    pipeline.parse(named, 0.0)
    pipeline.recipe_stage(chat, named)
    assert named.recipe is None and named.router is None
    assert named.result is not None and named.result.model == "coder"
    assert not named.result.routed
    assert chat.stats.direct["coder"] == 1
    other = chat_run("hi", model="gpt-9")
    pipeline.parse(other, 0.0)
    with pytest.raises(ModelNotAvailable, match='model "gpt-9" is not available'):
        pipeline.recipe_stage(chat, other)


async def test_signals_decision_and_selection_stages_fill_the_run() -> None:
    chat = make_chat()
    run = await routed(chat, "please fix my code")
    assert run.signals is not None
    assert run.signals.results[("keyword", "code")].matched
    assert not run.signals.results[("embedding", "billing")].matched
    assert run.winner is not None and run.winner.decision.name == "coding"
    assert run.result is not None
    assert (run.result.decision, run.result.model) == ("coding", "coder")
    assert run.result.matched_signals == ("keyword:code",)
    assert chat.stats.decisions[("coding", "coder")] == 1


async def test_a_failed_deployment_leaves_its_signals_with_an_error_and_others_decide() -> None:
    exchange = FakeWorkerExchange({"primary"}, raise_error=Overloaded("every replica is full"))
    chat = make_chat(exchange)
    run = await routed(chat, "please fix my code, refund my order please")
    assert run.signals is not None
    unknown = run.signals.results[("embedding", "billing")].unknown
    assert unknown is not None and unknown.reason == "overloaded"
    assert run.result is not None and run.result.decision == "coding"
    assert run.result.unknown_signals == ("embedding:billing",)


async def test_query_stage_reuses_the_routing_answer_without_an_exchange() -> None:
    exchange = FakeWorkerExchange({"primary"})
    chat = make_chat(exchange)
    run = await routed(chat, "refund my order please")
    asked = exchange.calls["primary"]
    assert asked >= 1
    pipeline.query_stage(chat, run)
    assert run.query is not None and run.query.answer is not None
    vector = await run.query.vector(exchange, None)
    assert vector is not None and run.query.reused
    assert exchange.calls["primary"] == asked  # no exchange of its own


async def test_query_stage_without_routing_answer_asks_once_when_read() -> None:
    exchange = FakeWorkerExchange({"primary"})
    chat = make_chat(exchange)
    run = chat_run("hello", model="coder")  # a concrete model: no signals
    pipeline.parse(run, 0.0)
    pipeline.recipe_stage(chat, run)
    pipeline.query_stage(chat, run)
    assert run.query is not None and run.query.answer is None
    assert await run.query.vector(exchange, None) is not None
    assert exchange.calls["primary"] == 1 and not run.query.reused


async def test_eval_runs_every_declared_signal_and_stops_before_selection() -> None:
    chat = make_chat()
    run = ChatRun(Request("POST", "/api/v1/eval", "", {}, b""), 0.0)
    await pipeline.run_eval(chat, run, {"text": "fix my code"}, "default")
    assert run.view is not None and run.view.text == "fix my code"
    assert run.signals is not None
    assert set(run.signals.results) == {("keyword", "code"), ("embedding", "billing")}
    assert [m.decision.name for m in run.matches] == ["coding"]
    assert run.result is None and run.attempts == []
    assert chat.stats.decisions == {}  # an eval is not a routed chat


async def test_fast_response_stage_answers_for_its_decision_only() -> None:
    chat = make_chat()
    billing = await routed(chat, "refund my order please")
    assert billing.result is not None and billing.result.decision == "billing"
    billing.plugins = chat_plugins.plugins_of(chat, billing.result)
    answer = chat_plugins.fast_response(billing)
    assert answer is not None and answer.status == 200
    assert json.loads(answer.body)["choices"][0]["message"]["content"] == "ask billing"
    assert answer.headers["x-vsr-fast-response"] == "true"
    assert billing.effects == ["fast_response"]
    coding = await routed(chat, "fix my code")
    assert coding.result is not None
    coding.plugins = chat_plugins.plugins_of(chat, coding.result)
    assert chat_plugins.fast_response(coding) is None and coding.effects == []


async def test_outgoing_shape_applies_the_decisions_plugins_and_names_them() -> None:
    chat = make_chat()
    run = await routed(chat, "fix my code", seed=7)
    assert run.result is not None
    plugins = chat_plugins.plugins_of(chat, run.result)
    backend = chat.backends.models["coder"][0]
    effects: list[str] = []
    body = outgoing.shape(
        run.body,
        run.result,
        backend,
        plugins,
        chat.provider_models["coder"],
        chat.router.providers.defaults,
        effects,
    )
    assert effects == ["reasoning:on", "system_prompt", "request_params"]
    messages = body["messages"]
    assert isinstance(messages, list) and messages[0] == {"role": "system", "content": "be terse"}
    assert "seed" not in body and run.body["seed"] == 7  # the caller's body is left as it was
    unrouted = await routed(chat, "hello there")  # no decision: as the caller wrote it
    assert unrouted.result is not None and unrouted.result.decision is None
    assert outgoing.shape(
        unrouted.body,
        unrouted.result,
        backend,
        plugins,
        chat.provider_models["general"],
        chat.router.providers.defaults,
    ) is (unrouted.body)
