"""The one Redis client factory of Router mode's stores: the response cache, router_replay,
the Responses API store and Router Learning's shared conversations.

Each store keeps its own settings and their defaults (as upstream gives them) and hands them
here; the address grammar, the timeouts, TLS and the retry policy are built in one place:

- ``url``: any redis-py URL (``redis://host:port/db``, ``unix:///path``), its own options
  winning; else ``address``: ``unix:///path`` or ``/path`` (a Unix socket), ``host:port``,
  ``host`` (port 6379), ``:port`` (localhost); unset: ``localhost:6379``.
- ``retries``: 0 (the default: a store that is down costs a chat one failed attempt, not a
  backoff), or that many retries with redis-py's exponential backoff (8 ms doubling to 512 ms,
  go-redis' defaults, the Responses API store's).
"""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff, NoBackoff

DEFAULT_ADDRESS = "localhost:6379"
DEFAULT_PORT = 6379


def redis_client(
    address: str | None = None,
    *,
    url: str | None = None,
    db: int = 0,
    password: str | None = None,
    timeout_s: float | None,
    connect_timeout_s: float | None = None,
    retries: int = 0,
    max_connections: int | None = None,
    tls: bool = False,
    tls_verify: bool = True,
) -> aioredis.Redis:
    """A client for one store. ``timeout_s`` bounds each command (None: no limit);
    ``connect_timeout_s`` the connect (default: ``timeout_s``)."""
    retry = (
        Retry(ExponentialBackoff(cap=0.512, base=0.008), retries)
        if retries > 0
        else Retry(NoBackoff(), 0)
    )
    connect_s = timeout_s if connect_timeout_s is None else connect_timeout_s
    if url:
        return aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=connect_s,
            retry=retry,
            max_connections=max_connections,
        )
    address = address or DEFAULT_ADDRESS
    if address.startswith("unix://") or address.startswith("/"):
        return aioredis.Redis(
            unix_socket_path=address.removeprefix("unix://"),
            db=db,
            password=password or None,
            socket_timeout=timeout_s,
            socket_connect_timeout=connect_s,
            retry=retry,
            max_connections=max_connections,
        )
    host, colon, port = address.rpartition(":")
    if not colon:
        host, port = address, ""
    return aioredis.Redis(
        host=host or "localhost",
        port=int(port or DEFAULT_PORT),
        db=db,
        password=password or None,
        socket_timeout=timeout_s,
        socket_connect_timeout=connect_s,
        retry=retry,
        max_connections=max_connections,
        ssl=tls,
        ssl_cert_reqs="required" if tls_verify else "none",
    )
