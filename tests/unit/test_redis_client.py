"""The one Redis client factory of Router mode's stores (vllm_sr/router/redis_client.py): the
address grammar, timeouts, retries and TLS, and each store's settings read through it. No
server is needed: redis-py connects lazily, and the pool's kwargs say what it would do."""

from __future__ import annotations

import pytest

from vllm_sr.router.redis_client import redis_client


@pytest.mark.parametrize(
    ("address", "where"),
    [
        ("db.local:6380", {"host": "db.local", "port": 6380}),
        ("db.local", {"host": "db.local", "port": 6379}),
        (":6390", {"host": "localhost", "port": 6390}),
        (None, {"host": "localhost", "port": 6379}),
        ("unix:///run/r.sock", {"path": "/run/r.sock"}),
        ("/run/r.sock", {"path": "/run/r.sock"}),
    ],
)
async def test_the_address_grammar(address: str | None, where: dict[str, object]) -> None:
    client = redis_client(address, db=3, password="pw", timeout_s=0.5)
    kwargs = client.connection_pool.connection_kwargs
    assert {k: kwargs[k] for k in where} == where
    assert (kwargs["db"], kwargs["password"]) == (3, "pw")
    assert kwargs["socket_timeout"] == 0.5
    assert kwargs.get("socket_connect_timeout", 0.5) == 0.5  # a Unix socket has none
    assert kwargs["retry"].get_retries() == 0
    await client.aclose()


async def test_url_connect_timeout_retries_and_tls() -> None:
    client = redis_client(url="redis://h:7000/5", timeout_s=None, connect_timeout_s=2.0, retries=3)
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("h", 7000, 5)
    assert kwargs["socket_timeout"] is None and kwargs["socket_connect_timeout"] == 2.0
    assert kwargs["retry"].get_retries() == 3
    await client.aclose()
    tls = redis_client("h:7000", timeout_s=1.0, tls=True, tls_verify=False)
    assert tls.connection_pool.connection_kwargs["ssl_cert_reqs"] == "none"
    await tls.aclose()


async def test_every_store_builds_its_client_here() -> None:
    from vllm_sr.config.router_replay import RouterReplayRedis
    from vllm_sr.router.cache.redis_store import redis_client as cache_client
    from vllm_sr.router.learning.shared_store import SharedConversations
    from vllm_sr.router.replay.redis_store import redis_client as replay_client

    cache, prefix = cache_client({"connection": {"host": "c", "port": 1, "timeout": 0.2}})
    kw = cache.connection_pool.connection_kwargs
    assert (kw["host"], kw["port"], kw["socket_timeout"], prefix) == ("c", 1, 0.2, "vsr:rc:")
    await cache.aclose()
    replay = replay_client(RouterReplayRedis(address="r:2", pool_size=4))
    assert replay.connection_pool.max_connections == 4
    assert replay.connection_pool.connection_kwargs["port"] == 2
    await replay.aclose()
    shared = SharedConversations("s:3", timeout_s=0.1)
    kw = shared.client.connection_pool.connection_kwargs
    assert (kw["host"], kw["port"], kw["socket_timeout"]) == ("s", 3, 0.1)
    assert kw["retry"].get_retries() == 0
    await shared.client.aclose()
