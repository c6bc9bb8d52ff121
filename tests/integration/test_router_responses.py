"""The Responses API on real sockets: the Router-mode handlers in our HTTP server (the chat's
and /v1/responses'), real stand-in OpenAI-compatible backends that record what they receive,
the official openai SDK as the client (``responses.create`` / ``retrieve`` / ``delete`` /
``input_items.list``, streamed and not). A Responses request goes through the chat's routing
(signals, decision, plugins, fallback) and comes back as a Response object."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import pytest

from tests.support.backends import StandInBackend
from tests.support.router_app import AUTO, providers_on, serve_routes, start_router
from vllm_sr.clock import FakeClock
from vllm_sr.config.routing import Routing
from vllm_sr.router.responses.api import H_CHAIN_MISSING, ResponsesAPI
from vllm_sr.router.responses.store import MemoryStore


def kw(name: str) -> dict[str, Any]:
    return {"operator": "AND", "conditions": [{"type": "keyword", "name": name}]}


SIGNALS = {"keywords": [{"name": n, "operator": "OR", "keywords": [n]}
                        for n in ("code", "busy", "fallback", "shape", "cacheme")]}  # fmt: skip
DECISIONS = [
    {"name": "coding", "priority": 100, "rules": kw("code"), "modelRefs": [{"model": "coder"}]},
    {"name": "fast", "priority": 90, "rules": kw("busy"),
     "plugins": [{"type": "fast_response", "configuration": {"message": "Busy, try later."}}]},
    {"name": "fb", "priority": 80, "rules": kw("fallback"),
     "modelRefs": [{"model": "broken"}, {"model": "coder"}]},
    {"name": "shaped", "priority": 70, "rules": kw("shape"), "modelRefs": [{"model": "coder"}],
     "plugins": [{"type": "system_prompt", "configuration": {
         "system_prompt": "Be brief.", "mode": "insert"}}]},
    {"name": "cached", "priority": 60, "rules": kw("cacheme"), "modelRefs": [{"model": "coder"}],
     "plugins": [{"type": "semantic-cache", "configuration": {
         "enabled": True, "mode": "exact", "scope": "global"}}]},
]  # fmt: skip


@dataclass
class Stack:
    url: str
    general: StandInBackend
    coder: StandInBackend
    broken: StandInBackend
    responses: ResponsesAPI
    store: MemoryStore
    clock: FakeClock
    client: openai.AsyncOpenAI


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    general = await StandInBackend("general").start()
    coder = await StandInBackend("coder").start()
    broken = await StandInBackend("broken").start()
    routing = Routing.model_validate({"signals": SIGNALS, "decisions": DECISIONS})
    chat = await start_router(providers_on(general, coder, broken), routing)
    clock = FakeClock()
    store = MemoryStore(ttl_s=600, max_responses=3, clock=clock)
    responses = ResponsesAPI(store, clock)
    served = await serve_routes({**chat.routes(), **responses.routes(lambda: chat)})
    client = served.client("caller-key")
    try:
        yield Stack(served.url, general, coder, broken, responses, store, clock, client)
    finally:
        await served.close()
        await chat.backends.close()
        for b in (general, coder, broken):
            await b.stop()


def sent(backend: StandInBackend) -> list[dict[str, Any]]:
    """The messages of the last chat the backend received."""
    messages: list[dict[str, Any]] = backend.received[-1].body["messages"]
    return messages


async def test_a_response_is_routed_and_answered_as_a_response_object(stack: Stack) -> None:
    raw = await stack.client.responses.with_raw_response.create(
        model=AUTO, input="What is 2 + 2?", instructions="You are a math tutor."
    )
    resp = raw.parse()
    assert resp.id.startswith("resp_") and resp.object == "response"
    assert resp.status == "completed" and resp.created_at > 0
    assert resp.output_text == "general got: What is 2 + 2?"
    assert resp.output[0].type == "message" and resp.output[0].role == "assistant"
    assert resp.usage is not None and resp.usage.total_tokens == 2
    assert sent(stack.general) == [
        {"role": "system", "content": "You are a math tutor."},
        {"role": "user", "content": "What is 2 + 2?"},
    ]
    assert raw.headers["x-vsr-selected-model"] == "general"  # the chat's answer headers
    # a decision routes it like a chat
    coded = await stack.client.responses.with_raw_response.create(model=AUTO, input="code it")
    assert coded.parse().output_text == "coder got: code it"
    assert coded.headers["x-vsr-selected-decision"] == "coding"
    assert coded.headers["x-vsr-selected-model"] == "coder"
    assert stack.responses.inventory() == {
        "store": "memory",
        "entries": 2,
        "stored": 2,
        "store_failures": 0,
    }


async def test_chaining_sends_the_earlier_turns_and_inherits_instructions(stack: Stack) -> None:
    c = stack.client
    r1 = await c.responses.create(model=AUTO, input="turn-1: hello", instructions="Keep this.")
    r2 = await c.responses.create(model=AUTO, input="turn-2: more", previous_response_id=r1.id)
    r3 = await c.responses.create(model=AUTO, input="turn-3: last", previous_response_id=r2.id)
    assert r2.previous_response_id == r1.id and r3.previous_response_id == r2.id
    assert sent(stack.general) == [
        {"role": "system", "content": "Keep this."},
        {"role": "user", "content": "turn-1: hello"},
        {"role": "assistant", "content": "general got: turn-1: hello"},
        {"role": "user", "content": "turn-2: more"},
        {"role": "assistant", "content": "general got: turn-2: more"},
        {"role": "user", "content": "turn-3: last"},
    ]
    conv = {r.model_extra["conversation_id"] for r in (r1, r2, r3) if r.model_extra}
    assert len(conv) == 1  # one conversation id along the chain
    # a chain whose first turn was evicted (max_responses 3) still answers, and says so
    r4 = await c.responses.create(model=AUTO, input="turn-4", previous_response_id=r3.id)
    raw = await c.responses.with_raw_response.create(
        model=AUTO, input="turn-5", previous_response_id=r4.id
    )
    assert raw.headers[H_CHAIN_MISSING] == r1.id
    assert {"role": "user", "content": "turn-1: hello"} not in sent(stack.general)
    assert {"role": "user", "content": "turn-2: more"} in sent(stack.general)


async def test_streaming_emits_the_responses_events_and_stores_the_answer(stack: Stack) -> None:
    stream = await stack.client.responses.create(model=AUTO, input="stream this", stream=True)
    events = [e async for e in stream]
    kinds = [e.type for e in events]
    for kind in (
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ):
        assert kind in kinds, kinds
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == "general got: stream this"
    assert kinds.count("response.output_text.delta") >= 2  # chunk by chunk, not all at once
    done = events[-1].response
    assert done.output_text == deltas and done.status == "completed"
    assert stack.general.received[-1].body["stream_options"] == {"include_usage": True}
    again = await stack.client.responses.retrieve(done.id)
    assert again.output_text == deltas


async def test_a_streamed_request_sees_no_chat_chunks(stack: Stack) -> None:
    body = {"model": AUTO, "input": "raw stream", "stream": True, "store": False}
    async with (
        aiohttp.ClientSession() as s,
        s.post(stack.url + "/v1/responses", json=body) as r,
    ):
        text = await r.text()
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    assert "chat.completion.chunk" not in text and "data: [DONE]" not in text
    assert "sequence_number" not in text and '"annotations": []' in text


async def test_retrieve_input_items_and_delete(stack: Stack) -> None:
    c = stack.client
    made = await c.responses.create(model=AUTO, input="capital of France?", instructions="Geo.")
    got = await c.responses.retrieve(made.id)
    assert got.id == made.id and got.output_text == made.output_text
    items = await c.responses.input_items.list(made.id)
    assert [(i.type, i.role) for i in items.data] == [("message", "system"), ("message", "user")]
    assert items.data[1].content[0].text == "capital of France?"
    assert items.data[0].content[0].text == "Geo."
    deleted = await c.responses.delete(made.id)
    assert deleted is None  # the SDK returns nothing; the answer is checked raw below
    with pytest.raises(openai.NotFoundError) as err:
        await c.responses.retrieve(made.id)
    assert made.id in str(err.value)
    async with aiohttp.ClientSession() as s:
        other = await c.responses.create(model=AUTO, input="x")
        async with s.delete(f"{stack.url}/v1/responses/{other.id}") as r:
            assert r.status == 200
            assert await r.json() == {"id": other.id, "object": "response.deleted", "deleted": True}
        async with s.delete(f"{stack.url}/v1/responses/{other.id}") as r:
            assert r.status == 404
            assert (await r.json())["error"]["code"] == "response_not_found"


async def test_store_false_is_not_kept_and_cannot_be_chained(stack: Stack) -> None:
    c = stack.client
    made = await c.responses.create(model=AUTO, input="forget me", store=False)
    assert made.output_text == "general got: forget me" and made.store is False
    with pytest.raises(openai.NotFoundError):
        await c.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError) as err:
        await c.responses.create(model=AUTO, input="again", previous_response_id=made.id)
    assert made.id in err.value.message
    assert stack.store.usage() == 0


async def test_stored_responses_expire_at_the_ttl(stack: Stack) -> None:
    made = await stack.client.responses.create(model=AUTO, input="short lived")
    stack.clock.advance(601)
    with pytest.raises(openai.NotFoundError):
        await stack.client.responses.retrieve(made.id)


async def test_errors_in_openais_shape(stack: Stack) -> None:
    c = stack.client
    with pytest.raises(openai.NotFoundError) as nf:
        await c.responses.create(model=AUTO, input="x", previous_response_id="resp_nonexistent_1")
    assert "resp_nonexistent_1" in nf.value.message
    with pytest.raises(openai.BadRequestError) as bad_model:
        await c.responses.create(model="no-such-model", input="x")
    assert "no-such-model" in bad_model.value.message
    with pytest.raises(openai.BadRequestError) as bad_tool:
        await c.responses.create(model=AUTO, input="x", tools=[{"type": "web_search"}])
    assert "web_search" in bad_tool.value.message
    # the backend's own error comes back with its status (the stand-in answers FAIL 422)
    with pytest.raises(openai.UnprocessableEntityError):
        await c.responses.create(model=AUTO, input="FAIL 422")
    async with aiohttp.ClientSession() as s:
        body = {"model": AUTO, "messages": [{"role": "user", "content": "hi"}]}
        async with s.post(stack.url + "/v1/responses", json=body) as r:
            assert r.status == 400
            err = (await r.json())["error"]
            assert "input" in err["message"] and err["code"] == "invalid_request"
        async with s.get(stack.url + "/v1/responses/resp_nope/input_items") as r:
            assert r.status == 404
        async with s.put(stack.url + "/v1/responses/resp_nope") as r:
            assert r.status == 405
    assert stack.store.usage() == 0  # nothing failed was stored


async def test_fast_response_and_backend_fallback_are_the_chats(stack: Stack) -> None:
    c = stack.client
    fast = await c.responses.with_raw_response.create(model=AUTO, input="busy now?")
    assert fast.parse().output_text == "Busy, try later."
    assert fast.headers["x-vsr-fast-response"] == "true"
    stream = await c.responses.create(model=AUTO, input="busy again", stream=True)
    events = [e async for e in stream]
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == "Busy, try later."
    stack.broken.fault = "503"
    fell = await c.responses.with_raw_response.create(model=AUTO, input="fallback please")
    assert fell.parse().output_text == "coder got: fallback please"
    assert fell.headers["x-vsr-backend-fallback"].startswith("broken:")
    # the decision's plugins shape the translated chat too
    await c.responses.create(model=AUTO, input="shape it", instructions="Mine.")
    assert sent(stack.coder)[0]["role"] == "system"
    assert "Be brief." in json.dumps(sent(stack.coder))


async def test_a_cache_hit_is_translated_too(stack: Stack) -> None:
    c = stack.client
    first = await c.responses.create(model=AUTO, input="cacheme the answer", store=False)
    raw = await c.responses.with_raw_response.create(model=AUTO, input="cacheme the answer")
    assert raw.headers["x-vsr-cache-hit"] == "true" and len(stack.coder.received) == 1
    hit = raw.parse()
    assert hit.output_text == first.output_text == "coder got: cacheme the answer"
    assert hit.id != first.id and (await c.responses.retrieve(hit.id)).id == hit.id
    stream = await c.responses.create(model=AUTO, input="cacheme the answer", stream=True)
    events = [e async for e in stream]
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == first.output_text
    assert len(stack.coder.received) == 1


async def test_a_stream_that_breaks_is_not_completed_nor_stored(stack: Stack) -> None:
    stack.coder.fault = "stream_after_first"
    stream = await stack.client.responses.create(model=AUTO, input="code and break", stream=True)
    kinds = [e.type async for e in stream]
    assert "response.output_text.delta" in kinds  # the first chunk went out
    assert "response.completed" not in kinds
    assert stack.store.usage() == 0 and stack.responses.stored == 0
