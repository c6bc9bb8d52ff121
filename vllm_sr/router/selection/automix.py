"""The ``automix`` selector as upstream's request path computes it (``pkg/selection/automix.go``
at 3d48f8c9), pure on its settings and each candidate's quality score and prompt price.

Upstream builds one automix selector per router from ``global.router.model_selection.automix``
(every field zero when that is absent: no defaults are filled in on that path); a decision's
own ``automix`` block gives only the selection's cost weight (``cost_quality_tradeoff`` when
above 0, else 0.5). Each model starts with quality = its modelCard's ``quality_score`` (0.8
when absent, <= 0 or > 1), cost = its prompt price per 1M, verification probability 0.7 and no
escalation reward (those two move only with feedback, which vllm-sr does not collect here, so
they stay at their start).

- value = quality - (cost / 10 x cost_quality_tradeoff when cost_aware_routing and cost > 0)
  (+ an escalation term that is 0 without feedback);
- candidates are ordered by prompt price, cheapest first (ties: modelRef order; upstream's sort
  is not stable);
- ``cost_aware_routing``: the highest value x 1 / (1 + cost x cost weight) (cost > 0), x 1.1
  when the verification probability (0.7) reaches ``verification_threshold``; else (the
  default) the highest value. The first in price order wins ties."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_sr.router.selection.selectors import Selection

if TYPE_CHECKING:
    from collections.abc import Sequence

    from vllm_sr.config.routing import ModelRef
    from vllm_sr.config.routing_selection import AutoMixSettings
    from vllm_sr.config.upstream_learning import AutoMix
    from vllm_sr.router.selection.selectors import Facts

DEFAULT_QUALITY = 0.8
START_VERIFICATION = 0.7
COST_SCALE = 10.0  # upstream: "assuming max cost is ~$10/1M tokens"
DEFAULT_COST_WEIGHT = 0.5


@dataclass(frozen=True)
class AutoMixConfig:
    """Upstream's AutoMixConfig as its request path builds it (zeros when unset)."""

    verification_threshold: float = 0.0
    cost_aware_routing: bool = False
    cost_quality_tradeoff: float = 0.0
    discount_factor: float = 0.0

    @staticmethod
    def of(global_: AutoMix | None) -> AutoMixConfig:
        if global_ is None:
            return AutoMixConfig()
        return AutoMixConfig(
            verification_threshold=global_.verification_threshold or 0.0,
            cost_aware_routing=bool(global_.cost_aware_routing),
            cost_quality_tradeoff=global_.cost_quality_tradeoff or 0.0,
            discount_factor=global_.discount_factor or 0.0,
        )


def cost_weight(block: AutoMixSettings | None) -> float:
    """The selection's cost weight from a decision's automix block (upstream's
    ``getSelectionWeights``)."""
    tradeoff = block.cost_quality_tradeoff if block is not None else None
    return tradeoff if tradeoff is not None and tradeoff > 0 else DEFAULT_COST_WEIGHT


def quality_of(facts: Facts, model: str) -> float:
    q = facts.quality(model)
    return DEFAULT_QUALITY if q is None or q <= 0 or q > 1.0 else q


def values(refs: Sequence[ModelRef], config: AutoMixConfig, facts: Facts) -> dict[str, float]:
    """Each candidate's expected value (upstream's ``computeExpectedValue``)."""
    out: dict[str, float] = {}
    for ref in refs:
        cost = facts.prompt_price(ref.model) or 0.0
        penalty = 0.0
        if config.cost_aware_routing and cost > 0:
            penalty = cost / COST_SCALE * config.cost_quality_tradeoff
        out[ref.model] = quality_of(facts, ref.model) - penalty
    return out


def automix(
    refs: Sequence[ModelRef], config: AutoMixConfig, weight: float, facts: Facts
) -> Selection:
    ordered = sorted(refs, key=lambda r: facts.prompt_price(r.model) or 0.0)
    scores = values(ordered, config, facts)
    best, best_value = ordered[0], float("-inf")
    if config.cost_aware_routing:
        for ref in ordered:
            cost = facts.prompt_price(ref.model) or 0.0
            value = scores[ref.model] * (1.0 / (1.0 + cost * weight) if cost > 0 else 1.0)
            if config.verification_threshold <= START_VERIFICATION:
                value *= 1.1
            if value > best_value:
                best, best_value = ref, value
        reason = (
            f"automix: cost-aware (tradeoff {config.cost_quality_tradeoff:g}, "
            f"cost weight {weight:g}), value {best_value:.4f}"
        )
    else:
        for ref in ordered:
            if scores[ref.model] > best_value:
                best, best_value = ref, scores[ref.model]
        reason = f"automix: highest expected quality {best_value:.4f}"
    return Selection(best, "automix", reason, scores)
