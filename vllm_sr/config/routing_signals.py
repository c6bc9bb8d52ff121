"""pydantic models of ``routing.signals``: every signal family
upstream has (``C/canonical_config.go`` ``CanonicalSignals``), with upstream's field names and
defaults, so an upstream file parses unchanged.

vllm-sr evaluates keywords, embeddings, domains, the deterministic families (context,
structure, conversation, language, metadata, role_bindings; their models live in
``signal_families`` and ``signal_metadata``), pii (presidio's pattern recognizers) and the
embedding-only families (fact_check, user_feedbacks, reasks, preferences, complexity,
jailbreak, kb; see ``vllm_sr/router/signals_embedded.py``). Those, and modality and events
(typed so that a typo is still an unknown-key error; ``routing_support`` refuses each one used
by name), live in ``signal_embedded``, classifiers in ``signal_classifiers``; this module
keeps the families vllm-sr matches itself (keywords, embeddings, domains) and the
``Signals`` section that holds them all."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from vllm_sr.config.routing_base import Description, Strict
from vllm_sr.config.signal_classifiers import ClassifierSignal
from vllm_sr.config.signal_embedded import (
    ComplexitySignal,
    EventSignal,
    HallucinationSignal,
    JailbreakSignal,
    KBSignal,
    NamedSignal,
    PIISignal,
    PreferenceSignal,
    ReaskSignal,
)
from vllm_sr.config.signal_families import (
    ContextSignal,
    ConversationSignal,
    InputModalitySignal,
    LanguageSignal,
    StructureSignal,
)
from vllm_sr.config.signal_metadata import MetadataSignal, RoleBinding
from vllm_sr.config.signal_safety import SafetySignal
from vllm_sr.config.upstream_catalog import PrototypeScoring

DEFAULT_BM25_THRESHOLD = 0.1
DEFAULT_NGRAM_THRESHOLD = 0.4
DEFAULT_NGRAM_ARITY = 3
DEFAULT_FUZZY_THRESHOLD = 2
MMLU_CATEGORIES = (
    "biology",
    "business",
    "chemistry",
    "computer science",
    "economics",
    "engineering",
    "health",
    "history",
    "law",
    "math",
    "other",
    "philosophy",
    "physics",
    "psychology",
)

# -- the families vllm-sr evaluates ---------------------------------------------------------


class KeywordSignal(Strict):
    name: str = Field(min_length=1, max_length=128)
    """The signal's name; rules name it as {type: keyword, name: NAME}."""

    operator: Literal["AND", "OR", "NOR"] = "OR"
    """OR: any keyword matches; AND: every keyword matches; NOR: none matches."""

    method: Literal["regex", "bm25", "ngram"] | None = None
    """Omitted: each keyword is a literal, matched on word boundaries (ASCII words; Han text
    anywhere); regex: each keyword is a regular expression; bm25: each keyword is scored as a
    document against the request (bm25_threshold); ngram: character n-gram similarity per
    keyword, tolerant of typos (ngram_threshold, ngram_arity)."""

    keywords: list[str] = Field(min_length=1, max_length=1024)
    """The keywords (regular expressions with method regex)."""

    case_sensitive: bool = False
    """Match case exactly (default: case-insensitive)."""

    fuzzy_match: bool = False
    """Literal and regex methods: a keyword also matches a word of the request within
    fuzzy_threshold edits (Levenshtein, lowercased)."""

    fuzzy_threshold: int = Field(default=DEFAULT_FUZZY_THRESHOLD, ge=0, le=1000)
    """The most edits for a fuzzy match (default 2)."""

    bm25_threshold: float = Field(default=DEFAULT_BM25_THRESHOLD, gt=0.0, le=1000.0)
    """method bm25: the least BM25 score at which a keyword counts as present (0 or omitted:
    0.1)."""

    ngram_threshold: float = Field(default=DEFAULT_NGRAM_THRESHOLD, gt=0.0, le=1.0)
    """method ngram: the least n-gram similarity (0-1] at which a keyword counts as present
    (0 or omitted: 0.4)."""

    ngram_arity: int = Field(default=DEFAULT_NGRAM_ARITY, ge=2, le=8)
    """method ngram: the n of the character n-grams (0 or omitted: 3; at least 2)."""

    description: str | None = Description
    """Free text for people."""

    @field_validator("bm25_threshold", "ngram_threshold", "ngram_arity", mode="before")
    @classmethod
    def _zero_is_default(cls, value: object, info: ValidationInfo[object]) -> object:
        """Upstream reads 0 (or omitted) as the default."""
        defaults = {
            "bm25_threshold": DEFAULT_BM25_THRESHOLD,
            "ngram_threshold": DEFAULT_NGRAM_THRESHOLD,
            "ngram_arity": DEFAULT_NGRAM_ARITY,
        }
        return defaults[str(info.field_name)] if value == 0 and value is not False else value


