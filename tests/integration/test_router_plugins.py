"""Decision plugins and backend fallback on real sockets: the Router-mode handlers in our HTTP
server, real stand-in OpenAI-compatible backends that record what they receive (and fail on
demand), the official openai SDK as the client. The cache here is the memory store (the
Redis store has its own test, test_router_cache_redis.py)."""

from __future__ import annotations

import hashlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from tests.support.backends import FakeWorkerExchange, StandInBackend
from tests.support.router_app import AUTO, Served, serve_routes, start_router
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.router.chat import ChatRouter


def kw(name: str) -> dict[str, Any]:
    return {"operator": "AND", "conditions": [{"type": "keyword", "name": name}]}


def cache(**conf: Any) -> dict[str, Any]:
    return {"type": "semantic-cache", "configuration": {"enabled": True, **conf}}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


SIGNALS = {
    "keywords": [{"name": n, "operator": "OR", "keywords": [n]}
                 for n in ("cacheme", "busy", "shape", "fallback", "deadpath", "globalcache",
                           "replayme", "privateq", "toolpick", "vaulted")],
    "embeddings": [{"name": "billing", "threshold": 0.6,
                    "candidates": ["refund my order", "I was charged twice"]}],
}  # fmt: skip
DECISIONS = [
    {"name": "fast", "priority": 100, "rules": kw("busy"),
     "plugins": [{"type": "fast_response", "configuration": {"message": "Busy, try later."}}]},
    {"name": "exact", "priority": 90, "rules": kw("cacheme"), "modelRefs": [{"model": "general"}],
     "plugins": [cache(mode="exact", request_controls={"enabled": True})]},
    {"name": "vault", "priority": 88, "rules": kw("vaulted"), "modelRefs": [{"model": "general"}],
     "plugins": [cache(mode="exact", scope="global"),
                 {"type": "memory", "configuration": {"enabled": False}}],
     "emits": [{"kind": "retention", "retention": {"drop": True, "keep_current_model": True}}]},
    {"name": "shared", "priority": 85, "rules": kw("globalcache"),
     "modelRefs": [{"model": "general"}], "plugins": [cache(mode="exact", scope="global")]},
    {"name": "shaped", "priority": 80, "rules": kw("shape"), "modelRefs": [{"model": "coder"}],
     "plugins": [
         {"type": "system_prompt", "configuration": {"system_prompt": "Be brief."}},
         {"type": "request_params", "configuration": {
             "blocked_params": ["logprobs"], "max_tokens_limit": 5, "max_n": 1}},
         {"type": "header_mutation", "configuration": {
             "add": [{"name": "X-Tenant-Tier", "value": "premium"}],
             "delete": ["Authorization"]}},
     ]},
    {"name": "fb", "priority": 70, "rules": kw("fallback"),
     "modelRefs": [{"model": "broken"}, {"model": "coder"}]},
    {"name": "fbdead", "priority": 70, "rules": kw("deadpath"),
     "modelRefs": [{"model": "dead"}, {"model": "broken"}]},
    {"name": "replayed", "priority": 65, "rules": kw("replayme"),
     "modelRefs": [{"model": "broken"}, {"model": "coder"}],
     "plugins": [{"type": "router_replay", "configuration": {
         "enabled": True, "max_records": 2, "max_body_bytes": 40}}]},
    {"name": "private", "priority": 64, "rules": kw("privateq"), "modelRefs": [{"model": "coder"}],
     "plugins": [{"type": "tools", "configuration": {
         "enabled": True, "mode": "none", "strip_tool_history": True}}]},
    {"name": "toolsel", "priority": 63, "rules": kw("toolpick"), "modelRefs": [{"model": "coder"}],
     "plugins": [{"type": "tool_selection", "configuration": {
         "enabled": True, "mode": "filter", "relevance_threshold": 0.4}}]},
    {"name": "billing", "priority": 60,
     "rules": {"operator": "AND", "conditions": [{"type": "embedding", "name": "billing"}]},
     "modelRefs": [{"model": "coder"}],
     "plugins": [cache(mode="semantic", semantic={"similarity_threshold": 0.9})]},
]  # fmt: skip


