"""The ``memory`` decision plugin's model (upstream's agentic memory, ``MemoryPluginConfig``
and ``MemoryReflectionConfig``), typed with upstream's names so upstream files load; it is
accepted only disabled (:func:`vllm_sr.config.routing_plugins.plugin_problems` refuses
``enabled: true``): vllm-sr has no memory store."""

from __future__ import annotations

from pydantic import Field

from vllm_sr.config.routing_base import Strict


class MemoryReflection(Strict):
    """Upstream's recall post-processing (``MemoryReflectionConfig``; metadata here)."""

    enabled: bool | None = None
    """Upstream: reflection on (unset: on)."""

    algorithm: str | None = None
    """Upstream: the reflection algorithm."""

    max_inject_tokens: int | None = None
    """Upstream: most tokens of recalled memories injected."""

    recency_decay_days: int | None = None
    """Upstream: older memories weigh less over this many days."""

    dedup_threshold: float | None = None
    """Upstream: near-duplicate memories above this similarity are merged."""

    block_patterns: list[str] = Field(default_factory=list)
    """Upstream: memories matching these patterns are never injected."""


class MemoryPlugin(Strict):
    """Upstream's per-decision agentic memory (``MemoryPluginConfig``): recalled memories
    injected into the request, conversations stored. vllm-sr has no agentic memory store, so
    only ``enabled: false`` is accepted; it has no effect here, as in upstream when the global
    memory is off (``global.stores.memory.enabled: true`` is refused too)."""

    enabled: bool = False
    """Upstream: memory on for this decision (refused when true)."""

    retrieval_limit: int | None = None
    """Upstream: memories recalled per request."""

    similarity_threshold: float | None = Field(default=None, ge=0, le=1)
    """Upstream: recall's cosine threshold (0 to 1, as upstream checks)."""

    auto_store: bool | None = None
    """Upstream: store this decision's conversations."""

    hybrid_search: bool = False
    """Upstream: hybrid search on."""

    hybrid_mode: str | None = None
    """Upstream: the hybrid search's mode."""

    reflection: MemoryReflection | None = None
    """Upstream: recall post-processing."""
