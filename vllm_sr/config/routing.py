"""pydantic models of Router mode's config: the top-level ``providers:`` and ``routing:``
sections, and ``global.router.auto_model_names``.

Field names and meanings follow the upstream vLLM Semantic Router (keyword methods regex /
bm25 / ngram with ``bm25_threshold`` 0.1, ``ngram_threshold`` 0.4 and ``ngram_arity`` 3 as
defaults; embedding ``aggregation_method`` max / mean / any; decisions with AND / OR / NOT
rule trees and ``modelRefs``).

Cross-field rules (a decision naming an unknown signal or model, a signal on a deployment that
does not exist, duplicate names, a regex that does not compile) live in
``routing_rules.check_routing`` (re-exported here), which works on raw mappings like
``schema.semantic_problems`` so a file gets every problem in one run, each at its YAML path.
The models run the rules that need nothing outside their own section and raise them as
``SEMANTIC_ERROR`` (reported once, by path, through ``routing_problems``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from vllm_sr.config.routing_providers import (
    BackendRef,
    ModelPricing,
    ProviderDefaults,
    ProviderModel,
    ProviderReliability,
    Providers,
    ReasoningFamily,
)
from vllm_sr.config.routing_rules import (
    check_routing,
    routing_local_problems,
    routing_problems,
)

if TYPE_CHECKING:
    from vllm_sr.config.problems import Problem

__all__ = [
    "BackendRef",
    "ModelPricing",
    "ProviderDefaults",
    "ProviderModel",
    "ProviderReliability",
    "Providers",
    "ReasoningFamily",
    "check_routing",
    "routing_problems",
]

DEFAULT_AUTO_MODEL_NAMES = ("vllm-sr/auto", "auto")
DEFAULT_BM25_THRESHOLD = 0.1
DEFAULT_NGRAM_THRESHOLD = 0.4
DEFAULT_NGRAM_ARITY = 3


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, populate_by_name=True)


def _raise_first(problems: list[Problem]) -> None:
    from vllm_sr.config.problems import SEMANTIC_ERROR

    if problems:
        raise PydanticCustomError(SEMANTIC_ERROR, "; ".join(p.render_plain() for p in problems))


# -- signals --------------------------------------------------------------------------------


class KeywordSignal(_Strict):
    name: str = Field(min_length=1, max_length=128)
    """The signal's name; rules name it as {type: keyword, name: NAME}."""

    operator: Literal["AND", "OR", "NOR"] = "OR"
    """OR: any keyword matches; AND: every keyword matches; NOR: none matches."""

    method: Literal["regex", "bm25", "ngram"] = "regex"
    """regex: each keyword is a regular expression matched on whole words; bm25: each keyword
    is scored as a document against the request (bm25_threshold); ngram: character n-gram
    similarity per keyword, tolerant of typos (ngram_threshold, ngram_arity)."""

    keywords: list[str] = Field(min_length=1, max_length=1024)
    """The keywords (regular expressions with method regex)."""

    case_sensitive: bool = False
    """Match case exactly (default: case-insensitive)."""

    bm25_threshold: float = Field(default=DEFAULT_BM25_THRESHOLD, ge=0.0, le=1000.0)
    """method bm25: the least BM25 score at which a keyword counts as present (default 0.1)."""

    ngram_threshold: float = Field(default=DEFAULT_NGRAM_THRESHOLD, gt=0.0, le=1.0)
    """method ngram: the least n-gram similarity (0-1] at which a keyword counts as present
    (default 0.4)."""

    ngram_arity: int = Field(default=DEFAULT_NGRAM_ARITY, ge=1, le=8)
    """method ngram: the n of the character n-grams (default 3)."""

    description: str | None = Field(default=None, max_length=2000)
    """Free text for people."""


