"""The worker's result cache: an LRU bounded by bytes, keyed by surface, revision and every
answer-changing field; on the API only 200 answers are cached, and another revision or option
set never gets a cached answer."""

from __future__ import annotations

import pytest

from tests.unit.test_worker_api import serve, stop
from vllm_sr.worker.result_cache import ENTRY_OVERHEAD, ResultCache, cache_key


def test_lru_stays_under_its_byte_bound_and_counts_evictions() -> None:
    entry = 100 + ENTRY_OVERHEAD
    cache = ResultCache(3 * entry)
    for name in (b"a", b"b", b"c"):
        assert cache.put(name, b"x" * 100) == 0
    assert cache.bytes == 3 * entry and len(cache) == 3
    assert cache.get(b"a") == b"x" * 100  # a is now the most recent
    assert cache.put(b"d", b"y" * 100) == 1  # b, the least recent, goes
    assert cache.get(b"b") is None and cache.get(b"a") is not None
    assert cache.put(b"e", b"z" * (2 * 100 + ENTRY_OVERHEAD)) == 2
    assert cache.bytes <= cache.max_bytes
    assert (cache.hits, cache.misses, cache.evictions) == (2, 1, 3)
    assert cache.put(b"huge", b"h" * (3 * entry)) == 0 and cache.get(b"huge") is None
    cache.put(b"e", b"small")  # replacing an entry re-charges it
    assert cache.bytes == sum(len(v) + ENTRY_OVERHEAD for v in cache._entries.values())


def test_off_by_default_and_negative_refused() -> None:
    assert not ResultCache(0).enabled and ResultCache(1).enabled
    with pytest.raises(ValueError, match="negative"):
        ResultCache(-1)


def test_the_key_holds_everything_that_changes_the_answer() -> None:
    body = {"input": ["a", "b"], "encoding_format": "float", "model": "m"}
    base = cache_key("embeddings", "sha256:1", "float32", body)
    assert cache_key("embeddings", "sha256:1", "float32", dict(body)) == base
    assert cache_key("embeddings", "sha256:1", "float32", {**body, "user": "u1"}) == base
    others = [
        cache_key("embeddings", "sha256:2", "float32", body),  # another revision
        cache_key("embeddings", "sha256:1", "bfloat16", body),  # another precision
        cache_key("classify", "sha256:1", "float32", body),  # another surface
        cache_key("embeddings", "sha256:1", "float32", {**body, "encoding_format": "base64"}),
        cache_key("embeddings", "sha256:1", "float32", {**body, "truncate": True}),
        cache_key("embeddings", "sha256:1", "float32", {**body, "input": ["b", "a"]}),
        cache_key("embeddings", "sha256:1", "float32", {**body, "model": "other"}),
        cache_key(
            "classify", "sha256:1", "float32", {"input": "a", "labels": {"x": ["1"], "y": ["2"]}}
        ),
        cache_key(
            "classify", "sha256:1", "float32", {"input": "a", "labels": {"y": ["2"], "x": ["1"]}}
        ),
    ]
    assert len({base, *others}) == len(others) + 1
    # No field boundary can be shifted to forge another key.
    assert cache_key("a", "bc", "", {}) != cache_key("ab", "c", "", {})
    assert cache_key("a", "b", "cd", {}) != cache_key("a", "bc", "d", {})


async def test_api_serves_a_repeat_from_the_cache_and_nothing_across_revisions_or_dtypes() -> None:
    s = await serve(result_cache=ResultCache(1 << 20), revision="sha256:aaaa")
    try:
        body = {"input": ["one", "two words"]}
        first = await s.client.post("/v1/embeddings", json=body)
        assert first.status == 200
        forwards = len(s.runner.forwards)
        again = await s.client.post("/v1/embeddings", json={**body, "user": "someone"})
        assert again.status == 200 and await again.read() == await first.read()
        assert len(s.runner.forwards) == forwards  # answered without a forward
        assert "cache;dur=" in again.headers["Server-Timing"]
        b64 = await s.client.post("/v1/embeddings", json={**body, "encoding_format": "base64"})
        assert isinstance((await b64.json())["data"][0]["embedding"], str)
        assert len(s.runner.forwards) == forwards + 1  # another option set: a forward
        s.state.revision = "sha256:bbbb"  # as if the weights were another revision
        other = await s.client.post("/v1/embeddings", json=body)
        assert other.status == 200 and len(s.runner.forwards) == forwards + 2
        # The same revision served at another precision: not answered from the float32 entry.
        s.state.capabilities = {**(s.state.capabilities or {}), "dtype": "bfloat16"}
        other = await s.client.post("/v1/embeddings", json=body)
        assert other.status == 200 and len(s.runner.forwards) == forwards + 3
        text = await (await s.client.get("/metrics")).text()
        assert "vllm_sr_worker_result_cache_hits_total 1.0" in text
        assert "vllm_sr_worker_result_cache_misses_total 4.0" in text
        assert "vllm_sr_worker_result_cache_bytes " in text
        assert f"vllm_sr_worker_result_cache_bytes {float(s.state.result_cache.bytes)}" in text
    finally:
        await stop(s)