@dataclass
class Stack:
    served: Served
    general: StandInBackend
    coder: StandInBackend
    broken: StandInBackend
    chat: ChatRouter
    exchange: FakeWorkerExchange
    client: openai.AsyncOpenAI

    @property
    def url(self) -> str:
        return self.served.url

    def user(self, name: str | None) -> openai.AsyncOpenAI:
        return self.served.client("caller-key", {} if name is None else {"x-authz-user-id": name})


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    general = await StandInBackend("general").start()
    coder = await StandInBackend("coder").start()
    broken = await StandInBackend("broken").start()
    providers = Providers.model_validate(
        {
            "defaults": {"default_model": "general"},
            "models": [
                {"name": "general", "backend_refs": [{"endpoint": general.endpoint}]},
                {"name": "coder", "backend_refs": [{"endpoint": coder.endpoint}]},
                {"name": "broken", "backend_refs": [{"endpoint": broken.endpoint}]},
                {"name": "dead", "backend_refs": [{"endpoint": f"127.0.0.1:{closed_port()}"}]},
            ],
        }
    )
    routing = Routing.model_validate({"signals": SIGNALS, "decisions": DECISIONS})
    exchange = FakeWorkerExchange({"primary"})
    chat = await start_router(providers, routing, exchange=exchange)
    served = await serve_routes(chat.routes())
    st = Stack(served, general, coder, broken, chat, exchange, None)  # type: ignore[arg-type]
    st.client = st.user("alice")
    try:
        yield st
    finally:
        await served.close()
        await chat.backends.close()
        for b in (general, coder, broken):
            await b.stop()


async def ask(client: openai.AsyncOpenAI, text: str, **extra: Any) -> Any:
    return await client.chat.completions.with_raw_response.create(
        model=AUTO, messages=[{"role": "user", "content": text}], **extra
    )


async def ask_stream(client: openai.AsyncOpenAI, text: str, **extra: Any) -> tuple[Any, str]:
    raw = await client.chat.completions.with_raw_response.create(
        model=AUTO, messages=[{"role": "user", "content": text}], stream=True, **extra
    )
    parts = [c.choices[0].delta.content or "" async for c in raw.parse() if c.choices]
    return raw, "".join(parts)


# -- response cache --------------------------------------------------------------------------


async def test_exact_hit_serves_the_same_answer_without_the_backend(stack: Stack) -> None:
    first = await ask(stack.client, "cacheme what is two plus two")
    second = await ask(stack.client, "cacheme what is two plus two")
    assert len(stack.general.received) == 1
    assert "x-vsr-cache-hit" not in first.headers
    assert second.headers["x-vsr-cache-hit"] == "true"
    assert second.headers["x-vsr-selected-decision"] == "exact"
    a, b = first.parse(), second.parse()
    assert b.choices[0].message.content == a.choices[0].message.content
    assert stack.chat.cache is not None
    assert stack.chat.cache.stats.hits[("exact", "exact")] == 1
    assert stack.chat.cache.stats.misses[("exact", "exact")] == 1
    # a different question is a miss
    await ask(stack.client, "cacheme what is three plus three")
    assert len(stack.general.received) == 2


async def test_per_user_entries_are_never_served_to_another_user(stack: Stack) -> None:
    bob = stack.user("bob")
    try:
        a = await ask(stack.client, "cacheme my secret plan")
        b = await ask(bob, "cacheme my secret plan")
        assert len(stack.general.received) == 2  # bob did not get alice's entry
        assert "x-vsr-cache-hit" not in b.headers
        again = await ask(bob, "cacheme my secret plan")
        assert again.headers["x-vsr-cache-hit"] == "true"  # bob's own entry
        assert a.parse().choices[0].message.content == again.parse().choices[0].message.content
    finally:
        await bob.close()


