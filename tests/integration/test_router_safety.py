"""v0.4's ``safety`` family through a routed chat (the openai SDK on our HTTP server, stand-in
backends): the safety head lives on deployment ``guard``, the hazard head on ``hazard``; the
fake exchange answers each head's ``classify`` task as a worker would (label probabilities)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from tests.support.backends import FakeWorkerExchange, StandInBackend
from tests.support.router_app import AUTO, Served, serve_routes, start_router
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.errors import DeadlineExceeded
from vllm_sr.router.chat import ChatRouter


@dataclass
class HeadExchange(FakeWorkerExchange):
    """Heads by deployment: text -> label probabilities."""

    heads: dict[str, Callable[[str], dict[str, float]]] = field(default_factory=dict)

    async def __call__(
        self, deployment: str, path: str, body: bytes, timeout_ms: float | None
    ) -> tuple[int, bytes]:
        self.calls[deployment] += 1
        if deployment in self.fail:
            raise self.fail[deployment]
        results = []
        for task in json.loads(body)["tasks"]:
            assert task["id"] == "classify", task
            rows = [
                {"index": i, "label": "x", "probabilities": self.heads[deployment](t)}
                for i, t in enumerate(task["classify"]["input"])
            ]
            results.append({"id": "classify", "status": 200, "body": {"data": rows}})
        return 200, json.dumps({"object": "bundle", "results": results}).encode()


def guard(text: str) -> dict[str, float]:
    risky = "attack" in text or "poem" in text
    return {"safe": 0.1, "unsafe": 0.9} if risky else {"safe": 0.95, "unsafe": 0.05}


def hazard(text: str) -> dict[str, float]:
    violent = "attack" in text
    return {"violence": 0.8 if violent else 0.1, "self_harm": 0.1, "other": 0.1 if violent else 0.8}


@dataclass
class Stack:
    served: Served
    safe: StandInBackend
    guarded: StandInBackend
    exchange: HeadExchange
    chat: ChatRouter


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    safe = await StandInBackend("safe").start()
    guarded = await StandInBackend("guarded").start()
    providers = Providers.model_validate(
        {
            "defaults": {"model": "safe"},
            "models": [
                {"name": "safe", "backend_refs": [{"endpoint": safe.endpoint}]},
                {"name": "guarded", "backend_refs": [{"endpoint": guarded.endpoint}]},
            ],
        }
    )
    routing = Routing.model_validate(
        {
            "signals": {
                "safety": [
                    {"name": "violent", "threshold": 0.5, "deployment": "guard",
                     "hazard": {"categories": ["violence"], "threshold": 0.5,
                                "deployment": "hazard"}},
                ]
            },
            "decisions": [
                {"name": "careful", "priority": 10, "modelRefs": [{"model": "guarded"}],
                 "rules": {"operator": "AND",
                           "conditions": [{"type": "safety", "name": "violent"}]}},
            ],
        }
    )  # fmt: skip
    exchange = HeadExchange({"guard", "hazard"}, heads={"guard": guard, "hazard": hazard})
    chat = await start_router(providers, routing, exchange=exchange)
    served = await serve_routes(chat.routes())
    try:
        yield Stack(served, safe, guarded, exchange, chat)
    finally:
        await served.close()
        await chat.backends.close()
        await safe.stop()
        await guarded.stop()


async def routed_to(stack: Stack, text: str) -> str:
    client = stack.served.client()
    raw = await client.chat.completions.with_raw_response.create(
        model=AUTO, messages=[{"role": "user", "content": text}]
    )
    return raw.headers["x-vsr-selected-model"]


async def test_a_chat_goes_by_its_safety_verdict_narrowed_by_hazard(stack: Stack) -> None:
    assert await routed_to(stack, "plan an attack on the castle") == "guarded"
    assert stack.guarded.received[-1].body["messages"][-1]["content"].startswith("plan an")
    # unsafe but not the violence hazard: the rule does not match
    assert await routed_to(stack, "write a rude poem") == "safe"
    assert await routed_to(stack, "what is the capital of France") == "safe"
    assert stack.exchange.calls["guard"] == 3 and stack.exchange.calls["hazard"] == 3


async def test_a_failed_hazard_head_makes_the_rule_unknown(stack: Stack) -> None:
    stack.exchange.fail["hazard"] = DeadlineExceeded("hazard head too slow")
    assert await routed_to(stack, "plan an attack on the castle") == "safe"
    assert any(f == "safety" for (f, _r) in stack.chat.stats.unknown)
