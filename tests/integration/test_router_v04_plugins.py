"""v0.4's ``masking`` and ``shadow_dispatch`` on real sockets: the Router-mode handlers in our
HTTP server, stand-in OpenAI-compatible backends recording what they receive, the openai SDK
as the caller. Masking uses presidio's recognizers (the pii family's detector)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import openai
import pytest

from tests.support.backends import StandInBackend
from tests.support.router_app import AUTO, Served, serve_routes, start_router
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.router import signals_pii
from vllm_sr.router.chat import ChatRouter
from vllm_sr.router.metrics import RouterCollector


def kw(name: str) -> dict[str, object]:
    return {"operator": "AND", "conditions": [{"type": "keyword", "name": name}]}


SHADOW = {"enabled": True, "model": "secondary", "max_concurrency": 1, "max_queue_depth": 2,
          "forward_headers": ["X-Tier"]}  # fmt: skip
DECISIONS = [
    {"name": "masked", "priority": 90, "rules": kw("private"), "modelRefs": [{"model": "primary"}],
     "plugins": [{"type": "masking", "configuration": {"enabled": True}}]},
    {"name": "shadowed", "priority": 80, "rules": kw("shadow"), "modelRefs": [{"model": "primary"}],
     "plugins": [
         {"type": "masking", "configuration": {"enabled": True, "entity_types": ["EMAIL_ADDRESS"]}},
         {"type": "header_mutation", "configuration": {
             "add": [{"name": "X-Tier", "value": "gold"}, {"name": "X-Other", "value": "1"}]}},
         {"type": "shadow_dispatch", "configuration": SHADOW},
     ]},
]  # fmt: skip


@dataclass
class Stack:
    served: Served
    primary: StandInBackend
    secondary: StandInBackend
    chat: ChatRouter
    client: openai.AsyncOpenAI


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    primary = await StandInBackend("primary").start()
    secondary = await StandInBackend("secondary").start()
    providers = Providers.model_validate(
        {
            "defaults": {"model": "primary"},
            "models": [
                {"name": "primary", "backend_refs": [{"endpoint": primary.endpoint}]},
                {"name": "secondary", "backend_refs": [{"endpoint": secondary.endpoint}]},
            ],
        }
    )
    routing = Routing.model_validate(
        {
            "signals": {
                "keywords": [
                    {"name": n, "operator": "OR", "keywords": [n]} for n in ("private", "shadow")
                ]
            },
            "decisions": DECISIONS,
        }
    )
    chat = await start_router(providers, routing)
    served = await serve_routes(chat.routes())
    try:
        yield Stack(served, primary, secondary, chat, served.client("caller-key"))
    finally:
        await chat.shadow.close()
        await served.close()
        await chat.backends.close()
        await primary.stop()
        await secondary.stop()


async def ask(client: openai.AsyncOpenAI, text: str) -> str:
    done = await client.chat.completions.create(
        model=AUTO, messages=[{"role": "user", "content": text}]
    )
    return done.choices[0].message.content or ""


def shadow_counts(chat: ChatRouter) -> dict[str, float]:
    family = next(
        f
        for f in RouterCollector(lambda: chat).collect()
        if f.name == "vllm_sr_router_shadow_copies"
    )
    return {s.labels["outcome"]: s.value for s in family.samples if s.name.endswith("_total")}


async def test_masking_sends_placeholders_to_the_backend(stack: Stack) -> None:
    text = "private: mail john.doe@example.com, card 4111 1111 1111 1111, mail john.doe@example.com"
    answer = await ask(stack.client, text)
    sent = stack.primary.received[-1].body["messages"][-1]["content"]
    assert sent == ("private: mail [EMAIL_ADDRESS_0], card [CREDIT_CARD_0], mail [EMAIL_ADDRESS_0]")
    assert answer == f"primary got: {sent}"
    # a decision without the plugin sends the text as written
    await ask(stack.client, "hello john.doe@example.com")
    assert stack.primary.received[-1].body["messages"][-1]["content"].endswith("@example.com")


async def test_masking_fails_closed(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: signals_pii.PiiDetector, text: str) -> list[signals_pii.Entity]:
        raise RuntimeError("detector down")

    monkeypatch.setattr(signals_pii.PiiDetector, "entities", broken)
    with pytest.raises(openai.APIStatusError) as err:
        await ask(stack.client, "private: mail john.doe@example.com")
    assert err.value.status_code == 503 and "masking" in str(err.value)
    assert stack.primary.received == []


async def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.01)


async def test_shadow_copy_goes_to_the_secondary_without_changing_the_answer(stack: Stack) -> None:
    answer = await ask(stack.client, "shadow question from a@b.io")
    assert answer == "primary got: shadow question from [EMAIL_ADDRESS_0]"
    await wait_for(lambda: shadow_counts(stack.chat).get("ok") == 1, "the copy")
    copy = stack.secondary.received[-1]
    assert copy.body["messages"][-1]["content"] == "shadow question from [EMAIL_ADDRESS_0]"
    assert copy.body["model"] == "secondary" and copy.body["stream"] is False
    headers = {k.lower(): v for k, v in copy.headers.items()}
    assert headers.get("x-tier") == "gold"  # forward_headers
    assert "x-other" not in headers and "authorization" not in headers  # nothing else


async def test_a_failing_or_slow_secondary_changes_nothing_and_is_counted(stack: Stack) -> None:
    stack.secondary.fault = "503"
    assert await ask(stack.client, "shadow one") == "primary got: shadow one"
    await wait_for(lambda: shadow_counts(stack.chat).get("failed") == 1, "the failed copy")
    # a secondary that holds every copy: the caller's answers still come at once; one copy in
    # flight, two waiting, the rest dropped (counted)
    stack.secondary.fault = None
    stack.secondary.hold = asyncio.Event()
    for i in range(5):
        assert await ask(stack.client, f"shadow {i}") == f"primary got: shadow {i}"
    await wait_for(lambda: stack.secondary.inflight == 1, "the copy in flight")
    assert shadow_counts(stack.chat).get("dropped") == 2
    assert len(stack.chat.shadow.lanes[("default", "shadowed")].waiting) == 2
    stack.secondary.hold.set()
    await wait_for(lambda: shadow_counts(stack.chat).get("ok") == 3, "the three kept copies")
    assert stack.secondary.max_inflight == 1
    # the secondary's failures did not touch its health (routing state)
    assert all(b.errors == 0 for b in stack.chat.backends.models["secondary"])


async def test_retries_and_the_time_limit_bound_a_copy(stack: Stack) -> None:
    conf = stack.chat.plugins[("default", "shadowed")].shadow_dispatch
    assert conf is not None
    retrying = conf.model_copy(update={"max_retries": 2, "timeout_seconds": 1})
    stack.chat.plugins[("default", "shadowed")] = dataclasses.replace(
        stack.chat.plugins[("default", "shadowed")], shadow_dispatch=retrying
    )
    stack.secondary.fault = "503"
    assert await ask(stack.client, "shadow again") == "primary got: shadow again"
    await wait_for(lambda: shadow_counts(stack.chat).get("failed") == 1, "the retried copy")
    assert len(stack.secondary.received) == 3  # the copy and two retries
    stack.secondary.fault, stack.secondary.slow_s = "slow", 2.0
    assert await ask(stack.client, "shadow slow") == "primary got: shadow slow"
    await wait_for(lambda: shadow_counts(stack.chat).get("timeout") == 1, "the timed-out copy")


async def test_the_copies_counted_survive_a_config_reload(stack: Stack) -> None:
    assert await ask(stack.client, "shadow once") == "primary got: shadow once"
    await wait_for(lambda: shadow_counts(stack.chat).get("ok") == 1, "the copy")
    providers = stack.chat.router.providers
    routing = stack.chat.router.routing
    reloaded = await start_router(providers, routing, stats=stack.chat.stats)
    try:
        assert shadow_counts(reloaded) == {"ok": 1.0}
    finally:
        await reloaded.backends.close()