async def test_no_identity_is_not_cached_and_global_scope_is_shared(stack: Stack) -> None:
    anon = stack.user(None)
    bob = stack.user("bob")
    try:
        await ask(anon, "cacheme anonymous question")
        await ask(anon, "cacheme anonymous question")
        assert len(stack.general.received) == 2  # user scope without a user: never cached
        await ask(stack.client, "globalcache shared question")
        shared = await ask(bob, "globalcache shared question")
        assert shared.headers["x-vsr-cache-hit"] == "true"
        assert len(stack.general.received) == 3
    finally:
        await anon.close()
        await bob.close()


async def test_cache_control_no_store_and_no_cache(stack: Stack) -> None:
    nostore = {"extra_headers": {"x-vsr-cache-control": "no-store"}}
    await ask(stack.client, "cacheme do not keep this", **nostore)
    await ask(stack.client, "cacheme do not keep this")
    assert len(stack.general.received) == 2  # the first was not written
    nocache = await ask(
        stack.client, "cacheme do not keep this", extra_headers={"x-vsr-cache-control": "no-cache"}
    )
    assert "x-vsr-cache-hit" not in nocache.headers
    assert len(stack.general.received) == 3


async def test_retention_drop_never_writes_and_shows_in_debug_headers(stack: Stack) -> None:
    debug = {"extra_headers": {"x-vsr-debug": "true"}}
    first = await ask(stack.client, "vaulted private question", **debug)
    second = await ask(stack.client, "vaulted private question")
    assert len(stack.general.received) == 2  # never written, so never a hit
    assert "x-vsr-cache-hit" not in second.headers
    assert first.headers["x-vsr-selected-decision"] == "vault"
    assert first.headers["x-vsr-retention-drop"] == "true"
    assert first.headers["x-vsr-retention-keep-current-model"] == "true"
    assert "x-vsr-retention-ttl-turns" not in first.headers  # unset: left out
    assert not any(h.startswith("x-vsr-retention-") for h in second.headers)  # debug only
    assert stack.chat.cache is not None
    assert stack.chat.cache.stats.skipped["retention.drop"] == 2
    assert stack.chat.cache.stats.misses[("vault", "exact")] == 2  # the lookup still ran


async def test_errors_are_not_cached(stack: Stack) -> None:
    for _ in range(2):
        with pytest.raises(openai.BadRequestError):
            await stack.client.chat.completions.create(
                model=AUTO, messages=[{"role": "user", "content": "FAIL 400 cacheme"}]
            )
    assert len(stack.general.received) == 2


async def test_streamed_answer_is_cached_whole_and_replayed(stack: Stack) -> None:
    _, first = await ask_stream(stack.client, "cacheme stream me a story")
    raw, again = await ask_stream(stack.client, "cacheme stream me a story")
    assert raw.headers["x-vsr-cache-hit"] == "true"
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert again == first == "general got: cacheme stream me a story"
    whole = await ask(stack.client, "cacheme stream me a story")  # a JSON caller, same entry
    assert whole.headers["x-vsr-cache-hit"] == "true"
    assert whole.parse().choices[0].message.content == first
    assert len(stack.general.received) == 1


async def test_partial_stream_is_not_cached(stack: Stack) -> None:
    stack.general.fault = "stream_after_first"
    _, cut = await ask_stream(stack.client, "cacheme broken stream")
    assert cut == "general"  # the first chunk only: the stream just ends
    stack.general.fault = None
    raw, text = await ask_stream(stack.client, "cacheme broken stream")
    assert "x-vsr-cache-hit" not in raw.headers
    assert text == "general got: cacheme broken stream"
    assert len(stack.general.received) == 2


