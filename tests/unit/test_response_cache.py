"""The response cache's parts apart from HTTP: the memory store's bounds on a fake clock, the
keys and controls, a streamed answer assembled and replayed, the query embedding reused from
routing's answer or asked once, ages and TTLs on the plugin's clock, a decision's retention
directive (no write on drop, the TTL from ttl_turns)."""

from __future__ import annotations

import json
from typing import Any

import numpy
import pytest

from tests.support.backends import FakeWorkerExchange, answer_bundle
from vllm_sr.clock import FakeClock
from vllm_sr.config.plugin_cache import CacheRequestControls
from vllm_sr.router.cache import keys
from vllm_sr.router.cache.answer import AnswerRecorder, assemble_sse, replay_sse
from vllm_sr.router.cache.embedding import QueryEmbedding, query_vector
from vllm_sr.router.cache.store import Entry, MemoryStore


def entry(key: str, clock: FakeClock, size: int = 100, ttl: float = 60.0, **kw: object) -> Entry:
    now = clock.time()
    return Entry(key, b"x" * size, now, now + ttl, **kw)  # type: ignore[arg-type]


async def test_memory_store_is_bounded_in_bytes_lru_first() -> None:
    clock = FakeClock()
    one = entry("a", clock).size
    store = MemoryStore(max_bytes=3 * one, max_entries=100, clock=clock)
    for key in "abc":
        await store.put(entry(key, clock))
    assert await store.get("a") is not None  # a is now the most recently used
    await store.put(entry("d", clock))
    assert await store.get("b") is None  # b was least recently used
    assert {k for k in "acd" if await store.get(k) is not None} == {"a", "c", "d"}
    assert store.usage() == (3, 3 * one)
    await store.put(entry("huge", clock, size=10 * one))  # larger than the store: not kept
    assert await store.get("huge") is None


async def test_memory_store_drops_entries_at_their_ttl() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    vec = numpy.ones(4, dtype=numpy.float32) / 2
    await store.put(entry("a", clock, ttl=10, group="g", vector=vec))
    clock.advance(9.9)
    assert await store.get("a") is not None
    assert await store.nearest("g", vec, 0.9) is not None
    clock.advance(0.2)
    assert await store.nearest("g", vec, 0.9) is None
    assert await store.get("a") is None
    assert store.usage() == (0, 0)


async def test_memory_store_semantic_threshold() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    vec = numpy.array([1, 0, 0], dtype=numpy.float32)
    await store.put(entry("a", clock, group="g", vector=vec))
    close = numpy.array([0.95, 0.31, 0], dtype=numpy.float32)
    found = await store.nearest("g", close, 0.9)
    assert found is not None and found[0].key == "a" and found[1] == pytest.approx(0.95, abs=0.01)
    assert await store.nearest("g", close, 0.99) is None
    assert await store.nearest("other", vec, 0.1) is None


def test_controls_follow_upstream() -> None:
    on = CacheRequestControls(enabled=True, allowed=["no-store", "ttl"], max_ttl_seconds=30)
    c = keys.parse_controls(on, {"x-vsr-cache-control": "No-Store, no-cache, ttl=100"})
    assert (c.read, c.write, c.ttl_s) == (True, False, 30)  # no-cache not allowed: ignored
    off = keys.parse_controls(CacheRequestControls(), {"x-vsr-cache-control": "bypass"})
    assert (off.read, off.write) == (True, True)
    assert keys.effective_ttl(3600, 10) == 10 and keys.effective_ttl(60, 100) == 60


def test_keys_ignore_stream_and_group_needs_the_same_history() -> None:
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    assert keys.exact_key("p", body) == keys.exact_key("p", {**body, "stream": False})
    assert keys.exact_key("p", body) != keys.exact_key("q", body)
    other = {**body, "messages": [{"role": "user", "content": "hello"}]}
    assert keys.semantic_group("p", body) == keys.semantic_group("p", other)
    longer = {**body, "messages": [{"role": "system", "content": "s"}, *other["messages"]]}
    assert keys.semantic_group("p", body) != keys.semantic_group("p", longer)
    image_only = {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}
    assert keys.semantic_group("p", image_only) is None
    assert (
        keys.scope_identity("team", {"x-authz-user-groups": "eng, ops"}, "u", "x-authz-user-groups")
        == "eng"
    )
    assert keys.scope_identity("user", {}, "x-authz-user-id", "g") is None


def sse(*events: object) -> bytes:
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events)


