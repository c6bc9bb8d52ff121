"""pydantic models of the upstream parts of ``global.model_catalog``: ``embeddings``, the
``system`` model paths, ``external`` LLM models and ``kbs`` (upstream
``pkg/config/canonical_global.go`` and ``model_config_types.go``); ``modules`` is typed in
``upstream_modules``.

vllm-sr computes its model-backed signals (embeddings, domains) with its own deployments
(``model_catalog.deployments``), not with the model paths upstream names here, so the paths are
accepted as deployment settings of an upstream host. ``embedding_config``'s matching options
(soft matching, ``top_k``, ``prototype_scoring``) are acted on (``vllm_sr/router/
embedding_matching.py``); prompt compression (which rewrites the text every signal sees) is
refused by ``upstream_refusals``. Modules and knowledge bases that only feed signal
families vllm-sr answers its own way (jailbreak, pii, fact_check, user_feedback, kb) or
refuses (modality ...) are accepted: the family's own docs (or refusal) is what an operator
sees.
"""

from __future__ import annotations

from pydantic import Field

from vllm_sr.config.routing_base import Strict


class PrototypeScoring(Strict):
    enabled: bool | None = None
    """Score against clustered prototypes of the examples (default true): examples at cosine >=
    ``cluster_similarity_threshold`` keep one medoid, at most ``max_prototypes``. false: every
    (deduplicated) example is a prototype."""

    cluster_similarity_threshold: float | None = None
    """Cosine at which examples cluster (0.9)."""

    max_prototypes: int | None = None
    """Most prototypes kept (8)."""

    best_weight: float | None = None
    """Weight of the best prototype's cosine in the score (0.75; the rest weighs the mean of
    the top ``top_m``)."""

    top_m: int | None = None
    """Prototypes averaged into the support score (2)."""

    margin_threshold: float | None = None
    """Upstream: margin threshold."""


class EmbeddingConfig(Strict):
    backend: str | None = None
    """Upstream: embedding runtime (candle...)."""

    model_type: str | None = None
    """Upstream: mmbert, qwen3, gemma, multimodal. vllm-sr embeds with its decision model's
    deployment (or a signal's ``deployment``)."""

    preload_embeddings: bool | None = None
    """Upstream: embed candidates at startup (vllm-sr always does, once per generation)."""

    target_dimension: int | None = None
    """Upstream: Matryoshka truncation."""

    target_layer: int | None = None
    """Upstream: 2D-Matryoshka layer."""

    enable_soft_matching: bool | None = None
    """When no embedding signal reaches its threshold, every one whose score reaches
    ``min_score_threshold`` matches (default true, as upstream)."""

    top_k: int | None = Field(default=None, ge=0)
    """Matched embedding signals kept, best confidence first (default 1; 0 keeps all)."""

    min_score_threshold: float | None = None
    """The soft-matching floor (0 or omitted: 0.5)."""

    full_context: bool | None = None
    """Upstream v0.4: embed the whole conversation (metadata: vllm-sr embeds the request's
    text, sampled past 2048 characters)."""

    prototype_scoring: PrototypeScoring = Field(default_factory=PrototypeScoring)
    """How embedding signals' candidates become prototypes and are scored."""


class EmbeddingEndpoint(Strict):
    base_url: str | None = None
    """Upstream: a remote OpenAI-compatible embedding service."""

    model: str | None = None
    """Upstream: its model."""

    api_key_env: str | None = None
    """Upstream: its key's environment variable."""

    timeout_seconds: int | None = None
    """Upstream: call timeout."""

    max_retries: int | None = None
    """Upstream: retries."""

    dimensions: int | None = None
    """Upstream: vector size."""

    max_response_bytes: int | None = None
    """Upstream v0.4: largest answer read from the endpoint."""


class SemanticEmbeddings(Strict):
    qwen3_model_path: str | None = None
    """Upstream: model path on the upstream host."""

    gemma_model_path: str | None = None
    """Upstream: model path on the upstream host."""

    mmbert_model_path: str | None = None
    """Upstream: model path on the upstream host."""

    multimodal_model_path: str | None = None
    """Upstream: model path on the upstream host."""

    bert_model_path: str | None = None
    """Upstream: model path on the upstream host."""

    use_cpu: bool | None = None
    """Upstream: run embeddings on CPU."""

    embedding_config: EmbeddingConfig = Field(default_factory=EmbeddingConfig)
    """Upstream: embedding model choice and matching options."""

    endpoint: EmbeddingEndpoint | None = None
    """Upstream: a remote embedding service."""


class Embeddings(Strict):
    semantic: SemanticEmbeddings = Field(default_factory=SemanticEmbeddings)
    """Upstream: the semantic embedding models."""


class ExternalEndpoint(Strict):
    address: str | None = None
    """Upstream: host."""

    port: int | None = None
    """Upstream: port."""

    protocol: str | None = None
    """Upstream: http or https."""

    name: str | None = None
    """Upstream: endpoint name."""

    use_chat_template: bool | None = None
    """Upstream: wrap the prompt in the chat template."""

    prompt_template: str | None = None
    """Upstream: prompt template."""


class ExternalReasoning(Strict):
    family: str
    """Upstream: its reasoning family."""

    use_reasoning: bool
    """Upstream: reasoning on."""

    reasoning_effort: str | None = None
    """Upstream: the effort."""


class ExternalModel(Strict):
    """An LLM upstream calls for llm classifiers and remote guards (signal families vllm-sr
    refuses)."""

    name: str | None = None
    """Upstream: the model's name."""

    llm_provider: str | None = None
    """Upstream: provider."""

    model_role: str | None = None
    """Upstream: guardrail, classification..."""

    llm_endpoint: ExternalEndpoint | None = None
    """Upstream: where it is served."""

    llm_model_name: str | None = None
    """Upstream: its served name."""

    llm_timeout_seconds: int | None = None
    """Upstream: call timeout."""

    parser_type: str | None = None
    """Upstream: answer parser."""

    threshold: float | None = None
    """Upstream: decision threshold."""

    access_key: str | None = None
    """Upstream: credential."""

    max_tokens: int | None = None
    """Upstream: answer cap."""

    temperature: float | None = None
    """Upstream: sampling temperature."""

    max_request_bytes: int | None = None
    """Upstream v0.4: largest request sent."""

    max_response_bytes: int | None = None
    """Upstream v0.4: largest answer read."""

    reasoning: ExternalReasoning | None = None
    """Upstream v0.4: the external model's reasoning switch."""


class KnowledgeBaseSource(Strict):
    path: str
    """Upstream: the knowledge base's directory."""

    manifest: str | None = None
    """Upstream: its label manifest."""


class KnowledgeBaseMetric(Strict):
    name: str
    """Upstream: the metric's name."""

    type: str
    """Upstream: group_margin..."""

    positive_group: str | None = None
    """Upstream: positive group."""

    negative_group: str | None = None
    """Upstream: negative group."""


class KnowledgeBase(Strict):
    """A labelled example corpus for the kb signal (vllm-sr reads its manifest)."""

    name: str
    """Upstream: the knowledge base's name."""

    source: KnowledgeBaseSource
    """Upstream: where its examples live."""

    threshold: float | None = None
    """Upstream: label threshold."""

    label_thresholds: dict[str, float] | None = None
    """Upstream: per-label thresholds."""

    groups: dict[str, list[str]] | None = None
    """Upstream: label groups."""

    metrics: list[KnowledgeBaseMetric] | None = None
    """Upstream: group metrics."""

    prototype_scoring: PrototypeScoring | None = None
    """Upstream: prototype scoring."""
