"""pydantic models of the upstream parts of ``global.model_catalog``: ``embeddings``, the
``system`` model paths, ``external`` LLM models, ``kbs`` and ``modules`` (upstream
``pkg/config/canonical_global.go`` and ``model_config_types.go``).

vllm-sr computes its model-backed signals (embeddings, domains) with its own deployments
(``model_catalog.deployments``), not with the model paths upstream names here, so the paths are
accepted as deployment settings of an upstream host. What would change how a signal matches is
checked by ``upstream_refusals``: the embedding matching options, and prompt compression (which
rewrites the text every signal sees). Modules and knowledge bases that only feed signal
families vllm-sr answers its own way (jailbreak, pii, fact_check, user_feedback, kb) or
refuses (modality ...) are accepted: the family's own docs (or refusal) is what an operator
sees.
"""

from __future__ import annotations

from pydantic import Field

from vllm_sr.config.routing_base import BackendSettings, Strict


class PrototypeScoring(Strict):
    enabled: bool | None = None
    """Upstream: score against clustered prototypes of the examples (upstream default true).
    vllm-sr scores against every example: only false is supported where embeddings are used."""

    cluster_similarity_threshold: float | None = None
    """Upstream: cosine at which examples cluster (0.9)."""

    max_prototypes: int | None = None
    """Upstream: most prototypes kept (8)."""

    best_weight: float | None = None
    """Upstream: weight of the best prototype's cosine (0.75)."""

    top_m: int | None = None
    """Upstream: prototypes averaged beside the best (2)."""

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
    """Upstream: when no rule reaches its threshold, every rule above min_score_threshold
    matches (upstream default true). vllm-sr matches by threshold only: false is supported."""

    top_k: int | None = Field(default=None, ge=0)
    """Upstream: embedding matches kept, best first (1; 0 = all). vllm-sr keeps every match:
    0 is supported."""

    min_score_threshold: float | None = None
    """Upstream: the soft-matching floor (0.5)."""

    prototype_scoring: PrototypeScoring = Field(default_factory=PrototypeScoring)
    """Upstream: prototype scoring of examples."""


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


class PromptCompression(Strict):
    enabled: bool = False
    """Upstream: compress long texts before signals see them. vllm-sr never does: only false
    is supported (or max_tokens 0)."""

    profile: str | None = None
    """Upstream: scoring profile."""

    max_tokens: int = Field(default=0, ge=0)
    """Upstream: compression target (0 = off)."""

    min_length: int | None = None
    """Upstream: shortest text compressed."""

    skip_signals: list[str] | None = None
    """Upstream: signal families that see the uncompressed text."""

    textrank_weight: float | None = None
    """Upstream: scoring weight."""

    position_weight: float | None = None
    """Upstream: scoring weight."""

    tfidf_weight: float | None = None
    """Upstream: scoring weight."""

    novelty_weight: float | None = None
    """Upstream: scoring weight."""

    position_depth: float | None = None
    """Upstream: position depth."""

    preserve_first_n: int | None = None
    """Upstream: sentences always kept at the start."""

    preserve_last_n: int | None = None
    """Upstream: sentences always kept at the end."""