async def test_api_caches_only_200_answers() -> None:
    s = await serve(result_cache=ResultCache(1 << 20), revision="r")
    try:
        for _ in range(2):
            resp = await s.client.post("/v1/classify", json={"input": "a"})  # no labels: 400
            assert resp.status == 400
        assert len(s.state.result_cache) == 0
        bundle = {
            "tasks": [
                {"id": "ok", "embeddings": {"input": "a"}},
                {"id": "bad", "classify": {"input": "a"}},
            ]
        }
        for _ in range(2):
            resp = await s.client.post("/v1/bundle", json=bundle)
            assert resp.status == 200
        assert len(s.state.result_cache) == 0  # a task answered 400: not cached
        assert len(s.runner.forwards) == 2
        good = {"tasks": [{"id": "ok", "embeddings": {"input": "a"}}]}
        await s.client.post("/v1/bundle", json=good)
        await s.client.post("/v1/bundle", json=good)
        assert len(s.state.result_cache) == 1 and len(s.runner.forwards) == 3
    finally:
        await stop(s)


async def test_api_without_a_cache_never_looks_up() -> None:
    s = await serve(revision="r")
    try:
        for _ in range(2):
            assert (await s.client.post("/v1/embeddings", json={"input": "a"})).status == 200
        assert len(s.runner.forwards) == 2
        text = await (await s.client.get("/metrics")).text()
        assert "vllm_sr_worker_result_cache_misses_total 0.0" in text
    finally:
        await stop(s)


def test_worker_options_set_the_cache_bound() -> None:
    from vllm_sr.errors import ConfigError
    from vllm_sr.worker.options import WorkerOptions, build_state

    state = build_state(WorkerOptions("vllm-sr/d3-edge", result_cache_bytes=4096), {})
    assert state.result_cache.enabled and state.result_cache.max_bytes == 4096
    assert "vllm_sr_worker_result_cache_max_bytes 4096.0" in state.metrics.render().decode()
    assert not build_state(WorkerOptions("vllm-sr/d3-edge"), {}).result_cache.enabled
    with pytest.raises(ConfigError, match="--result-cache-bytes: -1"):
        build_state(WorkerOptions("vllm-sr/d3-edge", result_cache_bytes=-1), {})


def test_resize_evicts_least_recent_until_the_rest_fit_and_zero_turns_it_off() -> None:
    entry = 100 + ENTRY_OVERHEAD
    cache = ResultCache(3 * entry)
    for name in (b"a", b"b", b"c"):
        cache.put(name, b"x" * 100)
    cache.get(b"a")  # b is now the least recent
    assert cache.resize(2 * entry) == 1 and cache.get(b"b") is None
    assert cache.bytes == 2 * entry and cache.evictions == 1
    assert cache.resize(0) == 2 and len(cache) == 0 and cache.bytes == 0 and not cache.enabled
    assert cache.resize(entry) == 0 and cache.enabled
    with pytest.raises(ValueError, match="negative"):
        cache.resize(-1)


async def test_api_resizes_a_running_workers_cache_and_health_reports_it() -> None:
    """Issue 39 item 2: the supervisor turns a kept worker's cache on and off without a
    restart (POST /admin/result-cache); /health says the bound."""
    s = await serve(revision="sha256:aaaa")
    try:
        body = {"input": ["one"]}
        assert (await (await s.client.get("/health")).json())["result_cache_bytes"] == 0
        on = await s.client.post("/admin/result-cache", json={"max_bytes": 1 << 20})
        assert on.status == 200 and (await on.json())["result_cache_bytes"] == 1 << 20
        assert (await (await s.client.get("/health")).json())["result_cache_bytes"] == 1 << 20
        await s.client.post("/v1/embeddings", json=body)
        forwards = len(s.runner.forwards)
        await s.client.post("/v1/embeddings", json=body)
        assert len(s.runner.forwards) == forwards  # now answered from the cache
        off = await s.client.post("/admin/result-cache", json={"max_bytes": 0})
        assert (await off.json())["evicted"] == 1
        await s.client.post("/v1/embeddings", json=body)
        assert len(s.runner.forwards) == forwards + 1
        bad = await s.client.post("/admin/result-cache", json={"max_bytes": -1})
        assert bad.status == 400 and "max_bytes" in (await bad.json())["error"]["message"]
    finally:
        await stop(s)
