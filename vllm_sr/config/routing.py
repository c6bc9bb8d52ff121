"""pydantic models of Router mode's config: ``routing:`` (modelCards, signals, projections,
decisions, strategy) and ``global.router.auto_model_names``; ``providers:`` lives in
``routing_providers``, the signal families in ``routing_signals``, the rule tree in
``routing_tree`` (import each from its own module: this one holds only what it defines).

Field names and meanings follow the upstream vLLM Semantic Router v0.3 (``C/decision_config.go``,
``C/canonical_config.go``), so an upstream file parses unchanged. What vllm-sr does not act on
is refused by name by ``routing_support`` ("not supported by vllm-sr", with what is supported).

Cross-field rules (a decision naming an unknown signal or model, a signal on a deployment that
does not exist, duplicate names, a regex that does not compile) live in
``routing_rules.check_routing``, which works on raw mappings like
``schema.semantic_problems`` so a file gets every problem in one run, each at its YAML path.
The models run the rules that need nothing outside their own section and raise them as
``SEMANTIC_ERROR`` (reported once, by path, through ``routing_problems``).
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from vllm_sr.config.fallback_policy import FallbackPolicy
from vllm_sr.config.learning_rules import CandidateSetField
from vllm_sr.config.routing_base import Strict, raise_first, rules_run_by_caller
from vllm_sr.config.routing_catalog import (
    CandidateRequirements,
    DataPolicy,
    Distribution,
    Modalities,
    ModelBinding,
    Presentation,
)
from vllm_sr.config.routing_projections import Projections
from vllm_sr.config.routing_rules import routing_local_problems
from vllm_sr.config.routing_signals import (
    Signals,
)
from vllm_sr.config.routing_tree import RuleLeaf, RuleNode
from vllm_sr.jsontypes import JsonObject

DEFAULT_AUTO_MODEL_NAMES = ("vllm-sr/auto", "auto")


# -- modelCards -----------------------------------------------------------------------------


class LoRAAdapter(Strict):
    name: str = Field(min_length=1, max_length=128)
    """The adapter's name: a modelRef's lora_name (sent to the backend as ``model``)."""

    description: str | None = Field(default=None, max_length=4000)
    """Free text for people."""


class ModelCard(Strict):
    name: str = Field(min_length=1, max_length=128)
    """The model's name (unique; a providers.models name gives its backends)."""

    param_size: str | None = Field(default=None, max_length=32)
    """Metadata, e.g. 8B."""

    context_window_size: int | None = Field(default=None, ge=0)
    """Metadata: the context window in tokens."""

    description: str | None = Field(default=None, max_length=4000)
    """Free text for people."""

    capabilities: list[str] = Field(default_factory=list, max_length=64)
    """Metadata tags of what the model can do."""

    loras: list[LoRAAdapter] = Field(default_factory=list, max_length=256)
    """LoRA adapters served by the model's backends (modelRefs[].lora_name)."""

    quality_score: float | None = None
    """The model's quality (multi_factor's quality factor, higher is better)."""

    modality: str | None = Field(default=None, max_length=32)
    """Metadata, e.g. ar, diffusion, omni."""

    tags: list[str] = Field(default_factory=list, max_length=64)
    """Metadata tags."""

    # v0.4's card fields (vllm_sr/config/routing_catalog.py): metadata, except
    # max_output_tokens and modalities.input (candidate filtering)
    display_name: str | None = Field(default=None, max_length=256)
    """v0.4 metadata: the name shown."""

    publisher: str | None = Field(default=None, max_length=256)
    """v0.4 metadata: who publishes the model."""

    presentation: Presentation | None = None
    """v0.4 metadata: logo, monogram."""

    distribution: Distribution | None = None
    """v0.4 metadata: type, source, license."""

    family: str | None = Field(default=None, max_length=128)
    """v0.4 metadata: the model family."""

    revision: str | None = Field(default=None, max_length=128)
    """v0.4 metadata: the model revision."""

    released_at: str | None = Field(default=None, max_length=64)
    """v0.4 metadata: release date."""

    knowledge_cutoff: str | None = Field(default=None, max_length=64)
    """v0.4 metadata: knowledge cutoff."""

    lifecycle: str | None = Field(default=None, max_length=64)
    """v0.4 metadata: preview, stable, deprecated, ..."""

    max_output_tokens: int | None = Field(default=None, ge=0)
    """v0.4: the most tokens it writes (candidate_requirements.context reads it)."""

    modalities: Modalities | None = None
    """v0.4: input/output modalities (candidate_requirements.capabilities reads input)."""

    _rated: float | None = PrivateAttr(default=None)

    @property
    def quality(self) -> float | None:
        """``quality_score``, else the operator-rating record of the top-level
        ``evaluation`` (RootConfig binds it)."""
        return self.quality_score if self.quality_score is not None else self._rated

    def bind_rating(self, score: float | None) -> None:
        self._rated = score


# -- decisions ------------------------------------------------------------------------------