async def test_semantic_hit_reuses_routings_embedding(stack: Stack) -> None:
    await ask(stack.client, "I was charged twice for my order")
    assert stack.exchange.calls["primary"] == 1
    hit = await ask(
        stack.client, "I was charged twice for my order!", extra_headers={"x-vsr-debug": "true"}
    )
    assert hit.headers["x-vsr-cache-hit"] == "true"
    assert hit.headers["x-vsr-selected-decision"] == "billing"
    assert float(hit.headers["x-vsr-cache-similarity"]) >= 0.9
    assert len(stack.coder.received) == 1
    assert stack.exchange.calls["primary"] == 2  # one bundle per chat: nothing extra for the cache
    miss = await ask(stack.client, "I was charged twice for the same ticket yesterday")
    assert "x-vsr-cache-hit" not in miss.headers
    assert len(stack.coder.received) == 2


# -- fast_response and the shapers -----------------------------------------------------------


async def test_fast_response_answers_without_a_backend(stack: Stack) -> None:
    raw = await ask(stack.client, "we are busy")
    doc = raw.parse()
    assert doc.choices[0].message.content == "Busy, try later."
    assert doc.model == "router"
    assert doc.id.startswith("chatcmpl-fast-")
    assert raw.headers["x-vsr-fast-response"] == "true"
    _, text = await ask_stream(stack.client, "we are busy")
    assert text == "Busy, try later."
    assert not stack.general.received and not stack.coder.received


async def test_system_prompt_request_params_and_headers_shape_the_backend_request(
    stack: Stack,
) -> None:
    await stack.client.chat.completions.create(
        model=AUTO,
        messages=[
            {"role": "system", "content": "You are a poet."},
            {"role": "user", "content": "shape this"},
        ],
        max_tokens=100,
        n=1,
        logprobs=True,
    )
    got = stack.coder.received[-1]
    assert got.body["messages"][0] == {"role": "system", "content": "Be brief.\n\nYou are a poet."}
    assert got.body["max_tokens"] == 5
    assert "logprobs" not in got.body
    assert got.headers["X-Tenant-Tier"] == "premium"
    assert "Authorization" not in got.headers  # the caller's key was deleted


# -- backend fallback ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "reasons"),
    [
        ("503", {"http_503"}),
        ("429", {"http_429"}),
        ("reset", {"reset", "connect"}),
        ("stream_before_first", {"stream_first_chunk", "reset"}),
    ],
)
async def test_fallback_before_the_first_byte(stack: Stack, fault: str, reasons: set[str]) -> None:
    stack.broken.fault = fault
    if fault.startswith("stream"):
        raw, text = await ask_stream(stack.client, "fallback please")
    else:
        raw = await ask(stack.client, "fallback please")
        text = raw.parse().choices[0].message.content
    assert text == "coder got: fallback please"
    assert raw.headers["x-vsr-selected-model"] == "coder"
    model, _, reason = raw.headers["x-vsr-backend-fallback"].partition(":")
    assert model == "broken" and reason in reasons
    assert stack.chat.stats.backend_fallbacks[("broken", reason)] == 1
    scrape = stack.chat.stats.to_json()["backend_fallbacks"]
    assert scrape == [{"model": "broken", "reason": reason, "count": 1}]


async def test_refused_then_failing_then_default_model(stack: Stack) -> None:
    stack.broken.fault = "503"
    raw = await ask(stack.client, "deadpath please")
    assert raw.headers["x-vsr-selected-model"] == "general"
    assert raw.headers["x-vsr-backend-fallback"] == "dead:connect,broken:http_503"
    assert raw.parse().choices[0].message.content == "general got: deadpath please"


async def test_no_fallback_after_the_first_byte(stack: Stack) -> None:
    stack.broken.fault = "stream_after_first"
    raw, cut = await ask_stream(stack.client, "fallback please")
    assert cut == "broken"  # what was sent stays sent; the stream ends there
    assert raw.headers["x-vsr-selected-model"] == "broken"
    assert not stack.coder.received
    assert not stack.chat.stats.backend_fallbacks


