"""pydantic models of upstream's ``global.stores``: the response cache (the store of the
decisions' ``response_cache`` plugins), agentic memory and the vector store (upstream
``pkg/config/canonical_global.go`` and the structs it names).

Only the response cache is acted on; memory and the vector store are refused by
``upstream_refusals`` when enabled. Their connection blocks are
:data:`~vllm_sr.config.routing_base.BackendSettings`, kept as written.
"""

from __future__ import annotations

from pydantic import Field

from vllm_sr.config.routing_base import BackendSettings, Strict

# -- global.stores -----------------------------------------------------------------------------


class PolarityGuardNLI(Strict):
    contradiction_threshold: float | None = None
    """Upstream: the NLI contradiction threshold."""


class PolarityGuard(Strict):
    mode: str | None = None
    """Upstream v0.4: off, observe, enforce (vllm-sr: only off, or unset)."""

    nli: PolarityGuardNLI | None = None
    """Upstream: the NLI model it asks."""


class MemoryPersistence(Strict):
    timeout_seconds: int | None = Field(default=None, ge=0)
    """Upstream v0.4: a write's time limit (memory is refused when on)."""

    concurrency: int | None = Field(default=None, ge=0, le=64)
    """Upstream: writers."""

    queue: int | None = Field(default=None, ge=0, le=1024)
    """Upstream: queued writes."""

    shutdown_grace_seconds: int | None = Field(default=None, ge=0)
    """Upstream: drain time at shutdown."""


class ResponseCache(Strict):
    """Upstream's response cache, the store of the decisions' ``response_cache`` plugins
    (vllm_sr/router/plugins/response_cache.py); ``enabled`` unset means on, as upstream."""

    enabled: bool = False
    """Upstream: the cache switch."""

    backend_type: str | None = None
    """Upstream: memory, redis, valkey, milvus, qdrant."""

    similarity_threshold: float | None = Field(default=None, ge=0, le=1)
    """Upstream: semantic hit threshold."""

    max_entries: int | None = Field(default=None, ge=0)
    """Upstream: most cached entries (default 1000; the memory store's bound)."""

    max_bytes: int | None = Field(default=None, ge=0)
    """vllm-sr's: the memory store's bound in bytes (default 256 MiB), least recently used
    entries evicted first."""

    ttl_seconds: int | None = Field(default=None, ge=0)
    """Upstream: entry lifetime (default 3600 s; a plugin's ttl_seconds overrides it)."""

    eviction_policy: str | None = None
    """Upstream: fifo, lru, lfu."""

    embedding_model: str | None = None
    """Upstream: the embedding model of the semantic tier."""

    redis: BackendSettings | None = None
    """Upstream: Redis connection."""

    valkey: BackendSettings | None = None
    """Upstream: Valkey connection."""

    milvus: BackendSettings | None = None
    """Upstream: Milvus connection."""

    qdrant: BackendSettings | None = None
    """Upstream: Qdrant connection."""

    polarity_guard: PolarityGuard | None = None
    """Upstream v0.4: an NLI check that a semantic hit does not answer the opposite question
    (refused unless its mode is off)."""


class Memory(Strict):
    """Upstream's agentic memory (recall injected into requests)."""

    enabled: bool = False
    """Upstream: memory on. vllm-sr has none: only false is supported."""

    backend: str | None = None
    """Upstream: milvus, valkey, qdrant."""

    auto_store: bool | None = None
    """Upstream: store every conversation."""

    disabled_routes: list[str] | None = None
    """Upstream: decisions without memory."""

    disabled_models: list[str] | None = None
    """Upstream: models without memory."""

    milvus: BackendSettings | None = None
    """Upstream: Milvus connection."""

    valkey: BackendSettings | None = None
    """Upstream: Valkey connection."""

    qdrant: BackendSettings | None = None
    """Upstream: Qdrant connection."""

    redis_cache: BackendSettings | None = None
    """Upstream: Redis read cache."""

    persistence: MemoryPersistence | None = None
    """Upstream v0.4: the memory writer's bounds."""

    embedding_model: str | None = None
    """Upstream: memory embedding model."""

    extraction_batch_size: int | None = None
    """Upstream: extraction batch size."""

    default_retrieval_limit: int | None = None
    """Upstream: memories recalled per request."""

    default_similarity_threshold: float | None = None
    """Upstream: recall threshold."""

    hybrid_search: bool | None = None
    """Upstream: hybrid search on."""

    hybrid_mode: str | None = None
    """Upstream: hybrid mode."""

    adaptive_threshold: bool | None = None
    """Upstream: adaptive threshold."""

    quality_scoring: BackendSettings | None = None
    """Upstream: memory quality scoring."""

    reflection: BackendSettings | None = None
    """Upstream: memory reflection."""


class VectorStore(Strict):
    """Upstream's vector store (the /v1/vector_stores API and RAG)."""

    enabled: bool = False
    """Upstream: vector store on. vllm-sr has none: only false is supported."""

    backend_type: str | None = None
    """Upstream: memory, milvus, llama_stack, valkey, qdrant."""

    file_storage_dir: str | None = None
    """Upstream: uploaded files' directory."""

    max_file_size_mb: int | None = None
    """Upstream: upload size cap."""

    embedding_model: str | None = None
    """Upstream: document embedding model."""

    embedding_dimension: int | None = None
    """Upstream: vector size."""

    ingestion_workers: int | None = None
    """Upstream: ingestion workers."""

    ingestion_drain_timeout_seconds: int | None = None
    """Upstream: shutdown drain window."""

    supported_formats: list[str] | None = None
    """Upstream: accepted upload formats."""

    metadata_store: str | None = None
    """Upstream: registry store."""

    metadata_postgres: BackendSettings | None = None
    """Upstream: Postgres registry connection."""

    memory: BackendSettings | None = None
    """Upstream: memory backend settings."""

    milvus: BackendSettings | None = None
    """Upstream: Milvus connection."""

    llama_stack: BackendSettings | None = None
    """Upstream: Llama Stack connection."""

    valkey: BackendSettings | None = None
    """Upstream: Valkey connection."""

    qdrant: BackendSettings | None = None
    """Upstream: Qdrant connection."""


class Stores(Strict):
    response_cache: ResponseCache = Field(default_factory=ResponseCache)
    """The store of the decisions' response_cache plugins (vllm_sr/router/plugins)."""

    memory: Memory = Field(default_factory=Memory)
    """Upstream: agentic memory (refused when enabled)."""

    vector_store: VectorStore | None = None
    """Upstream: the vector store (refused when enabled)."""
