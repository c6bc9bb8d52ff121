"""The frontend's single-worker result cache: LRU order, entry and byte bounds, keys."""

from __future__ import annotations

from vllm_sr.frontend.cache import CachedAnswer, ResultCache, cache_key


def answer(n: int) -> CachedAnswer:
    return CachedAnswer(200, b"x" * n, "application/json")


def test_lru_evicts_the_least_recently_used() -> None:
    c = ResultCache(max_entries=2)
    c.put(b"a", answer(1))
    c.put(b"b", answer(1))
    assert c.get(b"a") is not None  # a is now the most recent
    c.put(b"c", answer(1))
    assert c.get(b"b") is None and c.get(b"a") is not None and c.get(b"c") is not None
    assert (c.hits, c.misses) == (3, 1)


def test_byte_bound_evicts_and_refuses_oversized() -> None:
    c = ResultCache(max_entries=100, max_bytes=10)
    c.put(b"a", answer(6))
    c.put(b"b", answer(6))
    assert len(c) == 1 and c.size_bytes == 6 and c.get(b"a") is None
    c.put(b"big", answer(11))
    assert c.get(b"big") is None and c.size_bytes == 6


def test_replacing_a_key_keeps_the_byte_count_right() -> None:
    c = ResultCache(max_entries=10, max_bytes=100)
    c.put(b"a", answer(10))
    c.put(b"a", answer(20))
    assert len(c) == 1 and c.size_bytes == 20


def test_key_depends_on_surface_deployment_dtype_and_body() -> None:
    base = cache_key("embeddings", "primary", b'{"input":"a"}')
    assert base == cache_key("embeddings", "primary", b'{"input":"a"}')
    assert base != cache_key("classify", "primary", b'{"input":"a"}')
    assert base != cache_key("embeddings", "other", b'{"input":"a"}')
    assert base != cache_key("embeddings", "primary", b'{"input":"b"}')
    bf16 = cache_key("embeddings", "primary", b'{"input":"a"}', "bfloat16")
    assert bf16 != cache_key("embeddings", "primary", b'{"input":"a"}', "float32")
    assert bf16 != base