async def test_no_next_model_once_the_callers_deadline_has_passed(stack: Stack) -> None:
    stack.broken.fault = "slow"  # answers after 1 s; the caller gives the chat 200 ms
    with pytest.raises(openai.APIStatusError) as info:
        await ask(stack.client, "fallback please", extra_headers={"X-Request-Timeout-Ms": "200"})
    assert info.value.status_code == 504
    assert info.value.response.headers["x-vsr-backend-fallback"] == "broken:deadline"
    assert not stack.coder.received  # no time was left for the next model


async def test_fallback_stops_at_the_callers_deadline(stack: Stack) -> None:
    stack.broken.fault = "503"
    raw = await ask(stack.client, "fallback please", extra_headers={"X-Request-Timeout-Ms": "5000"})
    assert raw.headers["x-vsr-selected-model"] == "coder"
    with pytest.raises(openai.BadRequestError):
        await ask(stack.client, "fallback please", extra_headers={"X-Request-Timeout-Ms": "-1"})


async def test_metrics_count_cache_hits_and_backend_fallbacks(stack: Stack) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from vllm_sr.router.metrics import RouterCollector

    await ask(stack.client, "cacheme count me")
    await ask(stack.client, "cacheme count me")
    stack.broken.fault = "503"
    await ask(stack.client, "fallback please")
    registry = CollectorRegistry()
    registry.register(RouterCollector(lambda: stack.chat))
    text = generate_latest(registry).decode()
    assert 'vllm_sr_router_cache_hits_total{decision="exact",tier="exact"} 1.0' in text
    assert 'vllm_sr_router_cache_misses_total{decision="exact",mode="exact"} 1.0' in text
    assert 'vllm_sr_router_backend_fallbacks_total{model="broken",reason="http_503"} 1.0' in text
    assert "vllm_sr_router_cache_entries 1.0" in text


async def test_router_replay_records_each_chat_bounded_per_decision(stack: Stack) -> None:
    stack.broken.fault = "429"  # not marked unhealthy: every chat tries broken first
    first = await ask(stack.client, "replayme first")
    _, streamed = await ask_stream(stack.client, "replayme second, streamed")
    third = await ask(stack.client, "replayme third")
    await ask(stack.client, "cacheme not recorded")  # a decision without router_replay
    doc = await stack.chat.replay.read()
    assert doc["decisions"] == ["replayed"]
    second, last = doc["records"]  # max_records 2: the first was dropped
    assert last["id"] == third.headers["x-vsr-replay-id"] != first.headers["x-vsr-replay-id"]
    assert (second["streaming"], last["streaming"]) == (True, False)
    assert last["decision"] == "replayed" and last["selected_model"] == "broken"
    assert last["model"] == "coder" and last["response_status"] == 200
    assert last["lifecycle_state"] == "completed" and last["original_model"] == AUTO
    assert last["backend_fallbacks"] == ["broken:http_429"]
    assert last["signals"] == {"keyword": ["replayme"]}
    assert last["request_body_truncated"] and len(last["request_body"].encode()) <= 40
    assert last["response_body"].startswith('{"id"') and last["response_body_truncated"]
    assert second["response_body"].startswith("data: ")  # a stream's first bytes
    assert streamed == "coder got: replayme second, streamed"
    assert (await stack.chat.replay.read("replayed", since=last["seq"]))["records"] == []


