"""Router Learning's outcome verdicts end to end: chats through the openai SDK to the
Router-mode handlers and real stand-in backends, each recorded by router_replay; verdicts
posted on the real control socket (``POST /v1/router/outcomes`` through the control client)
against those records' ids; routing_sampling (seeded, as the adaptation tests) then prefers
the model the verdicts favour, and moves when later verdicts say the other way."""

from __future__ import annotations

import itertools
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from tests.support.backends import FakeWorkerExchange, StandInBackend
from tests.support.control_fake import FakeBackend, StubRouter
from tests.support.workers import short_socket_dir
from vllm_sr.clock import FakeClock
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.config.schema import GlobalSection
from vllm_sr.control.client import AsyncControlClient
from vllm_sr.control.server import ControlServer
from vllm_sr.errors import Conflict, NotFound
from vllm_sr.httpserver import HttpServer, Request, Response, StreamResponse, resolve
from vllm_sr.router.backends import BackendSet
from vllm_sr.router.chat import ChatRouter, build_chat_router
from vllm_sr.router.learning.state import LearningState

AUTO = "vllm-sr/auto"
ROUTING = {
    "signals": {"keywords": [{"name": "alpha", "operator": "OR", "keywords": ["alpha"]}]},
    "decisions": [
        {
            "name": "ab",
            "priority": 10,
            "rules": {"operator": "AND", "conditions": [{"type": "keyword", "name": "alpha"}]},
            "modelRefs": [{"model": "a"}, {"model": "b"}],
            "plugins": [{"type": "router_replay", "configuration": {"enabled": True}}],
        }
    ],
}
LEARNING = {
    "enabled": True,
    "adaptation": {"enabled": True, "candidate_set": "decision"},
    "protection": {"enabled": False},  # every chat samples (no conversation to protect)
}


@dataclass
class Stack:
    chat: ChatRouter
    client: openai.AsyncOpenAI
    control: AsyncControlClient


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
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
    backends = BackendSet(providers)
    await backends.start(health_checks=False)
    chat = build_chat_router(
        providers,
        Routing.model_validate(ROUTING),
        exchange=FakeWorkerExchange({"primary"}),
        decision_deployment="primary",
        auto_model_names=[AUTO],
        backends=backends,
        global_=GlobalSection.model_validate({"router": {"learning": LEARNING}}),
        learning_state=LearningState(clock=FakeClock(), seed_source=lambda: 7),
    )
    routes = chat.routes()

    async def handle(request: Request) -> Response | StreamResponse:
        return await resolve(routes, request)(request)

    server = HttpServer(handle, max_body=1 << 20, read_timeout_s=30)
    _, port = await server.listen_tcp("127.0.0.1", 0)
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
    d = short_socket_dir(prefix="vsr-lo-")
    backend = FakeBackend({"primary": ["cpu"]})
    backend.router = StubRouter(chat=chat)  # as the chat mount hands the supervisor its chat
    control = ControlServer(backend, d / "c.sock", group=None)
    await control.start()
    ctl = AsyncControlClient(d / "c.sock")
    try:
        yield Stack(chat, client, ctl)
    finally:
        await ctl.close()
        await control.stop()
        shutil.rmtree(d, ignore_errors=True)
        await client.close()
        await server.close(5.0)
        await backends.close()
        await a.stop()
        await b.stop()


async def chat_once(st: Stack) -> tuple[str, str]:
    """(the model that answered, the chat's replay id)."""
    raw = await st.client.chat.completions.with_raw_response.create(
        model=AUTO, messages=[{"role": "user", "content": "alpha"}]
    )
    return raw.headers["x-vsr-selected-model"], raw.headers["x-vsr-replay-id"]


KEYS = (f"key-{i}" for i in itertools.count())


async def post(st: Stack, replay_id: str, verdict: str, times: int) -> None:
    for _ in range(times):
        doc = await st.control.outcome(replay_id, verdict, next(KEYS))
        assert (doc["success"], doc["updated"], doc["recorded"]) == (True, 1, True)


async def test_verdicts_move_what_routing_sampling_prefers(stack: Stack) -> None:
    st = stack
    # cold start: each model is tried once, and each chat is recorded with its model
    first = dict([await chat_once(st), await chat_once(st)])
    assert sorted(first) == ["a", "b"]
    # verdicts on those records: a fits, b is underpowered -> a every time
    await post(st, first["a"], "good_fit", 8)
    await post(st, first["b"], "underpowered", 8)
    picks = [(await chat_once(st))[0] for _ in range(5)]
    assert picks == ["a"] * 5
    exp = st.chat.learning.state.experience
    assert (exp.snapshot("ab", 0, "a").good_fit, exp.snapshot("ab", 0, "b").underpowered) == (8, 8)
    # later verdicts the other way: a turns out underpowered, b a good fit -> b
    await post(st, first["a"], "underpowered", 20)
    await post(st, first["b"], "good_fit", 20)
    picks = [(await chat_once(st))[0] for _ in range(5)]
    assert picks == ["b"] * 5
    outcomes = (await st.chat.replay.get(first["a"]))["outcomes"]  # on the record, in order
    assert [o["verdict"] for o in outcomes] == ["good_fit"] * 8 + ["underpowered"] * 20
    assert {(o["target_ref"], o["source"]) for o in outcomes} == {("a", "operator")}
    # a verdict on a replay id no chat had changes nothing
    with pytest.raises(NotFound, match="replay_id 'nope'"):
        await st.control.outcome("nope", "good_fit", next(KEYS))
    assert exp.snapshot("ab", 0, "b").good_fit == 20
    # a repeated key is answered as a duplicate and applied once
    again = await st.control.outcome(first["b"], "good_fit", "once")
    dup = await st.control.outcome(first["b"], "good_fit", "once")
    assert (again["updated"], dup["duplicate"], dup["updated"]) == (1, True, 0)
    assert exp.snapshot("ab", 0, "b").good_fit == 21


async def test_records_carry_each_answers_model_for_the_verdict(stack: Stack) -> None:
    """A verdict is about the model the record says was chosen: naming another is a 409."""
    model, rid = await chat_once(stack)
    other = "b" if model == "a" else "a"
    doc: dict[str, Any] = await stack.control.outcome(rid, "good_fit", "k1", target_ref=model)
    assert doc["model"] == model
    with pytest.raises(Conflict, match=f"does not match replay '{rid}'"):
        await stack.control.outcome(rid, "good_fit", "k2", target_ref=other)
