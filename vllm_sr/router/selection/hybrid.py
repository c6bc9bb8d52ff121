"""The ``hybrid`` selector (upstream's ``pkg/selection/hybrid.go`` at 3d48f8c9), pure on its
components' scores and the models' prompt prices.

Settings: ``global.router.model_selection.hybrid`` over upstream's defaults (experience 0.3,
router_dc 0.3, automix 0.2, cost 0.2, quality gap 0.1, normalize_scores true); each value of the
decision's block above 0 replaces the global one, and ``normalize_scores`` is on when either
says true.

Components, each only when its weight is above 0:

- experience: upstream's Elo ratings, moved by feedback. vllm-sr records no Elo feedback
  (upstream moved Elo to ``global.router.learning.adaptation``), so every candidate has the
  starting rating and the same score (1/n), as upstream before any feedback;
- router_dc: that selector's scores (:mod:`.router_dc`; the first modelRef's default scores 1/n
  when it has no vectors);
- automix: each candidate's expected value (:mod:`.automix`).

Each component's scores are min-max normalised when ``normalize_scores`` (all equal: 0.5), then
combined as sum(weight / total weight x score) over the components present. With
``cost_weight`` above 0 and prompt prices for two or more distinct prices, each priced
candidate's score is multiplied by 1 + (1 - its min-max normalised price) x cost weight x
cost_weight, where cost weight is the decision's own ``hybrid.cost_weight`` (when above 0, else
0.5). The highest wins; the first modelRef on ties."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_sr.router.selection.selectors import Selection

if TYPE_CHECKING:
    from collections.abc import Sequence

    from vllm_sr.config.routing import ModelRef
    from vllm_sr.config.routing_selection import HybridSettings
    from vllm_sr.config.upstream_learning import Hybrid
    from vllm_sr.router.selection.selectors import Facts

DEFAULT_COST_WEIGHT = 0.5


@dataclass(frozen=True)
class HybridConfig:
    experience_weight: float = 0.3
    router_dc_weight: float = 0.3
    automix_weight: float = 0.2
    cost_weight: float = 0.2
    quality_gap_threshold: float = 0.1
    normalize_scores: bool = True

    @staticmethod
    def of(global_: Hybrid | None, block: HybridSettings | None) -> HybridConfig:
        """Upstream's ``buildHybridSelectionConfig``."""
        base = HybridConfig()
        values: dict[str, float] = {}
        for key in ("experience_weight", "router_dc_weight", "automix_weight", "cost_weight"):
            value = getattr(global_, key, None) if global_ is not None else None
            values[key] = value if value is not None else getattr(base, key)
            own = getattr(block, key, None) if block is not None else None
            if own:
                values[key] = own
        gap = global_.quality_gap_threshold if global_ is not None else None
        if block is not None and block.quality_gap_threshold:
            gap = block.quality_gap_threshold
        normalize = global_.normalize_scores if global_ is not None else None
        if normalize is None:
            normalize = base.normalize_scores
        return HybridConfig(
            experience_weight=values["experience_weight"],
            router_dc_weight=values["router_dc_weight"],
            automix_weight=values["automix_weight"],
            cost_weight=values["cost_weight"],
            quality_gap_threshold=gap if gap is not None else base.quality_gap_threshold,
            normalize_scores=bool(normalize) or bool(block is not None and block.normalize_scores),
        )


def selection_cost_weight(block: HybridSettings | None) -> float:
    """upstream's ``getSelectionWeights`` for a hybrid decision."""
    own = block.cost_weight if block is not None else None
    return own if own is not None and own > 0 else DEFAULT_COST_WEIGHT


def normalised(scores: dict[str, float]) -> dict[str, float]:
    if not scores:
        return scores
    low, high = min(scores.values()), max(scores.values())
    if high == low:
        return dict.fromkeys(scores, 0.5)
    return {k: (v - low) / (high - low) for k, v in scores.items()}


def hybrid(
    refs: Sequence[ModelRef],
    config: HybridConfig,
    weight: float,
    components: dict[str, dict[str, float]],
    facts: Facts,
) -> Selection:
    """``components``: the scores of those that ran (experience, router_dc, automix)."""
    weights = {
        "experience": config.experience_weight,
        "router_dc": config.router_dc_weight,
        "automix": config.automix_weight,
    }
    present = {
        name: (normalised(scores) if config.normalize_scores else scores)
        for name, scores in components.items()
        if scores and weights.get(name, 0.0) > 0
    }
    total = sum(weights[name] for name in present)
    combined = dict.fromkeys((r.model for r in refs), 0.0)
    if total == 0:
        combined = dict.fromkeys(combined, 1.0 / len(refs))
    else:
        for name, scores in present.items():
            for model, score in scores.items():
                if model in combined:
                    combined[model] += weights[name] / total * score
    if config.cost_weight > 0 and weight > 0:
        _cost_bonus(combined, config.cost_weight * weight, facts)
    best, best_score = refs[0], combined[refs[0].model]
    for ref in refs[1:]:
        if combined[ref.model] > best_score:
            best, best_score = ref, combined[ref.model]
    parts = [f"{name}={present[name].get(best.model, 0.0):.3f}" for name in present]
    return Selection(
        best,
        "hybrid",
        f"hybrid: [{' '.join(parts)}] weights experience {config.experience_weight:g}, "
        f"router_dc {config.router_dc_weight:g}, automix {config.automix_weight:g}, "
        f"cost {config.cost_weight:g}",
        combined,
    )


def _cost_bonus(scores: dict[str, float], factor: float, facts: Facts) -> None:
    prices = {
        m: p for m in scores if (p := facts.prompt_price(m)) is not None and p > 0
    }  # upstream seeds only prices above 0
    if not prices:
        return
    low, high = min(prices.values()), max(prices.values())
    if high == low:
        return
    for model, price in prices.items():
        scores[model] *= 1.0 + (1.0 - (price - low) / (high - low)) * factor
