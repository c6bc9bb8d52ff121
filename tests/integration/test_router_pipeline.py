"""Chats through every stage of vllm_sr/router/pipeline.py on real sockets (stand-in backends,
one of them down): what the ``ChatRun`` carries at the end (the selection, the plugins'
effects, the backend attempts, how it was answered), and the walk itself: one routed chat
enters the router's modules top down, none calling back into a module that called it
(docs/internals.md "A routed chat")."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import pytest

from tests.support.backends import FakeWorkerExchange, StandInBackend
from tests.support.workers import free_tcp_port
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.httpserver import Request, Response
from vllm_sr.router import pipeline
from vllm_sr.router.backends import BackendSet
from vllm_sr.router.chat import ChatRouter, build_chat_router
from vllm_sr.router.fallback import Attempt
from vllm_sr.router.pipeline import ChatRun

ROUTING: dict[str, Any] = {
    "signals": {
        "keywords": [
            {"name": "code", "operator": "OR", "keywords": ["code"]},
            {"name": "poem", "operator": "OR", "keywords": ["poem"]},
        ],
        "embeddings": [{"name": "billing", "threshold": 0.6, "candidates": ["refund my order"]}],
    },
    "decisions": [
        {
            "name": "coding",
            "priority": 100,
            "rules": {"operator": "AND", "conditions": [{"type": "keyword", "name": "code"}]},
            "modelRefs": [{"model": "coder"}],
            "plugins": [{"type": "system_prompt", "configuration": {"system_prompt": "terse"}}],
        },
        {
            "name": "poetry",  # its model is down: the chat falls back to the default model
            "priority": 90,
            "rules": {"operator": "AND", "conditions": [{"type": "keyword", "name": "poem"}]},
            "modelRefs": [{"model": "offline"}],
        },
        {
            "name": "billing",
            "priority": 50,
            "rules": {"operator": "OR", "conditions": [{"type": "embedding", "name": "billing"}]},
            "modelRefs": [{"model": "general"}],
        },
    ],
}


@dataclass
class Stack:
    chat: ChatRouter
    general: StandInBackend
    coder: StandInBackend


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    general = await StandInBackend("general").start()
    coder = await StandInBackend("coder").start()
    providers = Providers.model_validate(
        {
            "defaults": {"default_model": "general"},
            "models": [
                {"name": "general", "backend_refs": [{"endpoint": general.endpoint}]},
                {"name": "coder", "backend_refs": [{"endpoint": coder.endpoint}]},
                {"name": "offline", "backend_refs": [{"endpoint": f"127.0.0.1:{free_tcp_port()}"}]},
            ],
        }
    )
    backends = BackendSet(providers)
    await backends.start(health_checks=False)
    chat = build_chat_router(
        providers,
        Routing.model_validate(ROUTING),
        exchange=FakeWorkerExchange({"primary"}),
        decision_deployment="primary",
        auto_model_names=["auto"],
        backends=backends,
    )
    yield Stack(chat, general, coder)
    await backends.close()
    await general.stop()
    await coder.stop()


def chat_run(chat: ChatRouter, text: str) -> ChatRun:
    body = {"model": "auto", "messages": [{"role": "user", "content": text}]}
    request = Request("POST", "/v1/chat/completions", "", {}, json.dumps(body).encode())
    return ChatRun(request, chat.backends.clock.monotonic())


async def test_a_routed_chat_carries_its_selection_effects_and_attempts(stack: Stack) -> None:
    run = chat_run(stack.chat, "fix my code")
    answer = await pipeline.run_chat(stack.chat, run)
    assert isinstance(answer, Response) and answer.status == 200
    assert json.loads(answer.body)["choices"][0]["message"]["content"] == "coder got: fix my code"
    assert run.signals is not None and run.signals.results[("keyword", "code")].matched
    assert run.winner is not None and run.winner.decision.name == "coding"
    assert run.result is not None and run.result.model == "coder"
    assert run.effects == ["reasoning:off", "system_prompt"]
    (got,) = stack.coder.received
    assert got.body["messages"][0] == {"role": "system", "content": "terse"}
    assert [(a.model, a.outcome) for a in run.attempts] == [("coder", "answered")]
    assert (run.path, run.answered_by, run.failed) == ("upstream", "coder", [])


async def test_a_model_that_cannot_be_reached_is_an_attempt_then_the_default_answers(
    stack: Stack,
) -> None:
    run = chat_run(stack.chat, "write a poem")
    answer = await pipeline.run_chat(stack.chat, run)
    assert answer.status == 200
    assert run.result is not None and run.result.model == "offline"
    assert [(a.model, a.outcome) for a in run.attempts] == [
        ("offline", "connect"),
        ("general", "answered"),
    ]
    assert all(isinstance(a, Attempt) and a.backend for a in run.attempts)
    assert run.failed == [("offline", "connect")] and run.answered_by == "general"
    assert answer.headers["x-vsr-backend-fallback"] == "offline:connect"


def router_module(frame: FrameType | None) -> str | None:
    """The vllm_sr.router module of the nearest vllm_sr frame, None when not in vllm_sr."""
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if name.startswith("vllm_sr."):
            return name if name.startswith("vllm_sr.router.") else None
        frame = frame.f_back
    return None


async def entries_of_one_chat(chat: ChatRouter, text: str) -> Counter[tuple[str, str]]:
    """(caller module, entered module) -> how many times a vllm_sr.router module was entered
    from another during one chat (a coroutine resumed is not entered again)."""
    entered: Counter[tuple[str, str]] = Counter()
    seen: set[int] = set()
    frames: list[FrameType] = []  # kept alive, so that ids are not reused

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or id(frame) in seen:
            return
        mod = router_module(frame)
        if mod is None or str(frame.f_globals.get("__name__")) != mod:
            return
        seen.add(id(frame))
        frames.append(frame)
        caller = router_module(frame.f_back) or "(outside)"
        if caller != mod:
            entered[(caller, mod)] += 1

    sys.setprofile(profile)
    try:
        answer = await chat.handle_chat(
            chat_run(chat, text).request  # the HTTP handler, as a caller reaches it
        )
    finally:
        sys.setprofile(None)
    assert answer.status == 200
    return entered


async def test_a_routed_chat_enters_the_router_top_down(stack: Stack) -> None:
    await stack.chat.handle_chat(chat_run(stack.chat, "fix my code").request)  # warm caches
    entered = await entries_of_one_chat(stack.chat, "fix my code")
    modules = {m for _, m in entered}
    # the walk's stages all ran
    for stage in ("pipeline", "route", "chat_plugins", "fallback", "outgoing", "backends"):
        assert f"vllm_sr.router.{stage}" in modules, stage
    # the HTTP face hands the chat to the pipeline and is not entered again
    assert {m for (c, m) in entered if c == "vllm_sr.router.chat"} == {"vllm_sr.router.pipeline"}
    assert not any(m == "vllm_sr.router.chat" for (c, m) in entered if c != "(outside)")
    # nothing calls back into a module that called it (no module is a caller's callee and
    # its caller both)
    back = sorted((c, m) for (c, m) in entered if (m, c) in entered)
    assert back == [], back
    # the plugins: once for the request, once for the answer
    assert entered[("vllm_sr.router.pipeline", "vllm_sr.router.chat_plugins")] == 2
    # one way to a backend: fallback.forward, entered from the pipeline only
    callers = {c for (c, m) in entered if m == "vllm_sr.router.fallback"}
    assert callers == {"vllm_sr.router.pipeline"}
    # the proxy is called by backends only; fallback enters backend_proxy once per attempt,
    # to build the attempt's Exchange (a frozen dataclass declared there), never to send
    proxied = {c for (c, m) in entered if m == "vllm_sr.router.backend_proxy"}
    assert proxied == {"vllm_sr.router.backends", "vllm_sr.router.fallback"}
    assert entered[("vllm_sr.router.fallback", "vllm_sr.router.backend_proxy")] == 1