class EmbeddingSignal(Strict):
    name: str = Field(min_length=1, max_length=128)
    """The signal's name; rules name it as {type: embedding, name: NAME}."""

    threshold: float = Field(ge=-1.0, le=1.0)
    """The least cosine similarity (after aggregation) at which the signal matches."""

    aggregation_method: Literal["max", "mean", "any"] = "max"
    """max: the best candidate's similarity; mean: the mean over candidates; any: matches when
    some candidate reaches the threshold (confidence: the first such candidate's similarity)."""

    candidates: list[str] = Field(min_length=1, max_length=1024)
    """Example phrases; embedded once per config generation and cached by the router."""

    query_modality: Literal["text", "image"] | None = None
    """What is embedded: the request's text (the default; image is refused by vllm-sr)."""

    deployment: str | None = Field(default=None, max_length=63)
    """vllm-sr: the deployment that embeds the request (default: the decision model's)."""

    description: str | None = Description
    """Free text for people."""

    image_candidates: list[str] = Field(default_factory=list, max_length=1024)
    """v0.4: example images (refused by vllm-sr: no image encoder)."""

    negative_candidates: list[str] = Field(default_factory=list, max_length=1024)
    """v0.4: examples the request must not resemble (refused by vllm-sr for now)."""

    negative_image_candidates: list[str] = Field(default_factory=list, max_length=1024)
    """v0.4: negative example images (refused by vllm-sr: no image encoder)."""

    prototype_scoring: PrototypeScoring | None = None
    """v0.4: this rule's prototype scoring; only ``enabled: false`` (every candidate scored
    by ``aggregation_method``, as vllm-sr does) is accepted."""

    @field_validator("query_modality", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value


class ModelScore(Strict):
    model: str = Field(min_length=1, max_length=128)
    """A modelRef model of the decision named like this domain."""

    score: float
    """The static algorithm picks the highest-scoring modelRef (all 1.0: the first)."""

    use_reasoning: bool | None = None
    """Upstream metadata; reasoning is the modelRef's use_reasoning."""


class DomainSignal(Strict):
    name: str = Field(min_length=1, max_length=128)
    """The domain (the classification label); rules name it as {type: domain, name: NAME}."""

    description: str | None = Description
    """What the domain covers; also used as one of the label's example texts."""

    mmlu_categories: list[str] = Field(default_factory=list, max_length=14)
    """Upstream: the MMLU-Pro labels of its fixed classifier that mean this domain. vllm-sr
    classifies on its own deployment and uses these names as more example texts."""

    model_scores: list[ModelScore] = Field(default_factory=list, max_length=64)
    """For the decision named like this domain: how the static algorithm ranks its modelRefs."""

    examples: list[str] = Field(default_factory=list, max_length=1024)
    """vllm-sr: more example texts of the domain (the label's examples: description +
    mmlu_categories + examples)."""

    threshold: float = Field(default=0.0, ge=0.0, le=1.0)
    """vllm-sr: the least probability of the top label for the domain to match (default 0:
    the top label is enough)."""

    deployment: str | None = Field(default=None, max_length=63)
    """vllm-sr: the deployment that classifies the request (default: the decision model's).
    All domains on one deployment form one label set."""

    method: Literal["centroids", "classifier"] = "centroids"
    """vllm-sr: ``centroids`` (default): the deployment embeds the request and the domains'
    examples (labels = the domains); ``classifier`` (needs ``deployment``): the deployment's
    artifact is a sequence classifier (labels from its config.json id2label, e.g. upstream's
    14 MMLU-Pro names) and its label probabilities answer every domain on that deployment
    with upstream's rule (label -> the domain listing it in mmlu_categories or named like it;
    entropy decides top-1 or every label at the threshold)."""

    @field_validator("mmlu_categories")
    @classmethod
    def _mmlu(cls, value: list[str]) -> list[str]:
        for cat in value:
            if cat not in MMLU_CATEGORIES:
                raise ValueError(
                    f"mmlu category {cat!r} is not one of upstream's; accepted: "
                    + ", ".join(MMLU_CATEGORIES)
                )
        return value

    @model_validator(mode="after")
    def _classifier_needs_deployment(self) -> DomainSignal:
        if self.method == "classifier" and not self.deployment:
            raise ValueError(
                f"domain {self.name!r}: method 'classifier' needs deployment: the deployment "
                "whose sequence-classification artifact answers it (or method 'centroids')"
            )
        return self

    def label_examples(self) -> list[str]:
        own = [self.description] if self.description else []
        return own + [c for c in self.mmlu_categories if c != self.name] + list(self.examples)


class Signals(Strict):
    keywords: list[KeywordSignal] = Field(default_factory=list, max_length=1024)
    """Keyword signals (no model needed)."""

    embeddings: list[EmbeddingSignal] = Field(default_factory=list, max_length=1024)
    """Embedding similarity signals (answered by a deployment)."""

    domains: list[DomainSignal] = Field(default_factory=list, max_length=256)
    """Domain classification signals (answered by a deployment)."""

    @field_validator("domains")
    @classmethod
    def _one_method_per_deployment(cls, value: list[DomainSignal]) -> list[DomainSignal]:
        # All domains on one deployment are one label set: one way to classify them.
        methods: dict[str | None, DomainSignal] = {}
        for dom in value:
            first = methods.setdefault(dom.deployment, dom)
            if first.method != dom.method:
                raise ValueError(
                    f"domain {dom.name!r} has method {dom.method!r} on deployment "
                    f"{dom.deployment!r} where domain {first.name!r} has {first.method!r}: the "
                    "domains on one deployment form one label set, give them one method"
                )
        return value

    context: list[ContextSignal] = Field(default_factory=list, max_length=1024)
    """Token-count bands."""

    structure: list[StructureSignal] = Field(default_factory=list, max_length=1024)
    """Counts and densities of patterns in the request text."""

    conversation: list[ConversationSignal] = Field(default_factory=list, max_length=1024)
    """The conversation's shape: turns, tools, images."""

    language: list[LanguageSignal] = Field(default_factory=list, max_length=256)
    """The request's language."""

    metadata: list[MetadataSignal] = Field(default_factory=list, max_length=1024)
    """The request's ``metadata`` object."""

    role_bindings: list[RoleBinding] = Field(default_factory=list, max_length=1024)
    """Roles from the identity headers (leaves: {type: authz, name: ROLE})."""

    fact_check: list[NamedSignal] = Field(default_factory=list, max_length=16)
    """needs_fact_check / no_fact_check_needed (built-in prototypes)."""

    user_feedbacks: list[NamedSignal] = Field(default_factory=list, max_length=16)
    """satisfied / need_clarification / wrong_answer / want_different (built-in
    prototypes)."""

    reasks: list[ReaskSignal] = Field(default_factory=list, max_length=256)
    """The current user turn repeating prior ones (cosine)."""

    preferences: list[PreferenceSignal] = Field(default_factory=list, max_length=256)
    """Contrastive preferences (prototype scores; the best one matches)."""

    complexity: list[ComplexitySignal] = Field(default_factory=list, max_length=256)
    """Hard/easy prototype margins; leaves name RULE:hard|medium|easy."""

    modality: list[NamedSignal] = Field(default_factory=list, max_length=16)
    """Upstream (refused by vllm-sr): AR / DIFFUSION / BOTH."""

    jailbreak: list[JailbreakSignal] = Field(default_factory=list, max_length=256)
    """Prompt-injection detection (contrastive, or built-in prototypes)."""

    pii: list[PIISignal] = Field(default_factory=list, max_length=256)
    """PII detection (presidio's pattern recognizers)."""

    safety: list[SafetySignal] = Field(default_factory=list, max_length=256)
    """v0.4: unsafe content (and hazard categories) on a deployment's classification head."""

    kb: list[KBSignal] = Field(default_factory=list, max_length=1024)
    """Knowledge-base labels and groups (global.model_catalog.kbs)."""

    events: list[EventSignal] = Field(default_factory=list, max_length=1024)
    """Upstream (refused by vllm-sr): event words."""

    classifiers: list[ClassifierSignal] = Field(default_factory=list, max_length=256)
    """Label classifiers: a deployment's head, else built-in label sets (type llm refused;
    vllm_sr/config/signal_classifiers.py)."""

    decision: list[dict[str, object]] = Field(default_factory=list, max_length=256)
    """Upstream's decision-model questions (refused: they need a generative decision
    model)."""

    hallucination: list[HallucinationSignal] = Field(default_factory=list, max_length=256)
    """v0.4 (refused by vllm-sr): a response-stage check consumed by the hallucination
    plugin."""

    input_modality: list[InputModalitySignal] = Field(default_factory=list, max_length=256)
    """v0.4: the modalities of the user messages' content parts (no model)."""
