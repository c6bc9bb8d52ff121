"""The selectors vllm-sr runs besides ``static`` (upstream's
``pkg/selection/{latency_aware,multi_factor,router_dc,automix,hybrid,prompt}.go``; the load-time
checks of ``pkg/config/validator_decision.go``): their names, the settings of
``latency_aware``, ``router_dc``, ``automix`` and ``hybrid`` as typed models (multi_factor's in
:mod:`vllm_sr.config.selection_multi_factor`, prompt's in :mod:`vllm_sr.config.selection_prompt`),
:func:`parse_settings` for all six, and the rules on the raw ``algorithm.<type>`` block that
name the field, the value and what is accepted.

Upstream's rules, kept here:

- ``latency_aware`` and ``multi_factor`` blocks are required when the type names them;
  ``router_dc``, ``automix`` and ``hybrid`` may go without one (their settings then come from
  ``global.router.model_selection``), ``prompt`` needs its block;
- ``latency_aware``: at least one of ``tpot_percentile`` / ``ttft_percentile`` set (> 0), each
  one set within 1-100 (ours: a negative one is refused too; upstream fails it at request time
  and falls back to the first modelRef);
- ``router_dc`` / ``automix`` / ``hybrid``: upstream checks only the keys' types (ours: a
  number that cannot mean anything is refused too: a negative weight, temperature or
  escalation count, a probability outside 0-1);
- ``knn``, ``kmeans``, ``svm``, ``mlp`` are refused by name (:data:`TRAINED_REFUSAL`).

Unknown keys are refused with the accepted ones named."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from vllm_sr.config.routing_base import Path, Strict, as_dict, is_int, is_number, problem, refusal
from vllm_sr.config.selection_checks import percentile_problems, unknown_keys
from vllm_sr.config.selection_multi_factor import MultiFactorSettings, multi_factor_problems
from vllm_sr.config.selection_prompt import PROMPT, PromptSettings, prompt_block_problems
from vllm_sr.jsontypes import JsonObject

if TYPE_CHECKING:
    from vllm_sr.config.problems import Problem

LATENCY_AWARE = "latency_aware"
MULTI_FACTOR = "multi_factor"
ROUTER_DC = "router_dc"
AUTOMIX = "automix"
HYBRID = "hybrid"
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


class LatencyAwareSettings(Strict):
    tpot_percentile: int = Field(default=0, ge=0, le=100)
    """The TPOT percentile compared (1-100; 0: TPOT not used)."""

    ttft_percentile: int = Field(default=0, ge=0, le=100)
    """The TTFT percentile compared (1-100; 0: TTFT not used)."""

    description: str | None = Field(default=None, max_length=4000)
    """Free text for people (upstream's reference config writes one)."""


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


def selector_block_problems(path: Path, kind: str, algo: JsonObject) -> list[Problem]:
    """Upstream's checks of a selector decision's block; ``path`` is the decision's
    ``algorithm``. (prompt's checks that need the decision, the config's models and the looper
    endpoint: :func:`vllm_sr.config.selection_prompt.prompt_problems`.)"""
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
        return multi_factor_problems(base, block)
    if kind == PROMPT:
        return prompt_block_problems(base, block, algo.get("on_error"), (*path, "on_error"))
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
    problems = unknown_keys(base, block, tuple(spec))
    for key, (kind, low, high) in spec.items():
        value = block.get(key)
        if value is None:
            continue
        if kind == "bool":
            ok = isinstance(value, bool)
            accepted = "true or false"
        else:
            number = value if (is_int(value) if kind == "int" else is_number(value)) else None
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


def trained_selector_refusal(path: Path, kind: str) -> Problem:
    """The refusal of knn / kmeans / svm / mlp, with why."""
    return refusal(
        (*path, "type"),
        f"the algorithm {kind!r} ({TRAINED_REFUSAL.format(kind=kind)})",
        ", ".join(("static", *RUN_SELECTORS)),
    )


def _latency_aware_problems(base: Path, block: JsonObject) -> list[Problem]:
    problems = unknown_keys(base, block, tuple(LatencyAwareSettings.model_fields))
    for key in ("tpot_percentile", "ttft_percentile"):
        problems += percentile_problems((*base, key), block.get(key), "0 or absent: not used")
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