class EmbeddingSignal(_Strict):
    name: str = Field(min_length=1, max_length=128)
    """The signal's name; rules name it as {type: embedding, name: NAME}."""

    threshold: float = Field(ge=-1.0, le=1.0)
    """The least cosine similarity (after aggregation) at which the signal matches."""

    aggregation_method: Literal["max", "mean", "any"] = "max"
    """max: the best candidate's similarity; mean: the mean over candidates; any: matches when
    some candidate reaches the threshold (confidence: the first such candidate's similarity)."""

    candidates: list[str] = Field(min_length=1, max_length=1024)
    """Example phrases; embedded once per config generation and cached by the router."""

    deployment: str | None = Field(default=None, max_length=63)
    """The deployment that embeds the request (default: the decision model's deployment)."""

    description: str | None = Field(default=None, max_length=2000)
    """Free text for people."""


class DomainSignal(_Strict):
    name: str = Field(min_length=1, max_length=128)
    """The domain (the classification label); rules name it as {type: domain, name: NAME}."""

    description: str | None = Field(default=None, max_length=2000)
    """What the domain covers; also used as one of the label's example texts."""

    examples: list[str] = Field(default_factory=list, max_length=1024)
    """More example texts of the domain (the label's examples: description + examples)."""

    threshold: float = Field(default=0.0, ge=0.0, le=1.0)
    """The least probability of the top label for the domain to match (default 0: the top
    label is enough)."""

    deployment: str | None = Field(default=None, max_length=63)
    """The deployment that classifies the request (default: the decision model's deployment).
    All domains on one deployment form one label set."""

    def label_examples(self) -> list[str]:
        return ([self.description] if self.description else []) + list(self.examples)


class Signals(_Strict):
    keywords: list[KeywordSignal] = Field(default_factory=list, max_length=1024)
    """Keyword signals (no model needed)."""

    embeddings: list[EmbeddingSignal] = Field(default_factory=list, max_length=1024)
    """Embedding similarity signals (answered by a deployment)."""

    domains: list[DomainSignal] = Field(default_factory=list, max_length=256)
    """Domain classification signals (answered by a deployment)."""


# -- decisions ------------------------------------------------------------------------------


class RuleLeaf(_Strict):
    type: Literal["keyword", "embedding", "domain"]
    """The signal's type."""

    name: str = Field(min_length=1, max_length=128)
    """The signal's name."""


class RuleNode(_Strict):
    operator: Literal["AND", "OR", "NOT"]
    """AND: every condition (confidence: their mean); OR: any (confidence: the best);
    NOT: exactly one condition, negated."""

    conditions: list[RuleLeaf | RuleNode] = Field(min_length=1, max_length=256)
    """Signals ({type, name}) or nested rules ({operator, conditions})."""


class ModelRef(_Strict):
    model: str = Field(min_length=1, max_length=128)
    """A providers.models name."""


class Decision(_Strict):
    name: str = Field(min_length=1, max_length=128)
    """The decision's name (answer header x-vsr-selected-decision)."""

    description: str | None = Field(default=None, max_length=2000)
    """Free text for people."""

    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000)
    """Strategy priority: higher wins among matching decisions."""

    rules: RuleNode
    """When the decision matches."""

    model_refs: list[ModelRef] = Field(alias="modelRefs", min_length=1, max_length=64)
    """The models to use, in order; the first with a healthy backend is chosen."""


class Routing(_Strict):
    strategy: Literal["priority", "confidence"] = "priority"
    """priority: matching decisions by priority, then confidence, then name; confidence:
    by confidence, then priority, then name."""

    signals: Signals = Field(default_factory=Signals)
    """The signals decisions can use."""

    decisions: list[Decision] = Field(default_factory=list, max_length=1024)
    """The decisions, each a rule tree over signals and the models to use."""

    @model_validator(mode="after")
    def _rules(self) -> Routing:
        _raise_first(routing_local_problems(self.model_dump(by_alias=True, exclude_none=True)))
        return self


class AutoModelNames(_Strict):
    """The field the lead adds to ``global.router`` (schema.Router)."""

    auto_model_names: list[str] = Field(
        default_factory=lambda: list(DEFAULT_AUTO_MODEL_NAMES), min_length=1, max_length=16
    )
    """Chat ``model`` names that mean "route this request" (default: vllm-sr/auto, auto)."""


RuleNode.model_rebuild()
