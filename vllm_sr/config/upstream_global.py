"""pydantic models of the upstream vLLM Semantic Router's ``global`` sections that vllm-sr
reads but does not own: the router switches beside ours, ``services``, ``stores`` and
``integrations`` (upstream ``pkg/config/canonical_global.go`` and the structs it names).

Field names and defaults are upstream's, so an upstream file loads unchanged. Most of these
settings configure upstream services that vllm-sr does not run (Envoy, Redis, Milvus, the
Responses API...). Such a setting is accepted when it cannot change routing or the request
(observability, the management API's address); a switch that would turn on behaviour vllm-sr
lacks is refused by ``upstream_refusals`` with "not supported by vllm-sr". Non-connection
sub-blocks are typed in ``upstream_settings`` (observability, management auth) and
``upstream_learning`` (Router Learning, selector globals); ``global.stores`` in
``upstream_stores``. The connection blocks of stores and services (``redis``, ``postgres``,
``milvus``, ...) are :data:`BackendSettings`: mappings kept as written and not checked key by
key, because nothing in vllm-sr connects to them and their switch is refused whenever it would.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vllm_sr.config.router_replay import RouterReplay
from vllm_sr.config.routing_base import BackendSettings, Strict
from vllm_sr.config.upstream_settings import (
    API,
    ManagementAuth,
    Observability,
)

DEFAULT_LOOPER_ENDPOINT = "http://localhost:8899/v1/chat/completions"
DEFAULT_USER_ID_HEADER = "x-authz-user-id"
DEFAULT_USER_GROUPS_HEADER = "x-authz-user-groups"


# -- global.router (upstream's part; schema.Router adds vllm-sr's) ---------------------------


class StreamedBody(Strict):
    enabled: bool = False
    """Upstream: Envoy streams the request body to the router. vllm-sr reads whole bodies."""

    max_bytes: int | None = Field(default=None, ge=0)
    """Upstream: largest streamed body."""

    timeout_sec: int | None = Field(default=None, ge=0)
    """Upstream: streamed body timeout."""


class SkipProcessing(Strict):
    enabled: bool = False
    """Upstream: honour ``x-vsr-skip-processing: true`` (pass the request through unrouted).
    vllm-sr routes every auto request; only false is supported."""


# -- global.services ---------------------------------------------------------------------------


class Identity(Strict):
    user_id_header: str = Field(default=DEFAULT_USER_ID_HEADER, min_length=1, max_length=256)
    """Request header carrying the caller's user id (role_bindings subjects of kind User)."""

    user_groups_header: str = Field(
        default=DEFAULT_USER_GROUPS_HEADER, min_length=1, max_length=256
    )
    """Request header carrying the caller's comma-separated groups (subjects of kind Group)."""


class AuthzProvider(Strict):
    type: str = Field(min_length=1)
    """Upstream: credential provider type (e.g. header-injection)."""

    headers: dict[str, str] | None = None
    """Upstream: headers the provider injects."""


class Authz(Strict):
    fail_open: bool = False
    """A request without a user id matches no role instead of being refused (403) when
    role_bindings are configured."""

    identity: Identity = Field(default_factory=Identity)
    """The identity headers the role_bindings signal reads."""

    providers: list[AuthzProvider] = Field(default_factory=list)
    """Upstream: credential providers that inject headers. vllm-sr has none: only an empty
    list is supported."""


class RateLimitProvider(Strict):
    type: str = Field(min_length=1)
    """Upstream: envoy-ratelimit or local-limiter."""

    address: str | None = None
    """Upstream: rate limit service address."""

    domain: str | None = None
    """Upstream: rate limit domain."""

    rules: list[BackendSettings] | None = None
    """Upstream: local limiter rules."""


class RateLimit(Strict):
    fail_open: bool = False
    """Upstream: let requests through when the limiter fails."""

    providers: list[RateLimitProvider] = Field(default_factory=list)
    """Upstream: rate limiters. vllm-sr limits nothing: only an empty list is supported."""


DEFAULT_REDIS_ADDRESS = "localhost:6379"