def test_stream_assembled_replayed_and_cut_streams_refused() -> None:
    chunk = {"id": "c", "created": 1, "model": "m"}
    raw = sse(
        {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}}]},
        {**chunk, "choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]},
    )
    doc = assemble_sse(raw + b"data: [DONE]\n\n")
    assert doc is not None and doc["choices"][0]["message"]["content"] == "Hello"
    assert assemble_sse(replay_sse(doc))["choices"] == doc["choices"]  # type: ignore[index]
    rec = AnswerRecorder()
    rec.chunk(raw)  # no [DONE], no finish(): the stream was cut
    assert rec.document() is None
    rec.chunk(b"data: [DONE]\n\n")
    rec.finish()
    assert rec.document() is not None
    length = AnswerRecorder()
    length.whole(200, json.dumps({"choices": [{"finish_reason": "length"}]}).encode())
    assert length.document() is None
    error = AnswerRecorder()
    error.whole(500, b'{"choices": [{"finish_reason": "stop"}]}')
    assert error.document() is None


async def test_query_embedding_reuses_routing_or_asks_once() -> None:
    exchange = FakeWorkerExchange({"primary"})
    body = json.dumps(
        {
            "tasks": [
                {"id": "query", "embeddings": {"input": ["hello"], "encoding_format": "base64"}}
            ]
        }
    ).encode()
    routed = QueryEmbedding("primary", "hello", answer=answer_bundle(body))
    vec = await routed.vector(exchange, None)
    assert vec is not None and routed.reused and exchange.calls["primary"] == 0
    fresh = QueryEmbedding("primary", "hello")
    again = await fresh.vector(exchange, None)
    await fresh.vector(exchange, None)
    assert exchange.calls["primary"] == 1 and fresh.exchanges == 1
    assert again is not None and numpy.allclose(again, vec)
    assert query_vector(b"not json") is None


class _Decision:
    """The bits of a routing Decision the cache reads."""

    name = "d"
    model_refs: tuple[Any, ...] = ()
    plugins: tuple[Any, ...] = ()


def _plan(
    cache: Any, plugin: Any, text: str, control: str = "", user: str = "u", retention: Any = None
) -> Any:
    from vllm_sr.router.cache.embedding import QueryEmbedding

    headers = {"x-authz-user-id": user, "x-vsr-cache-control": control}
    body = {"model": "auto", "messages": [{"role": "user", "content": text}]}
    return cache.plan(
        plugin, body=body, headers=headers, recipe="default", decision=_Decision(),
        selected_model="m", user_id_header="x-authz-user-id",
        user_groups_header="x-authz-user-groups", embedding=QueryEmbedding("primary", text),
        retention=retention,
    )  # fmt: skip


ANSWER = {"choices": [{"index": 0, "message": {"content": "a"}, "finish_reason": "stop"}]}


async def test_max_age_and_requested_ttl_bound_hits_on_the_clock() -> None:
    from vllm_sr.config.plugin_cache import ResponseCachePlugin
    from vllm_sr.router.plugins.response_cache import ResponseCache

    clock = FakeClock()
    cache = ResponseCache(
        MemoryStore(clock=clock), exchange=FakeWorkerExchange({"primary"}), clock=clock
    )
    plugin = ResponseCachePlugin.model_validate(
        {"enabled": True, "mode": "exact",
         "request_controls": {"enabled": True, "allowed": ["max-age", "ttl", "no-store"]}}
    )  # fmt: skip
    await cache.write(_plan(cache, plugin, "q"), ANSWER)
    clock.advance(10)
    assert await cache.lookup(_plan(cache, plugin, "q", "max-age=5")) is None
    assert await cache.lookup(_plan(cache, plugin, "q", "max-age=20")) is not None
    await cache.write(_plan(cache, plugin, "short", "ttl=3"), ANSWER)
    clock.advance(2.9)
    assert await cache.lookup(_plan(cache, plugin, "short")) is not None
    clock.advance(0.2)
    assert await cache.lookup(_plan(cache, plugin, "short")) is None
    await cache.write(_plan(cache, plugin, "kept", "no-store"), ANSWER)
    assert await cache.lookup(_plan(cache, plugin, "kept")) is None
    assert cache.stats.skipped["no-store"] == 1
    assert _plan(cache, plugin, "q", user="") is None  # no identity: not cached at all


