"""v0.4's candidate_requirements and data_policy through chats (the openai SDK on our HTTP
server, stand-in backends): a candidate whose card's context window is too small for the chat
is passed over; ``data_policy.replay: false`` keeps a decision's router_replay from
recording."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from tests.support.backends import StandInBackend
from tests.support.router_app import AUTO, Served, serve_routes, start_router
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.router.chat import ChatRouter


@dataclass
class Stack:
    served: Served
    small: StandInBackend
    big: StandInBackend
    chat: ChatRouter


def routing(replay: bool) -> Routing:
    return Routing.model_validate(
        {
            "candidate_requirements": {"context": "known_limits", "capabilities": "declared"},
            "data_policy": {"replay": replay},
            "modelCards": [
                {"name": "small", "context_window_size": 64, "capabilities": ["chat"]},
                {"name": "big", "context_window_size": 100000,
                 "capabilities": ["chat", "tool_use"]},
            ],
            "signals": {"keywords": [{"name": "k", "operator": "OR", "keywords": ["route"]}]},
            "decisions": [
                {"name": "d", "priority": 1, "modelRefs": [{"model": "small"}, {"model": "big"}],
                 "rules": {"operator": "AND", "conditions": [{"type": "keyword", "name": "k"}]},
                 "plugins": [{"type": "router_replay", "configuration": {"enabled": True}}]},
            ],
        }
    )  # fmt: skip


@pytest.fixture(params=[True, False], ids=["replay", "no-replay"])
async def stack(request: pytest.FixtureRequest) -> AsyncIterator[Stack]:
    small = await StandInBackend("small").start()
    big = await StandInBackend("big").start()
    providers = Providers.model_validate(
        {
            "defaults": {"model": "small"},
            "models": [
                {"name": "small", "backend_refs": [{"endpoint": small.endpoint}]},
                {"name": "big", "backend_refs": [{"endpoint": big.endpoint}]},
            ],
        }
    )
    chat = await start_router(providers, routing(request.param))
    served = await serve_routes(chat.routes())
    try:
        yield Stack(served, small, big, chat)
    finally:
        await served.close()
        await chat.backends.close()
        await small.stop()
        await big.stop()


async def test_candidates_are_filtered_before_the_choice(stack: Stack) -> None:
    client = stack.served.client()

    async def ask(text: str, extra: dict[str, object] | None = None) -> tuple[str, str | None]:
        raw = await client.chat.completions.with_raw_response.create(
            model=AUTO, messages=[{"role": "user", "content": text}], extra_body=extra
        )
        return raw.headers["x-vsr-selected-model"], raw.headers.get("x-vsr-replay-id")

    model, replay_id = await ask("route this please")
    assert model == "small"  # static: the first modelRef fits
    policy = stack.chat.recipes["default"].routing.data_policy
    assert policy is not None and (replay_id is not None) is (policy.replay is True)
    model, _ = await ask("route " + "a long question " * 40)
    assert model == "big"  # over small's 64-token window
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    model, _ = await ask("route with a tool", {"tools": [tool]})
    assert model == "big"  # small declares no tool_use
    assert stack.big.received[-1].body["tools"] == [tool]