class ModelRef(Strict):
    model: str = Field(min_length=1, max_length=128)
    """A providers.models (or modelCards) name."""

    lora_name: str | None = Field(default=None, min_length=1, max_length=128)
    """A LoRA of the model's card, sent to the backend as ``model`` instead."""

    weight: float = Field(default=0.0, ge=0.0)
    """Upstream: the share in remom's model distribution (metadata when run as static)."""

    use_reasoning: bool = False
    """Switch the model's reasoning on (providers reasoning_family)."""

    reasoning_effort: str | None = Field(default=None, min_length=1, max_length=32)
    """The effort when reasoning (default: providers.defaults.default_reasoning_effort, else
    medium)."""

    reasoning_description: str | None = Field(default=None, max_length=4000)
    """Free text for people."""

    reasoning_mode: str | None = Field(default=None, min_length=1, max_length=32)
    """v0.4: enabled / disabled / adaptive for a model whose reasoning is of type
    reasoning_mode (refused by vllm-sr: use use_reasoning)."""


class Algorithm(Strict):
    """How a decision picks among its modelRefs. vllm-sr runs ``static`` and the selectors
    latency_aware, multi_factor, router_dc, automix, hybrid, prompt (vllm_sr/router/selection;
    their blocks are checked by vllm_sr/config/routing_selection.py and selection_*.py), and the
    looper types as upstream runs them: as loopers with a looper endpoint (vllm_sr/router/looper;
    their blocks checked by vllm_sr/config/routing_looper.py and looper_fanout_checks.py), else
    as static, see ``effective_algorithm``."""

    type: str = Field(max_length=64)
    """The algorithm (lowercase): static, latency_aware, multi_factor, router_dc, automix,
    hybrid, prompt; looper types confidence, ratings, remom, fusion, workflows; knn, kmeans,
    svm, mlp are refused."""

    on_error: str | None = Field(default=None, max_length=32)
    """Upstream: what a failing selector does."""

    minimum_candidates: int | None = Field(default=None, ge=0, le=64)
    """v0.4: the least number of distinct modelRefs (model, lora_name) the decision must
    declare; checked at load, as upstream's validator does."""

    confidence: JsonObject | None = None
    """The confidence looper's settings."""

    ratings: JsonObject | None = None
    """The ratings looper's settings."""

    remom: JsonObject | None = None
    """The remom looper's settings."""

    fusion: JsonObject | None = None
    """The fusion looper's settings."""

    workflows: JsonObject | None = None
    """The workflows looper's settings."""

    router_dc: JsonObject | None = None
    """The router_dc selector's settings (routing_selection.RouterDCSettings)."""

    automix: JsonObject | None = None
    """The automix selector's settings (routing_selection.AutoMixSettings)."""

    hybrid: JsonObject | None = None
    """The hybrid selector's settings (routing_selection.HybridSettings)."""

    latency_aware: JsonObject | None = None
    """The latency_aware selector's settings (routing_selection.LatencyAwareSettings)."""

    multi_factor: JsonObject | None = None
    """The multi_factor selector's settings (selection_multi_factor.MultiFactorSettings)."""

    prompt: JsonObject | None = None
    """The prompt selector's settings (selection_prompt.PromptSettings)."""

    decision: dict[str, object] | None = None
    """Upstream v0.4's decision selector ({instructions, candidates, timeout_ms}; refused: it
    needs a generative decision model)."""


class Plugin(Strict):
    type: str = Field(min_length=1, max_length=64)
    """The plugin (every type is refused by vllm-sr for now)."""

    configuration: JsonObject | None = None
    """The plugin's settings."""


class Retention(Strict):
    """Upstream's retention directive (vllm_sr/router/retention.py acts on it). Every field is
    tri-state: unset is not the same as false or 0 (the debug headers show only set ones)."""

    drop: bool | None = None
    """True: the decision's answers are never written to the response cache (reads stay)."""

    ttl_turns: int | None = Field(default=None, ge=0)
    """> 0: the cache entry lives 60 s per turn, whatever the plugin, store or request say;
    not with ``drop: true``."""

    keep_current_model: bool | None = None
    """Upstream: a model-switch gate's forced stay (not wired in upstream's router; metadata
    here)."""

    prefer_prefix_retention: bool | None = None
    """Upstream: a hint header to the pool (metadata)."""


class Emit(Strict):
    kind: Literal["retention"]
    """The directive's kind (upstream's only one; at most one per decision)."""

    retention: Retention | None = None
    """The retention directive (required: upstream refuses an emit without it)."""


class LearningAdaptation(Strict):
    mode: str | None = Field(default=None, max_length=32)
    """apply / observe / bypass (omitted: the decision's mode)."""

    candidate_set: CandidateSetField | None = None
    """Which models adaptation may choose from (omitted: the global candidate_set)."""


class LearningProtection(Strict):
    mode: str | None = Field(default=None, max_length=32)
    """apply / observe / bypass (omitted: the decision's mode)."""

    stability_weight: float | None = Field(default=None, ge=0)
    """Replaces the global tuning's stability_weight for this decision."""

    switch_margin: float | None = Field(default=None, ge=0)
    """Replaces the global tuning's switch_margin for this decision."""


