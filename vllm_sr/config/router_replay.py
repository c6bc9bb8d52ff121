"""``global.services.router_replay``: where the router_replay plugin's records are kept
(upstream ``pkg/config/runtime_config.go`` ``RouterReplayConfig`` and its store blocks), and
the decision's ``router_replay`` plugin itself (:class:`RouterReplayPlugin`, upstream's
``C/plugin_config.go``).

``enabled`` is every decision's default (a decision's ``router_replay`` plugin overrides it,
as upstream's ``EffectiveRouterReplayConfig`` layers them). ``store_backend`` memory (the
default), redis and postgres are acted on (vllm_sr/router/replay/); milvus and qdrant are
typed so upstream files load, and refused by ``upstream_refusals`` when selected. A store
that cannot be reached never fails a chat nor the router's start (docs/router.md).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from vllm_sr.config.routing_base import Strict

StoreBackend = Literal["memory", "redis", "postgres", "milvus", "qdrant"]
ACTED_ON_BACKENDS = ("memory", "redis", "postgres")
DEFAULT_TTL_S = 2592000  # upstream's canonical default (30 days)
DEFAULT_TABLE = "router_replay_records"
DEFAULT_KEY_PREFIX = "router_replay:"
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class RouterReplayRedis(Strict):
    address: str | None = None
    """``host:port`` (default ``localhost:6379``); vllm-sr also takes a Unix socket path
    (``/run/redis.sock`` or ``unix:///run/redis.sock``)."""

    db: int = Field(default=0, ge=0)
    """Redis database number."""

    password: str | None = None
    """Redis password (``${VAR}`` is read from the environment when the store connects)."""

    use_tls: bool = False
    """Connect with TLS."""

    tls_skip_verify: bool = False
    """With TLS: do not verify the server's certificate."""

    max_retries: int | None = Field(default=None, ge=0)
    """Upstream: command retries (default 3). vllm-sr retries none per write: a failed write
    marks the store down and it is retried with backoff (docs/router.md)."""

    pool_size: int | None = Field(default=None, ge=0)
    """Most connections to Redis (default 10)."""

    key_prefix: str | None = None
    """Prefix of every record key (default ``router_replay:``)."""


class RouterReplayPostgres(Strict):
    host: str | None = None
    """Server host (default ``localhost``); a path (``/run/postgresql``) is the directory of
    its Unix socket, as libpq reads it."""

    port: int | None = Field(default=None, ge=0, le=65535)
    """Server port (default 5432)."""

    database: str | None = None
    """Database name (required)."""

    user: str | None = None
    """User name (required)."""

    password: str | None = None
    """Password (``${VAR}`` is read from the environment when the store connects)."""

    ssl_mode: str | None = None
    """libpq's sslmode (default ``disable``)."""

    max_open_conns: int | None = Field(default=None, ge=0)
    """Upstream: most connections in the pool (default 25). vllm-sr keeps one connection,
    used by one statement at a time (one small row per routed chat)."""

    max_idle_conns: int | None = Field(default=None, ge=0)
    """Upstream: idle connections kept (default 5). vllm-sr keeps its one connection."""

    conn_max_lifetime: int | None = Field(default=None, ge=0)
    """Upstream: a connection is replaced after this many seconds (default 300). vllm-sr
    keeps its connection until it fails."""

    table_name: str | None = None
    """The records table (default ``router_replay_records``), created when missing."""

    @model_validator(mode="after")
    def _table_identifier(self) -> RouterReplayPostgres:
        if self.table_name is not None and not IDENTIFIER.match(self.table_name):
            raise ValueError(
                f"table_name {self.table_name!r} is not a plain SQL identifier; accepted: "
                "letters, digits and underscores, not starting with a digit"
            )
        return self


class RouterReplayMilvus(Strict):
    address: str | None = None
    """Upstream: Milvus address (the milvus store is refused by vllm-sr)."""

    username: str | None = None
    """Upstream: Milvus user."""

    password: str | None = None
    """Upstream: Milvus password."""

    collection_name: str | None = None
    """Upstream: the records collection."""

    consistency_level: str | None = None
    """Upstream: Strong, Session, Bounded, Eventually."""

    shard_num: int | None = None
    """Upstream: shards of the collection."""


class RouterReplayQdrant(Strict):
    host: str | None = None
    """Upstream: Qdrant host (the qdrant store is refused by vllm-sr)."""

    port: int | None = None
    """Upstream: Qdrant port."""

    api_key: str | None = None
    """Upstream: Qdrant API key."""

    use_tls: bool | None = None
    """Upstream: connect with TLS."""

    collection_name: str | None = None
    """Upstream: the records collection."""


class RouterReplay(Strict):
    enabled: bool = False
    """Every decision records its chats unless its ``router_replay`` plugin says
    ``enabled: false`` (a plugin with ``enabled: true`` records whatever this says)."""

    store_backend: StoreBackend | None = None
    """Where records are kept: memory (the default; unset with a ``postgres`` or ``redis``
    block: that store, as upstream infers it), redis, postgres. milvus and qdrant are
    refused."""

    ttl_seconds: int = Field(default=DEFAULT_TTL_S, ge=0)
    """A record is dropped this many seconds after it was written (0: never)."""

    async_writes: bool = False
    """true: a record is written off the chat's path through a bounded queue; false: the
    chat's answer waits for its record's write (bounded by the store's timeout)."""

    redis: RouterReplayRedis | None = None
    """The redis store's connection."""

    postgres: RouterReplayPostgres | None = None
    """The postgres store's connection."""

    milvus: RouterReplayMilvus | None = None
    """Upstream: the milvus store's connection (refused when selected)."""

    qdrant: RouterReplayQdrant | None = None
    """Upstream: the qdrant store's connection (refused when selected)."""

    capture_personal_data: bool | None = None
    """v0.4: records keep personal data (upstream's default true, what vllm-sr does); false is
    refused."""

    @property
    def backend(self) -> str:
        """The store in use: ``store_backend``, else inferred from the blocks written (postgres,
        redis, milvus, qdrant: upstream's order), else memory."""
        if self.store_backend is not None:
            return self.store_backend
        written = (
            ("postgres", self.postgres),
            ("redis", self.redis),
            ("milvus", self.milvus),
            ("qdrant", self.qdrant),
        )
        return next((name for name, block in written if block is not None), "memory")


class RouterReplayPlugin(Strict):
    enabled: bool | None = None
    """Record this decision's chats (false: never); unset: ``global.services.router_replay.
    enabled``, as upstream layers them."""

    max_records: int = Field(default=10000, ge=1)
    """Records kept for the decision by the memory store (oldest dropped first); the redis and
    postgres stores are bounded by ``ttl_seconds`` alone, as upstream's are."""

    capture_request_body: bool = True
    """Keep the request body (its first max_body_bytes)."""

    capture_response_body: bool = True
    """Keep the answer body, or a stream's bytes (its first max_body_bytes)."""

    max_body_bytes: int = Field(default=4096, ge=0)
    """Bodies are cut to this many bytes (``*_truncated`` says so)."""

    max_tool_trace_bytes: int = Field(default=0, ge=0)
    """Upstream: tool traces; vllm-sr records none (metadata)."""

    max_tool_trace_steps: int = Field(default=100, ge=0)
    """Upstream: tool trace steps (metadata)."""