async def test_router_replay_records_are_read_by_session(stack: Stack) -> None:
    """Two conversations (``x-session-id``) through the SDK: each session's records are read
    apart, with upstream's turn index; a chat without the header gets upstream's derived id."""

    async def turn(session: str, *history: str) -> Any:
        messages = [
            {"role": "user" if i % 2 == 0 else "assistant", "content": text}
            for i, text in enumerate(history)
        ]
        return await stack.client.chat.completions.with_raw_response.create(
            model=AUTO, messages=messages, extra_headers={"x-session-id": session}
        )

    a0 = await turn("sess-a", "replayme, a")
    b0 = await turn("sess-b", "replayme, b")
    for session, answer in (("sess-a", a0), ("sess-b", b0)):
        (rec,) = (await stack.chat.replay.read(session=session))["records"]
        assert rec["id"] == answer.headers["x-vsr-replay-id"]
        assert (rec["session_id"], rec["turn_index"]) == (session, 0)
    a1 = await turn("sess-a", "replayme, a", "done a", "replayme, a again")
    (rec,) = (await stack.chat.replay.read(session="sess-a"))["records"]  # max_records 2
    assert rec["id"] == a1.headers["x-vsr-replay-id"] and rec["turn_index"] == 1
    assert [r["id"] for r in (await stack.chat.replay.read(session="sess-b"))["records"]] == [
        b0.headers["x-vsr-replay-id"]
    ]
    await ask(stack.client, "replayme, no header")  # the client's x-authz-user-id is alice
    last = (await stack.chat.replay.read())["records"][-1]
    digest = hashlib.sha256(b"alice:replayme, no header").hexdigest()[:16]
    assert (last["session_id"], last["turn_index"]) == (f"cc-{digest}", 0)


async def test_tools_none_strips_tools_and_their_history(stack: Stack) -> None:
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    await stack.client.chat.completions.create(
        model=AUTO,
        messages=[
            {"role": "user", "content": "find it"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
            ]},
            {"role": "tool", "tool_call_id": "c1", "content": "secret result"},
            {"role": "user", "content": "privateq now answer"},
        ],
        tools=[tool],  # type: ignore[list-item]
        tool_choice="auto",
    )  # fmt: skip
    got = stack.coder.received[-1].body
    assert "tools" not in got and "tool_choice" not in got
    assert [m["role"] for m in got["messages"]] == ["user", "user"]


async def test_eval_reports_plugins_by_their_canonical_names(stack: Stack) -> None:
    import aiohttp

    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{stack.url}/api/v1/eval", json={"text": "cacheme please"}) as r,
    ):
        doc = await r.json()
    assert doc["decision_result"]["decision_name"] == "exact"
    assert doc["decision_result"]["plugins"] == ["response_cache"]  # written "semantic-cache"


def fn_tool(name: str, description: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": {"type": "object"}}}  # fmt: skip


async def test_tool_selection_keeps_the_relevant_tools(stack: Stack) -> None:
    tools = [
        fn_tool("send_email", "send an email message"),
        fn_tool("get_weather", "get the weather forecast for a city"),
        fn_tool("search_docs", "search documentation pages"),
    ]
    calls = stack.exchange.calls["primary"]
    for choice in ("auto", "auto", "required"):
        await stack.client.chat.completions.create(
            model=AUTO,
            messages=[{"role": "user", "content": "toolpick the weather forecast for paris"}],
            tools=tools,  # type: ignore[arg-type]
            tool_choice=choice,  # type: ignore[arg-type]
        )
    auto, again, required = (r.body for r in stack.coder.received[-3:])
    assert [t["function"]["name"] for t in auto["tools"]] == ["get_weather"]
    assert again["tools"] == auto["tools"]
    assert len(required["tools"]) == 3  # only tool_choice "auto" is selected for, as upstream
    # routing's bundle per chat, plus one for the tool texts (then known)
    assert stack.exchange.calls["primary"] == calls + 3 + 1


async def test_semantic_hit_needs_the_same_history(stack: Stack) -> None:
    text = "I was charged twice for my order"
    await ask(stack.client, text)
    other = await stack.client.chat.completions.with_raw_response.create(
        model=AUTO,
        messages=[
            {"role": "user", "content": "refactor this python function"},
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": text},
        ],
    )
    assert other.headers["x-vsr-selected-decision"] == "billing"
    assert "x-vsr-cache-hit" not in other.headers  # another conversation: never a false hit
    assert len(stack.coder.received) == 2
