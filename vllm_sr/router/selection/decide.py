"""A matched decision's model: ``static`` (vllm_sr/router/rules.py) or one of the selectors
(:mod:`.selectors`) on live facts, with vllm-sr's health rule around them.

At chat time the selectors see only the modelRefs with a healthy backend (none: the default
model, ``models_unhealthy``, as static). A decision with one modelRef is ``single``, as
upstream. A selector that fails (multi_factor with ``on_no_candidates: fail``) sends the chat to
the first candidate, as upstream does on any selector error; ``/api/v1/eval`` then reports
``selection_status: fallback``."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm_sr.config.routing_selection import RUN_SELECTORS, parse_settings
from vllm_sr.router.rules import ModelChoice, choose_model
from vllm_sr.router.selection.selectors import (
    NoCandidates,
    Selection,
    latency_aware,
    multi_factor,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from vllm_sr.config.routing import Providers, Routing
    from vllm_sr.router.backends import BackendSet
    from vllm_sr.router.selection.observations import ModelObservations

log = logging.getLogger("vllm_sr.router")


class LiveFacts:
    """The selectors' facts from a running router: the backends' observations and in-flight
    counts, the providers' prices and the modelCards' quality scores."""

    def __init__(
        self,
        observations: ModelObservations,
        backends: BackendSet,
        providers: Providers,
        routing: Routing,
    ) -> None:
        self.observations = observations
        self.backends = backends
        self.prices = {
            m.name: m.pricing.prompt_per_1m
            for m in providers.models
            if m.pricing is not None and m.pricing.configured
        }
        self.qualities = {
            c.name: float(c.quality) for c in routing.model_cards if c.quality is not None
        }

    def tpot(self, model: str, percentile: int) -> float | None:
        return self.observations.tpot(model, percentile)

    def ttft(self, model: str, percentile: int) -> float | None:
        return self.observations.ttft(model, percentile)

    def inflight(self, model: str) -> int:
        return sum(b.inflight for b in self.backends.models.get(model, ()))

    def prompt_price(self, model: str) -> float | None:
        return self.prices.get(model)

    def quality(self, model: str) -> float | None:
        return self.qualities.get(model)


def selection_inventory(backends: BackendSet) -> dict[str, dict[str, Any]]:
    """The inventory's ``selection``: per model, the chats in flight and the observed TTFT /
    TPOT (samples, p50 and p95 in ms) the selectors read; prices are each backend's
    ``pricing``."""
    seen = backends.observations.snapshot()
    return {
        model: {"inflight": sum(b.inflight for b in members), **seen.get(model, {})}
        for model, members in sorted(backends.models.items())
    }


@dataclass(frozen=True)
class Preview:
    """What ``/api/v1/eval`` reports for a selector decision."""

    ref: Any
    status: str  # selected, fallback
    method: str
    reason: str


class DecisionSelection:
    """Each decision's selector, built once per config generation."""

    def __init__(self, routing: Routing, facts: Any) -> None:
        self.facts = facts
        self.settings = {
            d.name: (
                d.algorithm.type,
                parse_settings(d.algorithm.type, getattr(d.algorithm, d.algorithm.type)),
            )
            for d in routing.decisions
            if d.algorithm is not None and d.algorithm.type in RUN_SELECTORS
        }

    def runs_selector(self, decision: Any) -> bool:
        return decision is not None and decision.name in self.settings

    def _select(self, decision: Any, refs: Sequence[Any]) -> Selection:
        kind, settings = self.settings[decision.name]
        if kind == "latency_aware":
            return latency_aware(refs, settings, self.facts)  # type: ignore[arg-type]
        return multi_factor(refs, settings, self.facts)  # type: ignore[arg-type]

    def choose(
        self,
        decision: Any,
        default_model: str,
        healthy: Callable[[str], bool],
        model_scores: Mapping[str, float] | None = None,
    ) -> ModelChoice:
        """The chat's model: static's choice, or the decision's selector among its healthy
        modelRefs."""
        refs = list(getattr(decision, "model_refs", None) or [])
        if not self.runs_selector(decision) or len(refs) <= 1:
            return choose_model(decision, default_model, healthy, model_scores)
        usable = [r for r in refs if healthy(r.model)]
        if not usable:
            return ModelChoice(default_model, "models_unhealthy")
        kind = self.settings[decision.name][0]
        try:
            picked = self._select(decision, usable)
        except NoCandidates as exc:
            log.info("decision %s: %s; the first modelRef", decision.name, exc)
            return ModelChoice(usable[0].model, None, usable[0], kind)
        return ModelChoice(picked.ref.model, None, picked.ref, kind)

    def preview(self, decision: Any) -> Preview:
        """Eval's dry run of a selector decision with more than one modelRef (no health
        check, as upstream's eval)."""
        refs = list(decision.model_refs)
        kind = self.settings[decision.name][0]
        try:
            picked = self._select(decision, refs)
        except NoCandidates as exc:
            return Preview(refs[0], "fallback", kind, f"{exc}; the first modelRef")
        return Preview(picked.ref, "selected", kind, picked.reason)
