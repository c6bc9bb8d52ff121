"""The ``response_cache`` decision plugin's model (upstream's ``C/plugin_config.go`` and its
fragments, ``config/fragments/plugin``), with upstream's names and defaults: the lookup tiers,
who shares entries, the semantic tier, the request's cache-control header, the
post-enrichment mode (no effect here) and the revision strings partitioning every key; the
deprecated flat fields read where their nested form is unset. The cache and its stores that
act on it: vllm_sr/router/cache and vllm_sr/router/plugins/response_cache.py."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vllm_sr.config.routing_base import Strict

CACHE_DIRECTIVES = ("no-cache", "no-store", "bypass", "max-age", "ttl")


class CacheSemantic(Strict):
    similarity_threshold: float | None = Field(default=None, ge=0, le=1)
    """A semantic hit needs this cosine or more (unset: 0.8, upstream's default)."""


class CacheRequestControls(Strict):
    enabled: bool = False
    """Honour the request's cache-control header."""

    header: str | None = None
    """The header read (unset: ``x-vsr-cache-control``)."""

    allowed: list[Literal["no-cache", "no-store", "bypass", "max-age", "ttl"]] | None = None
    """Directives honoured (unset or empty: no-cache, no-store, bypass)."""

    max_ttl_seconds: int | None = Field(default=None, ge=0)
    """A ``ttl=N`` directive is clamped to this."""


class CachePersonalized(Strict):
    mode: Literal["disabled", "exact"] | None = None
    """Upstream: caching after RAG/memory enrichment. vllm-sr has no enrichment plugins, so it
    has no effect (metadata)."""


class CacheRevision(Strict):
    """Part of every key: changing one of these starts a fresh cache for the decision."""

    cache_epoch: str | None = None
    model_revision: str | None = None
    prompt_revision: str | None = None
    policy_revision: str | None = None


class ResponseCachePlugin(Strict):
    enabled: bool = False
    """The cache is on for the decision only when true (upstream's default is off)."""

    mode: Literal["semantic", "exact", "exact_then_semantic"] | None = None
    """Lookup tiers (unset: semantic)."""

    scope: Literal["user", "team", "tenant", "global"] | None = None
    """Who shares entries (unset: user). user: ``x-authz-user-id``; team: ``x-authz-team-id``,
    else the first ``x-authz-user-groups`` entry; tenant: ``x-authz-tenant-id``. A request
    without the identity its scope needs is not cached."""

    semantic: CacheSemantic | None = None
    """The semantic tier."""

    ttl_seconds: int | None = Field(default=None, ge=0)
    """Entry lifetime (unset: the store's ``ttl_seconds``)."""

    request_controls: CacheRequestControls | None = None
    """The request header that can skip reads/writes or bound ages."""

    personalized: CachePersonalized | None = None
    """Upstream: post-enrichment caching (no effect here)."""

    revision: CacheRevision | None = None
    """Partition strings (part of every key)."""

    allow_request_controls: bool = False
    """Deprecated flat form of ``request_controls.enabled`` (used when request_controls is
    unset)."""

    control_header: str | None = None
    """Deprecated flat form of ``request_controls.header``."""

    similarity_threshold: float | None = Field(default=None, ge=0, le=1)
    """Deprecated flat form of ``semantic.similarity_threshold``."""

    @property
    def effective_mode(self) -> str:
        return self.mode or "semantic"

    @property
    def effective_scope(self) -> str:
        return self.scope or "user"

    @property
    def threshold(self) -> float:
        if self.semantic is not None and self.semantic.similarity_threshold is not None:
            return self.semantic.similarity_threshold
        if self.similarity_threshold is not None:
            return self.similarity_threshold
        return 0.8

    def controls(self) -> CacheRequestControls:
        if self.request_controls is not None:
            return self.request_controls
        return CacheRequestControls(enabled=self.allow_request_controls, header=self.control_header)
