"""The settings of the selectors vllm-sr runs besides ``static`` (upstream's
``pkg/selection/{latency_aware,multi_factor,router_dc,automix,hybrid,prompt}.go``; the load-time
checks of ``pkg/config/validator_decision.go`` and ``validator_prompt.go``), as typed models
and as rules on the raw ``algorithm.<type>`` block that name the field, the value and what is
accepted.

Upstream's rules, kept here:

- ``latency_aware`` and ``multi_factor`` blocks are required when the type names them;
  ``router_dc``, ``automix`` and ``hybrid`` may go without one (their settings then come from
  ``global.router.model_selection``), ``prompt`` needs its block;
- ``latency_aware``: at least one of ``tpot_percentile`` / ``ttft_percentile`` set (> 0), each
  one set within 1-100 (ours: a negative one is refused too; upstream fails it at request time
  and falls back to the first modelRef);
- ``multi_factor``: ``weights.{quality,latency,cost,load}`` finite and non-negative (all zero:
  equal weights), ``latency_percentile`` within 1-100 (0 or absent: 95), ``on_no_candidates``
  one of cheapest (default), first, fail; ``slo.{max_tpot_ms,max_ttft_ms,max_cost_per_1m,
  max_inflight}`` 0 or absent for no ceiling (ours: a negative one is refused, upstream reads it
  as no ceiling);
- ``router_dc`` / ``automix`` / ``hybrid``: upstream checks only the keys' types (ours: a
  number that cannot mean anything is refused too: a negative weight, temperature or
  escalation count, a probability outside 0-1);
- ``prompt``: ``model`` and ``instructions`` non-empty, ``timeout_seconds`` >= 0 (0: 5 s),
  ``on_error`` empty or ``fallback``, at least two modelRefs with unique models and unique
  effective identities (``lora_name``, else ``model``); ``model`` a providers model (its
  backends) whose modelCard, if any, is a chat text model (modality empty, text, ar, both,
  multimodal), and
  ``global.integrations.looper.endpoint`` set (upstream calls the helper through it; vllm-sr
  through its own backends: docs/router.md "Model selection").
- ``knn``, ``kmeans``, ``svm``, ``mlp`` are refused by name (:data:`TRAINED_REFUSAL`).

- ``multi_factor``'s v0.4 keys (upstream's ``cli/algorithms.py`` in the vllm-sr 0.4.0 wheel and
  ``pkg/selection/multi_factor_objective.go``): ``objective.strategy`` weighted (default) or
  lexicographic; ``priorities`` only with lexicographic and required by it, each
  ``{factor: quality|latency|cost|load, tolerance: 0-1}`` with no factor repeated; ``weights``
  not with a lexicographic objective; ``quality.{index (non-empty, no surrounding blanks),
  on_missing: exclude (default) | disable_quality, min_score (finite; only with exclude),
  min_coverage (0-1)}``; ``latency_metric`` ttft or tpot.

v0.4's ``expected_output_tokens`` is refused by name with why (:data:`OUTPUT_FORECAST_REFUSAL`).
Unknown keys are refused with the accepted ones named."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal, TypeGuard

from pydantic import Field, model_validator

from vllm_sr.config.routing_base import Path, Strict, as_dict, as_list, problem, refusal
from vllm_sr.jsontypes import JsonObject

if TYPE_CHECKING:
    from vllm_sr.config.problems import Problem

LATENCY_AWARE = "latency_aware"
MULTI_FACTOR = "multi_factor"
ROUTER_DC = "router_dc"
AUTOMIX = "automix"
HYBRID = "hybrid"
PROMPT = "prompt"
RUN_SELECTORS = (LATENCY_AWARE, MULTI_FACTOR, ROUTER_DC, AUTOMIX, HYBRID, PROMPT)
# selectors whose block may be left out (upstream: settings from global.router.model_selection)
OPTIONAL_BLOCK = (ROUTER_DC, AUTOMIX, HYBRID)
TRAINED_SELECTORS = ("knn", "kmeans", "svm", "mlp")
TRAINED_REFUSAL = (
    "upstream runs it on a trained artifact named by "
    "global.router.model_selection.ml.{kind}.pretrained_path (no default) over its own query "
    "embedding (1024-d Qwen3-Embedding) plus a 14-category one-hot; the only artifacts upstream "
    "ships (src/semantic-router/.cache/ml-models/*_model.json at 3d48f8c9) were trained to "
    "choose among four fixed models (codellama-7b, llama-3.2-1b, llama-3.2-3b, mistral-7b), "
    "and vllm-sr loads none"
)
DEFAULT_PROMPT_TIMEOUT_S = 5
CHAT_MODALITIES = ("", "text", "ar", "both", "multimodal")  # upstream's prompt helper modalities
DEFAULT_LATENCY_PERCENTILE = 95
ON_NO_CANDIDATES = ("cheapest", "first", "fail")


class LatencyAwareSettings(Strict):
    tpot_percentile: int = Field(default=0, ge=0, le=100)
    """The TPOT percentile compared (1-100; 0: TPOT not used)."""

    ttft_percentile: int = Field(default=0, ge=0, le=100)
    """The TTFT percentile compared (1-100; 0: TTFT not used)."""

    description: str | None = Field(default=None, max_length=4000)
    """Free text for people (upstream's reference config writes one)."""


class MultiFactorWeights(Strict):
    quality: float = Field(default=0.25, ge=0.0)
    """Weight of the modelCard's quality_score (higher is better)."""

    latency: float = Field(default=0.25, ge=0.0)
    """Weight of the observed TPOT (else TTFT) percentile (lower is better)."""

    cost: float = Field(default=0.25, ge=0.0)
    """Weight of the prompt price per 1M tokens (lower is better)."""

    load: float = Field(default=0.25, ge=0.0)
    """Weight of the requests in flight to the model (lower is better)."""

    def normalised(self) -> MultiFactorWeights:
        """Summing to 1 (all zero: equal weights), as upstream's selector does."""
        total = self.quality + self.latency + self.cost + self.load
        if total <= 0:
            return MultiFactorWeights()
        return MultiFactorWeights(
            quality=self.quality / total,
            latency=self.latency / total,
            cost=self.cost / total,
            load=self.load / total,
        )


class MultiFactorSLO(Strict):
    max_tpot_ms: float = Field(default=0.0, ge=0.0)
    """Drop a model whose TPOT percentile is above this (0: no ceiling)."""

    max_ttft_ms: float = Field(default=0.0, ge=0.0)
    """Drop a model whose TTFT percentile is above this (0: no ceiling)."""

    max_cost_per_1m: float = Field(default=0.0, ge=0.0)
    """Drop a model whose prompt price per 1M tokens is above this (0: no ceiling)."""

    max_inflight: int = Field(default=0, ge=0)
    """Drop a model with more requests in flight than this (0: no ceiling)."""


FACTORS = ("quality", "latency", "cost", "load")
OBJECTIVES = ("weighted", "lexicographic")
ON_MISSING_QUALITY = ("exclude", "disable_quality")
LATENCY_METRICS = ("ttft", "tpot")


class MultiFactorPriority(Strict):
    factor: Literal["quality", "latency", "cost", "load"]
    """The factor compared at this stage (quality higher is better, the others lower)."""

    tolerance: float = Field(default=0.0, ge=0.0, le=1.0)
    """Keep every candidate within this fraction of the stage's best value (0: only the best)."""


class MultiFactorObjective(Strict):
    strategy: Literal["weighted", "lexicographic"] = "weighted"
    """weighted: the weights' sum; lexicographic: the priorities in order."""

    priorities: list[MultiFactorPriority] = Field(default_factory=list)
    """The ordered factors of a lexicographic objective (each factor at most once)."""

    @property
    def lexicographic(self) -> bool:
        return self.strategy == "lexicographic"

    @model_validator(mode="after")
    def _priority_rules(self) -> MultiFactorObjective:
        if self.strategy == "weighted" and self.priorities:
            raise ValueError("priorities require strategy lexicographic")
        if self.lexicographic and not self.priorities:
            raise ValueError("a lexicographic objective requires priorities")
        factors = [p.factor for p in self.priorities]
        if len(factors) != len(set(factors)):
            raise ValueError(f"priorities repeat a factor: {factors}")
        return self


class QualityEvidence(Strict):
    index: str = Field(min_length=1)
    """The upstream catalog quality index the figure stands for (for example
    ``vllm-sr/general@1.0.0``); vllm-sr reads the modelCard's quality figure and records the
    index in the selection's reason (docs/router.md "Model selection")."""

    on_missing: Literal["exclude", "disable_quality"] = "exclude"
    """A candidate without a quality figure: dropped before scoring (exclude), or the quality
    factor left out of this selection (disable_quality)."""

    min_score: float | None = None
    """Drop a candidate whose quality figure is below this (only with on_missing exclude)."""

    min_coverage: float | None = Field(default=None, ge=0.0, le=1.0)
    """Upstream: the least share of the index's components measured. A modelCard's figure is
    one complete measurement (coverage 1.0), so it never drops a candidate here."""

    @model_validator(mode="after")
    def _evidence_rules(self) -> QualityEvidence:
        if self.index != self.index.strip():
            raise ValueError(f"index {self.index!r} has surrounding blanks")
        if self.min_score is not None and not math.isfinite(self.min_score):
            raise ValueError(f"min_score {self.min_score!r} is not finite")
        if self.min_score is not None and self.on_missing == "disable_quality":
            raise ValueError("min_score requires on_missing exclude")
        return self


class MultiFactorSettings(Strict):
    weights: MultiFactorWeights = Field(default_factory=MultiFactorWeights)
    """The factors' weights (normalised to sum to 1)."""

    objective: MultiFactorObjective = Field(default_factory=MultiFactorObjective)
    """How the factors are combined: weighted (default) or lexicographic priorities."""

    quality: QualityEvidence | None = None
    """The quality evidence required of a candidate (absent: a candidate without a quality
    figure is scored without it, as at 3d48f8c9)."""

    latency_metric: Literal["ttft", "tpot"] | None = None
    """The latency factor's observation: TTFT or TPOT (absent: TPOT, else TTFT)."""

    slo: MultiFactorSLO = Field(default_factory=MultiFactorSLO)
    """Hard ceilings applied before scoring."""

    latency_percentile: int = Field(default=0, ge=0, le=100)
    """The latency percentile read (1-100; 0: 95)."""

    on_no_candidates: Literal["cheapest", "first", "fail"] = "cheapest"
    """When the SLO drops every model: the cheapest by prompt price, the first modelRef, or
    fail (the chat then goes to the first modelRef, as upstream does on a selector error)."""

    @property
    def percentile(self) -> int:
        return self.latency_percentile or DEFAULT_LATENCY_PERCENTILE

    @model_validator(mode="after")
    def _objective_rules(self) -> MultiFactorSettings:
        if self.objective.lexicographic and "weights" in self.model_fields_set:
            raise ValueError("weights cannot be combined with a lexicographic objective")
        return self


class RouterDCSettings(Strict):
    """A decision's ``router_dc`` block (upstream's RouterDCSelectionConfig). Upstream reads
    only ``temperature`` (when > 0), ``require_descriptions`` and ``use_capabilities`` of the
    first router_dc decision's block, over ``global.router.model_selection.router_dc``; the
    others are read from the global settings only."""

    temperature: float | None = Field(default=None, ge=0.0)
    """Sigmoid and softmax temperature (0 or absent: the global one, default 0.07)."""

    dimension_size: int | None = Field(default=None, ge=0)
    """Upstream: the embedding size (not read at request time)."""

    min_similarity: float | None = Field(default=None, ge=0.0, le=1.0)
    """The least similarity that picks a model (read from the global settings: 0.3)."""

    use_query_contrastive: bool | None = None
    """Upstream: a training switch (not read at request time)."""

    use_model_contrastive: bool | None = None
    """Upstream: a training switch (not read at request time)."""

    require_descriptions: bool | None = None
    """Log the models without a description or capabilities (upstream logs them too)."""

    use_capabilities: bool | None = None
    """Add the modelCard's capabilities to the text embedded for the model."""


class AutoMixSettings(Strict):
    """A decision's ``automix`` block (upstream's AutoMixSelectionConfig). Upstream's request
    path reads only its ``cost_quality_tradeoff`` (as the selection's cost weight); the rest
    of the selector's settings are ``global.router.model_selection.automix``."""

    verification_threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    """Upstream: the self-verification threshold."""

    max_escalations: int | None = Field(default=None, ge=0)
    """Upstream: the most escalations."""

    cost_aware_routing: bool | None = None
    """Upstream: weigh cost."""

    cost_quality_tradeoff: float | None = Field(default=None, ge=0.0, le=1.0)
    """The selection's cost weight (0 or absent: 0.5)."""

    discount_factor: float | None = Field(default=None, ge=0.0, le=1.0)
    """Upstream: the POMDP discount."""

    use_logprob_verification: bool | None = None
    """Upstream: verify by logprobs."""


class HybridSettings(Strict):
    """A decision's ``hybrid`` block (upstream's HybridSelectionConfig): each value above 0
    replaces ``global.router.model_selection.hybrid``'s (defaults 0.3, 0.3, 0.2, 0.2, 0.1);
    ``normalize_scores`` is on when either says true."""

    experience_weight: float | None = Field(default=None, ge=0.0)
    """Weight of the feedback-derived (Elo) scores."""

    router_dc_weight: float | None = Field(default=None, ge=0.0)
    """Weight of router_dc's scores."""

    automix_weight: float | None = Field(default=None, ge=0.0)
    """Weight of automix's scores."""

    cost_weight: float | None = Field(default=None, ge=0.0)
    """The cheaper model's bonus (also the selection's cost weight)."""

    quality_gap_threshold: float | None = Field(default=None, ge=0.0)
    """Upstream: reserved (not read at request time)."""

    normalize_scores: bool | None = None
    """Min-max normalise each component's scores before combining them."""


class PromptSettings(Strict):
    """A decision's ``prompt`` block (upstream's PromptSelectionConfig)."""

    model: str = Field(min_length=1, max_length=128)
    """The helper model asked (a modelCards name with providers backends)."""

    instructions: str = Field(min_length=1, max_length=16000)
    """What the helper is told, before the candidate list."""

    timeout_seconds: int = Field(default=0, ge=0, le=3600)
    """The helper call's bound (0: 5 s), within the caller's deadline."""

    @property
    def timeout_s(self) -> float:
        return float(self.timeout_seconds or DEFAULT_PROMPT_TIMEOUT_S)


SelectorSettings = (
    LatencyAwareSettings
    | MultiFactorSettings
    | RouterDCSettings
    | AutoMixSettings
    | HybridSettings
    | PromptSettings
)
_SETTINGS: dict[str, type[Strict]] = {
    LATENCY_AWARE: LatencyAwareSettings,
    MULTI_FACTOR: MultiFactorSettings,
    ROUTER_DC: RouterDCSettings,
    AUTOMIX: AutoMixSettings,
    HYBRID: HybridSettings,
    PROMPT: PromptSettings,
}


def parse_settings(kind: str, block: object) -> SelectorSettings:
    """The typed settings of a checked block (``selector_block_problems`` found none); an
    absent optional block is its defaults."""
    model = _SETTINGS.get(kind)
    if model is None:
        raise ValueError(f"{kind!r} is not a selector vllm-sr runs; accepted: {RUN_SELECTORS}")
    raw = dict(as_dict(block))
    if kind == MULTI_FACTOR and raw.get("on_no_candidates") == "":
        del raw["on_no_candidates"]  # upstream: empty means the default
    parsed = model.model_validate(raw)
    assert isinstance(parsed, SelectorSettings)
    return parsed


# -- the raw rules ---------------------------------------------------------------------------


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _unknown(path: Path, block: JsonObject, accepted: tuple[str, ...]) -> list[Problem]:
    return [
        problem(
            (*path, key),
            f"unknown key {key!r} (value {block[key]!r}); accepted: {', '.join(accepted)}",
        )
        for key in block
        if key not in accepted
    ]


def _percentile(path: Path, value: object, allow_zero: str) -> list[Problem]:
    if value is None or (_is_int(value) and 0 <= value <= 100):
        return []
    return [
        problem(path, f"{value!r}; accepted: an integer from 1 to 100 ({allow_zero})"),
    ]


def _non_negative(path: Path, value: object, what: str, integer: bool = False) -> list[Problem]:
    ok = _is_int(value) if integer else _is_number(value)
    if value is None or (ok and isinstance(value, (int, float)) and value >= 0):
        return []
    kind = "an integer" if integer else "a finite number"
    return [problem(path, f"{value!r}; accepted: {kind} >= 0 ({what})")]


def selector_block_problems(path: Path, kind: str, algo: JsonObject) -> list[Problem]:
    """Upstream's checks of a selector decision's block; ``path`` is the decision's
    ``algorithm``. (prompt's checks that need the decision, the config's models and the looper
    endpoint: :func:`prompt_problems`.)"""
    block = algo.get(kind)
    if block is None:
        if kind in OPTIONAL_BLOCK:
            return []
        return [
            problem(
                (*path, kind),
                f"algorithm.type {kind} without an algorithm.{kind} block; accepted: "
                + _BLOCK_WANTED[kind]
                + " (as upstream)",
            )
        ]
    base = (*path, kind)
    if not isinstance(block, dict):
        return [problem(base, f"{block!r}; accepted: a mapping")]
    if kind == LATENCY_AWARE:
        return _latency_aware_problems(base, block)
    if kind == MULTI_FACTOR:
        return _multi_factor_problems(base, block)
    if kind == PROMPT:
        return _prompt_block_problems(base, block, algo.get("on_error"), (*path, "on_error"))
    return _typed_problems(base, block, _SPECS[kind])


_BLOCK_WANTED = {
    LATENCY_AWARE: "a block with tpot_percentile and/or ttft_percentile (1-100)",
    MULTI_FACTOR: "a block (" + ", ".join(MultiFactorSettings.model_fields) + ")",
    PROMPT: "a block with model, instructions and optionally timeout_seconds",
}

# key -> (kind, low, high, what): kind "number" (finite), "int" or "bool"
_Spec = dict[str, tuple[str, float | None, float | None]]
_SPECS: dict[str, _Spec] = {
    ROUTER_DC: {
        "temperature": ("number", 0.0, None),
        "dimension_size": ("int", 0, None),
        "min_similarity": ("number", 0.0, 1.0),
        "use_query_contrastive": ("bool", None, None),
        "use_model_contrastive": ("bool", None, None),
        "require_descriptions": ("bool", None, None),
        "use_capabilities": ("bool", None, None),
    },
    AUTOMIX: {
        "verification_threshold": ("number", 0.0, 1.0),
        "max_escalations": ("int", 0, None),
        "cost_aware_routing": ("bool", None, None),
        "cost_quality_tradeoff": ("number", 0.0, 1.0),
        "discount_factor": ("number", 0.0, 1.0),
        "use_logprob_verification": ("bool", None, None),
    },
    HYBRID: {
        "experience_weight": ("number", 0.0, None),
        "router_dc_weight": ("number", 0.0, None),
        "automix_weight": ("number", 0.0, None),
        "cost_weight": ("number", 0.0, None),
        "quality_gap_threshold": ("number", 0.0, None),
        "normalize_scores": ("bool", None, None),
    },
}


def _typed_problems(base: Path, block: JsonObject, spec: _Spec) -> list[Problem]:
    problems = _unknown(base, block, tuple(spec))
    for key, (kind, low, high) in spec.items():
        value = block.get(key)
        if value is None:
            continue
        if kind == "bool":
            ok = isinstance(value, bool)
            accepted = "true or false"
        else:
            number = value if (_is_int(value) if kind == "int" else _is_number(value)) else None
            ok = isinstance(number, (int, float)) and (
                (low is None or number >= low) and (high is None or number <= high)
            )
            what = "an integer" if kind == "int" else "a finite number"
            if low is not None and high is not None:
                accepted = f"{what} from {low:g} to {high:g}"
            else:
                accepted = f"{what} >= {low:g}" if low is not None else what
        if not ok:
            problems.append(problem((*base, key), f"{value!r}; accepted: {accepted}"))
    return problems


def _prompt_block_problems(
    base: Path, block: JsonObject, on_error: object, on_error_path: Path
) -> list[Problem]:
    problems = _unknown(base, block, tuple(PromptSettings.model_fields))
    for key in ("model", "instructions"):
        value = block.get(key)
        if not isinstance(value, str) or not value.strip():
            problems.append(
                problem((*base, key), f"{value!r}; accepted: a non-empty string (required)")
            )
    timeout = block.get("timeout_seconds")
    if timeout is not None and not (_is_int(timeout) and 0 <= timeout <= 3600):
        problems.append(
            problem(
                (*base, "timeout_seconds"),
                f"{timeout!r}; accepted: an integer from 0 to 3600 (0 or absent: 5)",
            )
        )
    if on_error not in (None, "", "fallback"):
        problems.append(
            problem(on_error_path, f"{on_error!r} on a prompt decision; accepted: fallback")
        )
    return problems


def prompt_problems(
    routing: object,
    providers: object,
    looper_endpoint: str,
    base: Path = ("routing",),
) -> list[Problem]:
    """Upstream's checks of each prompt decision against the rest of the config: at least two
    modelRefs with unique models and effective identities, the helper model declared in
    ``routing.modelCards`` with providers backends, and a looper endpoint."""
    rt = as_dict(routing)
    card_list = [as_dict(c) for c in as_list(rt.get("modelCards") or rt.get("model_cards"))]
    cards = {c.get("name") for c in card_list}
    modality = {c.get("name"): c.get("modality") for c in card_list}
    served = {as_dict(m).get("name") for m in as_list(as_dict(providers).get("models"))}
    problems: list[Problem] = []
    for i, dec in enumerate(as_list(rt.get("decisions"))):
        algo = as_dict(as_dict(dec).get("algorithm"))
        if algo.get("type") != PROMPT:
            continue
        path: Path = (*base, "decisions", i)
        refs = as_list(as_dict(dec).get("modelRefs"))
        if len(refs) < 2:
            problems.append(
                problem(
                    (*path, "modelRefs"),
                    f"{len(refs)} modelRef(s) on a prompt decision; accepted: at least two "
                    "(as upstream)",
                )
            )
        seen: set[object] = set()
        effective: set[object] = set()
        for j, ref in enumerate(refs):
            model = as_dict(ref).get("model")
            identity = as_dict(ref).get("lora_name") or model
            if model in seen or identity in effective:
                problems.append(
                    problem(
                        (*path, "modelRefs", j),
                        f"model {model!r} (identity {identity!r}) repeats an earlier modelRef "
                        "of a prompt decision; accepted: unique models and lora_names",
                    )
                )
            seen.add(model)
            effective.add(identity)
        helper = as_dict(algo.get("prompt")).get("model")
        if isinstance(helper, str) and helper.strip():
            name = helper.strip()
            if name not in served:
                problems.append(
                    problem(
                        (*path, "algorithm", "prompt", "model"),
                        f"{helper!r}"
                        + (" (a modelCard without providers backends)" if name in cards else "")
                        + "; accepted: a providers.models name (its backends answer the helper "
                        "call)",
                    )
                )
        kind_of = modality.get(helper) if isinstance(helper, str) else None
        if isinstance(kind_of, str) and kind_of.strip().lower() not in CHAT_MODALITIES:
            problems.append(
                problem(
                    (*path, "algorithm", "prompt", "model"),
                    f"{helper!r} has modelCards modality {kind_of!r}; accepted: a chat-capable "
                    "text model (modality empty, " + ", ".join(CHAT_MODALITIES[1:]) + ")",
                )
            )
        if not looper_endpoint:
            problems.append(
                problem(
                    (*path, "algorithm", "type"),
                    "prompt without global.integrations.looper.endpoint; accepted: a looper "
                    "endpoint (upstream calls the helper model through it; vllm-sr calls it "
                    "through its own backends, and requires the endpoint as upstream does)",
                )
            )
    return problems


def trained_selector_refusal(path: Path, kind: str) -> Problem:
    """The refusal of knn / kmeans / svm / mlp, with why."""
    return refusal(
        (*path, "type"),
        f"the algorithm {kind!r} ({TRAINED_REFUSAL.format(kind=kind)})",
        ", ".join(("static", *RUN_SELECTORS)),
    )


def _latency_aware_problems(base: Path, block: JsonObject) -> list[Problem]:
    problems = _unknown(base, block, tuple(LatencyAwareSettings.model_fields))
    for key in ("tpot_percentile", "ttft_percentile"):
        problems += _percentile((*base, key), block.get(key), "0 or absent: not used")
    tpot, ttft = block.get("tpot_percentile"), block.get("ttft_percentile")
    if not problems and not any(isinstance(v, int) and v > 0 for v in (tpot, ttft)):
        problems.append(
            problem(
                base,
                f"tpot_percentile {tpot!r} and ttft_percentile {ttft!r}; accepted: at least "
                "one of them from 1 to 100 (upstream recommends both)",
            )
        )
    return problems


OUTPUT_FORECAST_REFUSAL = (
    "upstream v0.4's forecast of a request's output tokens: its cost factor is the request's "
    "estimated price (input tokens x prompt price + this forecast x completion price); "
    "vllm-sr's cost factor is the prompt price per 1M tokens (as at 3d48f8c9), which needs "
    "no forecast"
)


def _multi_factor_problems(base: Path, block: JsonObject) -> list[Problem]:
    accepted = tuple(MultiFactorSettings.model_fields)
    problems = _unknown(
        base, {k: v for k, v in block.items() if k != "expected_output_tokens"}, accepted
    )
    if "expected_output_tokens" in block:
        value = block["expected_output_tokens"]
        problems.append(
            refusal(
                (*base, "expected_output_tokens"),
                f"expected_output_tokens {value!r} ({OUTPUT_FORECAST_REFUSAL})",
                ", ".join(accepted),
            )
        )
    weights = block.get("weights")
    if weights is not None and not isinstance(weights, dict):
        problems.append(problem((*base, "weights"), f"{weights!r}; accepted: a mapping"))
    elif isinstance(weights, dict):
        problems += _unknown((*base, "weights"), weights, tuple(MultiFactorWeights.model_fields))
        for key in MultiFactorWeights.model_fields:
            problems += _non_negative(
                (*base, "weights", key), weights.get(key), "a weight; all zero: equal weights"
            )
    slo = block.get("slo")
    if slo is not None and not isinstance(slo, dict):
        problems.append(problem((*base, "slo"), f"{slo!r}; accepted: a mapping"))
    elif isinstance(slo, dict):
        problems += _unknown((*base, "slo"), slo, tuple(MultiFactorSLO.model_fields))
        for key in MultiFactorSLO.model_fields:
            problems += _non_negative(
                (*base, "slo", key), slo.get(key), "0: no ceiling", integer=key == "max_inflight"
            )
    problems += _percentile(
        (*base, "latency_percentile"), block.get("latency_percentile"), "0 or absent: 95"
    )
    problems += _objective_problems((*base, "objective"), block.get("objective"))
    problems += _quality_problems((*base, "quality"), block.get("quality"))
    metric = block.get("latency_metric")
    if metric is not None and metric not in LATENCY_METRICS:
        problems.append(
            problem(
                (*base, "latency_metric"),
                f"{metric!r}; accepted: one of {', '.join(LATENCY_METRICS)} (absent: TPOT, "
                "else TTFT)",
            )
        )
    objective = block.get("objective")
    strategy = objective.get("strategy") if isinstance(objective, dict) else None
    if strategy == "lexicographic" and "weights" in block:
        problems.append(
            problem(
                (*base, "weights"),
                f"{block['weights']!r} with objective.strategy lexicographic; accepted: "
                "weights only with the weighted objective (as upstream)",
            )
        )
    mode = block.get("on_no_candidates")
    if mode is not None and mode != "" and mode not in ON_NO_CANDIDATES:
        problems.append(
            problem(
                (*base, "on_no_candidates"),
                f"{mode!r}; accepted: one of {', '.join(ON_NO_CANDIDATES)} (default cheapest)",
            )
        )
    return problems


def _objective_problems(path: Path, objective: object) -> list[Problem]:
    if objective is None:
        return []
    if not isinstance(objective, dict):
        return [problem(path, f"{objective!r}; accepted: a mapping (strategy, priorities)")]
    problems = _unknown(path, objective, tuple(MultiFactorObjective.model_fields))
    strategy = objective.get("strategy", "weighted")
    if strategy not in OBJECTIVES:
        problems.append(
            problem(
                (*path, "strategy"),
                f"{strategy!r}; accepted: one of {', '.join(OBJECTIVES)} (default weighted)",
            )
        )
    priorities = objective.get("priorities")
    if priorities is not None and not isinstance(priorities, list):
        return [
            *problems,
            problem((*path, "priorities"), f"{priorities!r}; accepted: a list of factors"),
        ]
    rows = priorities or []
    if strategy == "weighted" and rows:
        problems.append(
            problem(
                (*path, "priorities"),
                f"{len(rows)} priorities with strategy weighted; accepted: priorities only "
                "with strategy lexicographic (as upstream)",
            )
        )
    if strategy == "lexicographic" and not rows:
        problems.append(
            problem(
                (*path, "priorities"),
                f"{priorities!r} with strategy lexicographic; accepted: at least one "
                "{factor, tolerance} (as upstream)",
            )
        )
    seen: set[object] = set()
    for i, row in enumerate(rows):
        at = (*path, "priorities", i)
        if not isinstance(row, dict):
            problems.append(problem(at, f"{row!r}; accepted: a mapping (factor, tolerance)"))
            continue
        problems += _unknown(at, row, tuple(MultiFactorPriority.model_fields))
        factor = row.get("factor")
        if factor not in FACTORS:
            problems.append(
                problem((*at, "factor"), f"{factor!r}; accepted: one of {', '.join(FACTORS)}")
            )
        elif factor in seen:
            problems.append(
                problem(
                    (*at, "factor"),
                    f"{factor!r} repeats an earlier priority; accepted: each factor at most once",
                )
            )
        seen.add(factor)
        tolerance = row.get("tolerance")
        if tolerance is not None and not (_is_number(tolerance) and 0 <= tolerance <= 1):
            problems.append(
                problem(
                    (*at, "tolerance"),
                    f"{tolerance!r}; accepted: a number from 0 to 1 (a fraction of the best "
                    "value; absent: 0)",
                )
            )
    return problems


def _quality_problems(path: Path, quality: object) -> list[Problem]:
    if quality is None:
        return []
    if not isinstance(quality, dict):
        return [problem(path, f"{quality!r}; accepted: a mapping (index, on_missing, ...)")]
    problems = _unknown(path, quality, tuple(QualityEvidence.model_fields))
    index = quality.get("index")
    if not isinstance(index, str) or not index.strip() or index != index.strip():
        problems.append(
            problem(
                (*path, "index"),
                f"{index!r}; accepted: a quality index id such as 'vllm-sr/general@1.0.0' "
                "(non-empty, no surrounding blanks)",
            )
        )
    on_missing = quality.get("on_missing", "exclude")
    if on_missing not in ON_MISSING_QUALITY:
        problems.append(
            problem(
                (*path, "on_missing"),
                f"{on_missing!r}; accepted: one of {', '.join(ON_MISSING_QUALITY)} "
                "(default exclude)",
            )
        )
    min_score = quality.get("min_score")
    if min_score is not None:
        if not _is_number(min_score):
            problems.append(
                problem((*path, "min_score"), f"{min_score!r}; accepted: a finite number")
            )
        elif on_missing == "disable_quality":
            problems.append(
                problem(
                    (*path, "min_score"),
                    f"{min_score!r} with on_missing disable_quality; accepted: min_score only "
                    "with on_missing exclude (as upstream)",
                )
            )
    coverage = quality.get("min_coverage")
    if coverage is not None and not (_is_number(coverage) and 0 <= coverage <= 1):
        problems.append(
            problem((*path, "min_coverage"), f"{coverage!r}; accepted: a number from 0 to 1")
        )
    return problems