class Adaptations(Strict):
    """Upstream's per-decision Router Learning controls (vllm_sr/router/learning)."""

    mode: str | None = Field(default=None, max_length=32)
    """apply / observe (computed, not acted on) / bypass (learning off here); omitted: apply."""

    adaptation: LearningAdaptation | None = None
    """Model-choice learning."""

    protection: LearningProtection | None = None
    """Stability protection."""


class DecisionAction(Strict):
    """v0.4's explicit action of a matched decision (upstream requires a jailbreak leaf)."""

    type: Literal["route"]
    """The action (only route)."""

    destination: str = Field(min_length=1, max_length=256)
    """Where the request goes instead of the ranked candidates."""


class Decision(Strict):
    name: str = Field(min_length=1, max_length=128)
    """The decision's name (answer header x-vsr-selected-decision)."""

    description: str | None = Field(default=None, max_length=4000)
    """Free text for people."""

    priority: int = Field(default=0, ge=-1_000_000_000, le=1_000_000_000)
    """Strategy priority: higher wins among matching decisions."""

    tier: int = Field(default=0, ge=0, le=1_000_000)
    """When any matching decision has tier > 0, the lowest tier wins first (tier 0 first)."""

    rules: RuleNode | RuleLeaf | None = None
    """When the decision matches; omitted (or {}): always, with confidence 0."""

    action: DecisionAction | None = None
    """v0.4: an explicit route instead of candidate ranking (refused by vllm-sr)."""

    model_refs: list[ModelRef] = Field(default_factory=list, alias="modelRefs", max_length=64)
    """The models to use, in order; omitted: providers.defaults.default_model."""

    algorithm: Algorithm | None = None
    """How to pick among modelRefs (omitted: static)."""

    plugins: list[Plugin] = Field(default_factory=list, max_length=64)
    """Request/response plugins (vllm_sr/config/routing_plugins.py and plugin_*.py type them)."""

    adaptations: Adaptations | None = None
    """Upstream's Router Learning controls for this decision."""

    emits: list[Emit] = Field(default_factory=list, max_length=16)
    """Declarative directives: one ``retention`` at most (acted on by the response cache)."""

    annotations: JsonObject | None = None
    """Metadata with no effect (at most 32 keys, 4 KiB as JSON, as upstream)."""

    output_contract: str | None = Field(default=None, max_length=20000)
    """Upstream: looper prompt text (metadata when loopers run as static)."""

    output_contract_spec: JsonObject | None = None
    """Upstream: looper output handling (metadata when loopers run as static)."""

    candidate_iterations: list[JsonObject] = Field(
        default_factory=list, alias="candidateIterations", max_length=64
    )
    """Upstream DSL metadata (FOR ... IN blocks)."""

    @field_validator("rules", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == {} else value

    @field_validator("annotations")
    @classmethod
    def _small(cls, value: JsonObject | None) -> JsonObject | None:
        if value is None:
            return value
        if len(value) > 32:
            raise ValueError(f"{len(value)} annotation keys; accepted: at most 32")
        size = len(json.dumps(value, default=str).encode())
        if size > 4096:
            raise ValueError(f"annotations are {size} bytes as JSON; accepted: at most 4096")
        return value


class Routing(Strict):
    model_cards: list[ModelCard] = Field(default_factory=list, alias="modelCards", max_length=256)
    """The model catalog (names, LoRAs, metadata)."""

    strategy: Literal["priority", "confidence"] = "priority"
    """priority: matching decisions by priority, then confidence, then name; confidence:
    by confidence, then priority, then name."""

    signals: Signals = Field(default_factory=Signals)
    """The signals decisions can use."""

    projections: Projections = Field(default_factory=Projections)
    """Upstream's derived signals (refused by vllm-sr)."""

    decisions: list[Decision] = Field(default_factory=list, max_length=1024)
    """The decisions, each a rule tree over signals and the models to use."""

    fallback: FallbackPolicy | None = None
    """v0.4: upstream's fallback policy (refused unless enabled: false)."""

    candidate_requirements: CandidateRequirements | None = None
    """v0.4: candidates filtered by context, protocol and capabilities before the choice."""

    data_policy: DataPolicy | None = None
    """v0.4: replay: false turns router_replay off for this recipe."""

    model_bindings: dict[str, ModelBinding] = Field(default_factory=dict, max_length=256)
    """v0.4 metadata: model consumer -> deployment (vllm_sr/config/routing_catalog.py)."""

    @model_validator(mode="after")
    def _rules(self, info: ValidationInfo[object]) -> Routing:
        if not rules_run_by_caller(info):
            raise_first(routing_local_problems(self.model_dump(by_alias=True, exclude_none=True)))
        return self

    def lora_base(self, name: str) -> str | None:
        """The modelCard serving LoRA ``name``, or None."""
        for card in self.model_cards:
            if any(lora.name == name for lora in card.loras):
                return card.name
        return None


class AutoModelNames(Strict):
    """The field the lead adds to ``global.router`` (schema.Router)."""

    auto_model_names: list[str] = Field(
        default_factory=lambda: list(DEFAULT_AUTO_MODEL_NAMES), min_length=1, max_length=16
    )
    """Chat ``model`` names that mean "route this request" (default: vllm-sr/auto, auto)."""