class ResponseAPIRedis(Strict):
    """Upstream's ``responsestore`` Redis settings (``ResponseAPIRedisConfig``). A zero where
    upstream has a default means that default, as upstream's Go zero values do."""

    address: str = Field(default=DEFAULT_REDIS_ADDRESS, min_length=1)
    """``host:port`` of a standalone Redis (upstream), or vllm-sr's ``unix:///path/redis.sock``.
    Omitted: ``localhost:6379``, the host's own Redis (upstream's ``vllm-sr serve`` fills an
    omitted address with the Redis it starts beside the router)."""

    password: str | None = None
    """Redis AUTH password."""

    db: int = Field(default=0, ge=0, le=15)
    """Database number (0-15)."""

    key_prefix: str = "sr:"
    """Prefix of every key (``sr:response:<id>``); a ``:`` is added when missing, as upstream."""

    cluster_mode: bool = False
    """Upstream: Redis Cluster. vllm-sr talks to one standalone Redis: only false is
    supported."""

    cluster_addresses: list[str] = Field(default_factory=list)
    """Upstream: the cluster's nodes, read only in cluster mode."""

    pool_size: int = Field(default=10, ge=0)
    """Most connections to Redis (0: 10)."""

    min_idle_conns: int = Field(default=2, ge=0)
    """Upstream: idle connections kept open. redis-py opens connections as needed (metadata)."""

    max_retries: int = Field(default=3, ge=-1)
    """Retries of a failed command (0: 3; -1: none)."""

    dial_timeout: int = Field(default=5, ge=0)
    """Seconds to connect (0: 5)."""

    read_timeout: int = Field(default=3, ge=-1)
    """Seconds to wait for a reply (0: 3; -1: no limit)."""

    write_timeout: int = Field(default=3, ge=-1)
    """Seconds to send a command (0: 3; -1: no limit). redis-py has one timeout per command:
    the larger of read_timeout and write_timeout."""

    tls_enabled: bool = False
    """Upstream: TLS to Redis. Only false is supported."""

    tls_cert_path: str | None = None
    """Upstream: client certificate, read only with TLS."""

    tls_key_path: str | None = None
    """Upstream: client key, read only with TLS."""

    tls_ca_path: str | None = None
    """Upstream: CA bundle, read only with TLS."""

    config_path: str | None = None
    """Upstream: an external file whose Redis settings replace these. Only unset is
    supported (write the settings here)."""


class ResponseAPI(Strict):
    """Upstream's Responses API (``/v1/responses``) and its store. The block omitted: not
    served (upstream's built-in default is enabled with a Redis store that has no address,
    which only upstream's ``vllm-sr serve`` fills in, with the Redis container it starts)."""

    enabled: bool = True
    """Serve ``POST /v1/responses`` and ``GET``/``DELETE /v1/responses/{id}`` (and
    ``/input_items``). Unset in a written block: true, upstream's default."""

    store_backend: Literal["memory", "redis", ""] = "redis"
    """Where stored responses live: ``memory`` (this process; lost on restart) or ``redis``
    (upstream's default; at ``redis.address``, default ``localhost:6379``). ``""`` is memory, as
    upstream reads it."""

    ttl_seconds: int = Field(default=86400, ge=0)
    """How long a stored response lives (0: upstream's store default, 30 days)."""

    max_responses: int = Field(default=1000, ge=0)
    """The memory store's bound: the oldest response is evicted beyond it (0: 10000, upstream's
    store default). The Redis store is bounded by the TTL only, as upstream."""

    redis: ResponseAPIRedis = Field(default_factory=ResponseAPIRedis)
    """The Redis store's connection (read with ``store_backend: redis``)."""

    def backend(self) -> str:
        """The store backend in effect (``""`` is memory)."""
        return self.store_backend or "memory"


class ManagementAPI(Strict):
    bind_address: str | None = None
    """Upstream: the management API's bind address (default 127.0.0.1)."""

    port: int | None = Field(default=None, ge=0, le=65535)
    """Upstream: the management API's port (default 8080)."""

    remote_exposure: bool | None = None
    """Upstream: allow binding beyond loopback."""

    auth: ManagementAuth | None = None
    """Upstream: management API auth (mode, tokens, roles)."""


