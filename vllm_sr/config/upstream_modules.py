"""pydantic models of upstream's ``global.model_catalog.modules``: prompt compression, the
classifier modules (prompt guard, domain, mcp, pii, preference, feedback), complexity,
hallucination mitigation and modality detection (upstream ``model_config_types.go``).

vllm-sr answers the families these modules feed with its own deployments, so their paths are
accepted as deployment settings of an upstream host; prompt compression (which rewrites the
text every signal sees) is refused by ``upstream_refusals`` when on.
"""

from __future__ import annotations

from pydantic import Field

from vllm_sr.config.routing_base import BackendSettings, Strict
from vllm_sr.config.upstream_catalog import PrototypeScoring


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


class SequenceWindow(Strict):
    size: int | None = None
    """Upstream: tokens per window of a long input."""

    overlap: int | None = None
    """Upstream: tokens shared by two windows."""


class SequenceHead(Strict):
    """Upstream v0.4: one built-in sequence head (safety, hazard)."""

    model_id: str | None = None
    """Upstream: model path."""

    model_ref: str | None = None
    """Upstream: a model_catalog.system role."""

    use_cpu: bool | None = None
    """Upstream: run on CPU."""

    max_sequence_length: int | None = None
    """Upstream: input budget (vllm-sr: the deployment's input.max_tokens)."""

    window: SequenceWindow | None = None
    """Upstream: long inputs in windows (vllm-sr: the deployment's input.overflow)."""


class SafetyModules(Strict):
    """Upstream v0.4: the built-in Safety and Hazard artifacts. vllm-sr's safety heads are
    deployments (routing.signals.safety[].deployment, system.safety / system.hazard)."""

    safety: SequenceHead | None = None
    """Upstream: the binary Safety head."""

    hazard: SequenceHead | None = None
    """Upstream: the multi-label Hazard head."""


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

    max_sequence_length: int | None = None
    """Upstream v0.4: input budget (vllm-sr: the deployment's input.max_tokens)."""

    window: SequenceWindow | None = None
    """Upstream v0.4: long inputs in windows (vllm-sr: the deployment's input.overflow)."""

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


class ComplexityBackend(Strict):
    protocol: str | None = None
    """Upstream v0.4: the remote complexity classifier's protocol."""

    contract: str | None = None
    """Upstream: its result contract."""

    model: str | None = None
    """Upstream: its model."""

    deadline_ms: int | None = None
    """Upstream: its deadline."""


class ComplexityModule(Strict):
    prototype_scoring: PrototypeScoring | None = None
    """Upstream: prototype scoring of complexity signals (vllm-sr reads it too)."""

    backend: ComplexityBackend | None = None
    """Upstream v0.4: a remote complexity classifier (refused when set: vllm-sr's complexity
    is its prototype margins on the decision deployment)."""


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
    safety: SafetyModules | None = None
    """Upstream v0.4: the built-in Safety/Hazard artifacts (metadata here)."""

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