class ClassifierModule(Strict):
    """One upstream classifier model module (prompt_guard, domain, pii, fact_check, detector,
    explainer, feedback_detector): the union of their upstream fields, all optional. They feed
    only signal families or plugins vllm-sr refuses; domains use vllm-sr's deployment."""

    enabled: bool | None = None
    """Upstream: module on."""

    model_ref: str | None = None
    """Upstream: a model_catalog.system role."""

    model_id: str | None = None
    """Upstream: model path."""

    threshold: float | None = None
    """Upstream: threshold."""

    use_cpu: bool | None = None
    """Upstream: run on CPU."""

    use_modernbert: bool | None = None
    """Upstream: ModernBERT variant."""

    use_mmbert_32k: bool | None = None
    """Upstream: mmBERT-32k variant."""

    variant: str | None = None
    """Upstream: prompt_guard variant."""

    protocol: str | None = None
    """Upstream: prompt_guard protocol."""

    on_error: str | None = None
    """Upstream: allow or block on classifier failure."""

    positive_labels: list[str] | None = None
    """Upstream: prompt_guard labels that count."""

    jailbreak_mapping_path: str | None = None
    """Upstream: label mapping file."""

    category_mapping_path: str | None = None
    """Upstream: label mapping file."""

    pii_mapping_path: str | None = None
    """Upstream: label mapping file."""

    feedback_mapping_path: str | None = None
    """Upstream: label mapping file."""

    fallback_category: str | None = None
    """Upstream: domain fallback label."""

    backend: str | None = None
    """Upstream: detector backend."""

    endpoint: str | None = None
    """Upstream: detector endpoint."""

    include_explanation: bool | None = None
    """Upstream: detector explanations."""

    min_span_length: int | None = None
    """Upstream: detector span length."""

    min_span_confidence: float | None = None
    """Upstream: detector span confidence."""

    context_window_size: int | None = None
    """Upstream: detector context window."""

    enable_nli_filtering: bool | None = None
    """Upstream: NLI filtering."""

    nli_entailment_threshold: float | None = None
    """Upstream: NLI threshold."""


class PreferenceModule(Strict):
    use_contrastive: bool | None = None
    """Upstream: contrastive preference scoring."""

    embedding_model: str | None = None
    """Upstream: preference encoder."""

    prototype_scoring: PrototypeScoring | None = None
    """Upstream: prototype scoring."""


class Classifiers(Strict):
    domain: ClassifierModule | None = None
    """Upstream: the domain classifier (vllm-sr's domains use its own deployment)."""

    mcp: BackendSettings | None = None
    """Upstream: an MCP classifier."""

    pii: ClassifierModule | None = None
    """Upstream: the PII classifier (vllm-sr: presidio's pattern recognizers instead)."""

    preference: PreferenceModule | None = None
    """Upstream: the preference module (vllm-sr reads its prototype_scoring)."""


class HallucinationMitigation(Strict):
    enabled: bool | None = None
    """Upstream: hallucination models loaded (the hallucination plugin, refused)."""

    on_hallucination_detected: str | None = None
    """Upstream: what the plugin does."""

    fact_check: ClassifierModule | None = None
    """Upstream: fact-check classifier."""

    detector: ClassifierModule | None = None
    """Upstream: hallucination detector."""

    explainer: ClassifierModule | None = None
    """Upstream: NLI explainer."""


class ComplexityModule(Strict):
    prototype_scoring: PrototypeScoring | None = None
    """Upstream: prototype scoring of complexity signals (vllm-sr reads it too)."""


class ModalityDetector(Strict):
    enabled: bool | None = None
    """Upstream: modality detection (modality signals, refused)."""

    prompt_prefixes: list[str] | None = None
    """Upstream: image-generation prefixes."""

    method: str | None = None
    """Upstream: keyword, classifier, hybrid."""

    classifier: BackendSettings | None = None
    """Upstream: the modality classifier."""

    keywords: list[str] | None = None
    """Upstream: image keywords."""

    both_keywords: list[str] | None = None
    """Upstream: text-and-image keywords."""

    confidence_threshold: float | None = None
    """Upstream: threshold."""

    lower_threshold_ratio: float | None = None
    """Upstream: lower threshold ratio."""


class Modules(Strict):
    prompt_compression: PromptCompression = Field(default_factory=PromptCompression)
    """Upstream: prompt compression (refused when on)."""

    prompt_guard: ClassifierModule | None = None
    """Upstream: the jailbreak classifier (vllm-sr: a deployment's head or built-in
    prototypes)."""

    classifier: Classifiers | None = None
    """Upstream: domain, mcp, pii and preference classifiers."""

    complexity: ComplexityModule | None = None
    """Upstream: complexity signal settings."""

    hallucination_mitigation: HallucinationMitigation | None = None
    """Upstream: hallucination models."""

    feedback_detector: ClassifierModule | None = None
    """Upstream: the user-feedback classifier (vllm-sr: a deployment's head or built-in
    prototypes)."""

    modality_detector: ModalityDetector | None = None
    """Upstream: modality detection."""