async def test_semantic_tier_is_skipped_when_no_embedding_can_be_had() -> None:
    from vllm_sr.config.plugin_cache import ResponseCachePlugin
    from vllm_sr.errors import Unavailable
    from vllm_sr.router.plugins.response_cache import ResponseCache

    clock = FakeClock()
    exchange = FakeWorkerExchange({"primary"})
    cache = ResponseCache(MemoryStore(clock=clock), exchange=exchange, clock=clock)
    plugin = ResponseCachePlugin(enabled=True)  # semantic, the default mode
    await cache.write(_plan(cache, plugin, "what is the capital of france"), ANSWER)
    assert cache.stats.writes["d"] == 1
    hit = await cache.lookup(_plan(cache, plugin, "what is the capital of France?"))
    assert hit is not None and hit.tier == "semantic" and hit.similarity > 0.99
    exchange.raise_error = Unavailable("the deployment is down")
    assert await cache.lookup(_plan(cache, plugin, "what is the capital of France?")) is None
    assert not cache.stats.errors  # not a store failure: the tier was skipped


def _cache(clock: FakeClock) -> Any:
    from vllm_sr.router.plugins.response_cache import ResponseCache

    return ResponseCache(
        MemoryStore(clock=clock), exchange=FakeWorkerExchange({"primary"}), clock=clock
    )


async def test_retention_drop_skips_the_write_but_not_the_lookup() -> None:
    from vllm_sr.config.plugin_cache import ResponseCachePlugin
    from vllm_sr.config.routing import Retention

    clock = FakeClock()
    cache = _cache(clock)
    plugin = ResponseCachePlugin(enabled=True, mode="exact")
    drop = Retention(drop=True)
    await cache.write(_plan(cache, plugin, "q", retention=drop), ANSWER)
    assert await cache.lookup(_plan(cache, plugin, "q")) is None  # nothing was written
    assert cache.stats.skipped["retention.drop"] == 1 and not cache.stats.writes
    await cache.write(_plan(cache, plugin, "q"), ANSWER)  # written by a decision without it
    assert await cache.lookup(_plan(cache, plugin, "q", retention=drop)) is not None
    kept = Retention(drop=False, keep_current_model=True, prefer_prefix_retention=True)
    await cache.write(_plan(cache, plugin, "other", retention=kept), ANSWER)
    assert cache.stats.writes["d"] == 2 and cache.stats.skipped["retention.drop"] == 1


async def test_retention_ttl_turns_sets_the_entry_lifetime_on_the_clock() -> None:
    from vllm_sr.config.plugin_cache import ResponseCachePlugin
    from vllm_sr.config.routing import Retention

    clock = FakeClock()
    cache = _cache(clock)
    plugin = ResponseCachePlugin.model_validate(
        {"enabled": True, "mode": "exact", "ttl_seconds": 30,
         "request_controls": {"enabled": True, "allowed": ["ttl"]}}
    )  # fmt: skip
    two = Retention(ttl_turns=2)
    # 60 s a turn, over the plugin's 30 s and the request's ttl=5 (upstream applies it last)
    plan = _plan(cache, plugin, "q", control="ttl=5", retention=two)
    assert plan.ttl_s == 120
    await cache.write(plan, ANSWER)
    clock.advance(119.9)
    assert await cache.lookup(_plan(cache, plugin, "q")) is not None
    clock.advance(0.2)
    assert await cache.lookup(_plan(cache, plugin, "q")) is None
    # ttl_turns 0 (or unset) leaves the configured lifetime
    assert _plan(cache, plugin, "q", retention=Retention(ttl_turns=0)).ttl_s == 30
    assert _plan(cache, plugin, "q", control="ttl=5").ttl_s == 5


def test_retention_directive_and_its_debug_headers_are_tri_state() -> None:
    from vllm_sr.config.routing import Decision
    from vllm_sr.router import retention

    dec = Decision.model_validate(
        {"name": "d", "emits": [{"kind": "retention", "retention": {"ttl_turns": 0,
                                                                    "keep_current_model": False}}]}
    )  # fmt: skip
    found = retention.directive(dec.emits)
    assert found is not None and not retention.drops(found)
    assert retention.ttl_override_s(found) is None
    assert retention.debug_headers(found) == {
        "x-vsr-retention-ttl-turns": "0",
        "x-vsr-retention-keep-current-model": "false",
    }
    assert retention.directive(Decision(name="d").emits) is None
    assert retention.debug_headers(None) == {}
    every = Decision.model_validate(
        {"name": "d", "emits": [{"kind": "retention", "retention": {
            "drop": True, "prefer_prefix_retention": True}}]}
    )  # fmt: skip
    assert retention.debug_headers(retention.directive(every.emits)) == {
        "x-vsr-retention-drop": "true",
        "x-vsr-retention-prefer-prefix": "true",
    }