class StartupStatus(Strict):
    store_backend: str | None = None
    """Upstream: where startup status is kept (file, redis)."""

    redis: BackendSettings | None = None
    """Upstream: Redis connection."""


class Services(Strict):
    api: API = Field(default_factory=API)
    """Upstream: API limits."""

    response_api: ResponseAPI | None = None
    """The Responses API (/v1/responses) and its store; omitted: not served."""

    observability: Observability = Field(default_factory=Observability)
    """Upstream: tracing and metrics (accepted; deployment only)."""

    authz: Authz = Field(default_factory=Authz)
    """Identity headers and fail_open of the role_bindings (authz) signal."""

    ratelimit: RateLimit = Field(default_factory=RateLimit)
    """Upstream: rate limiting (refused when a provider is configured)."""

    management_api: ManagementAPI = Field(default_factory=ManagementAPI)
    """Upstream: the management API's address and auth (accepted; deployment only)."""

    router_replay: RouterReplay = Field(default_factory=RouterReplay)
    """Upstream: exchange recording (refused when enabled)."""

    startup_status: StartupStatus = Field(default_factory=StartupStatus)
    """Upstream: startup status store (accepted; deployment only)."""


# -- global.integrations -----------------------------------------------------------------------


class Tools(Strict):
    """Upstream's tool database, used by decisions' tools / tool_selection plugins (refused)."""

    enabled: bool = False
    """Upstream: tool database loaded."""

    top_k: int | None = None
    """Upstream: tools selected per request."""

    similarity_threshold: float | None = None
    """Upstream: tool similarity threshold."""

    tools_db_path: str | None = None
    """Upstream: the tool database file."""

    fallback_to_empty: bool | None = None
    """Upstream: no tools when none match."""

    advanced_filtering: BackendSettings | None = None
    """Upstream: advanced tool filtering."""


class LooperSlugs(Strict):
    model_names: list[str] = Field(default_factory=list)
    """Upstream: request model names that run this looper directly."""


class LooperFlow(Strict):
    model_names: list[str] = Field(default_factory=list)
    """Upstream: request model names that run the flow looper directly."""

    state: BackendSettings | None = None
    """Upstream: workflow state store."""


class Looper(Strict):
    endpoint: str = DEFAULT_LOOPER_ENDPOINT
    """Upstream: where multi-call (looper) algorithms send their calls; upstream's default is
    http://localhost:8899/v1/chat/completions, its own proxy. vllm-sr is the proxy and never
    calls it: set (or omitted), it switches loopers on; vllm-sr then runs confidence, ratings,
    remom, fusion and workflows decisions as loopers itself (vllm_sr/router/looper);
    ``endpoint: ""`` runs every looper type as static, as upstream."""

    grpc_max_msg_size_mb: int | None = None
    """Upstream: gRPC message cap."""

    max_response_bytes_mb: int | None = None
    """Upstream: looper response cap."""

    timeout_seconds: int | None = None
    """Upstream: looper call timeout."""

    retry_count: int | None = None
    """Upstream: looper retries."""

    headers: dict[str, str] | None = None
    """Upstream: headers on looper calls."""

    remom: LooperSlugs = Field(default_factory=LooperSlugs)
    """Upstream: ReMoM slugs."""

    fusion: LooperSlugs = Field(default_factory=LooperSlugs)
    """Upstream: Fusion slugs."""

    flow: LooperFlow = Field(default_factory=LooperFlow)
    """Upstream: Flow slugs and state."""

    def slugs(self) -> list[str]:
        """Every request model name that names a looper directly (refused as entrypoints)."""
        return [*self.remom.model_names, *self.fusion.model_names, *self.flow.model_names]


class Integrations(Strict):
    tools: Tools = Field(default_factory=Tools)
    """Upstream: the tool database (used only by refused plugins)."""

    looper: Looper = Field(default_factory=Looper)
    """Upstream: the looper endpoint of multi-call algorithms."""


RoutingStrategy = Literal["priority", "confidence"]
