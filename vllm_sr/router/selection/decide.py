"""A matched decision's model: ``static`` (vllm_sr/router/rules.py) or one of the selectors
(:mod:`.selectors`, :mod:`.router_dc`, :mod:`.automix`, :mod:`.hybrid`, :mod:`.prompt`) on live
facts, with vllm-sr's health rule around them.

At chat time the selectors see only the modelRefs with a healthy backend (none: the default
model, ``models_unhealthy``, as static). A decision with one modelRef is ``single``, as
upstream. A selector that fails (multi_factor with ``on_no_candidates: fail``, a prompt helper
that fails, times out or answers nonsense) sends the chat to the first candidate, as upstream
does on any selector error; the caller's own deadline running out during a selector's call is
the chat's 504, as upstream returns the request's error.

``/api/v1/eval`` dry-runs latency_aware and multi_factor on the live observations and reports
the others (router_dc, automix, hybrid, prompt) as upstream's eval does: ``execution_required``
("selector depends on request-time state that Eval does not mutate"), no model."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm_sr import wire
from vllm_sr.config.routing_selection import (
    HYBRID,
    LATENCY_AWARE,
    MULTI_FACTOR,
    ROUTER_DC,
    RUN_SELECTORS,
    AutoMixSettings,
    HybridSettings,
    LatencyAwareSettings,
    RouterDCSettings,
    SelectorSettings,
    parse_settings,
)
from vllm_sr.config.selection_multi_factor import MultiFactorSettings
from vllm_sr.config.selection_prompt import PromptSettings
from vllm_sr.errors import DeadlineExceeded
from vllm_sr.jsontypes import JsonObject
from vllm_sr.router.rules import ModelChoice, choose_model
from vllm_sr.router.selection import automix as automix_mod
from vllm_sr.router.selection import hybrid as hybrid_mod
from vllm_sr.router.selection import prompt as prompt_mod
from vllm_sr.router.selection.router_dc import ModelVectors, RouterDCConfig, model_texts, router_dc
from vllm_sr.router.selection.selectors import (
    Facts,
    NoCandidates,
    Selection,
    latency_aware,
    multi_factor,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from vllm_sr.config.routing import Decision, ModelRef, Routing
    from vllm_sr.config.routing_providers import Providers
    from vllm_sr.config.upstream_learning import ModelSelection
    from vllm_sr.router.backends import BackendSet
    from vllm_sr.router.cache.embedding import QueryEmbedding
    from vllm_sr.router.route import Exchange
    from vllm_sr.router.selection.candidates import Needs
    from vllm_sr.router.selection.observations import ModelObservations

log = logging.getLogger("vllm_sr.router")

DRY_RUN = (LATENCY_AWARE, MULTI_FACTOR)  # upstream's eval previews only these (and static)


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


def selection_inventory(backends: BackendSet) -> dict[str, JsonObject]:
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
    """What ``/api/v1/eval`` reports for a selector decision (``ref`` None: no model before
    execution)."""

    ref: ModelRef | None
    status: str  # selected, fallback, execution_required
    method: str
    reason: str


@dataclass(slots=True)  # one per chat: not frozen (a frozen __init__ sets each field by a call)
class SelectionRequest:
    """What a selector may read of the chat: its text, the caller's headers (credential,
    deadline) and when the chat started (a clock time)."""

    query: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    started: float | None = None
    # the chat's query embedding (routing's own bundle answer when it asked the decision
    # deployment): router_dc reads it instead of asking again
    embedding: QueryEmbedding | None = None
    # what the chat needs of a candidate (v0.4 candidate_requirements, selection/candidates.py;
    # None: the routing requires nothing): the router narrows the healthy modelRefs by it
    needs: Needs | None = None


@dataclass
class SelectionServices:
    """What the request-time selectors reach: upstream's global ``model_selection``
    settings, the decision deployment's embeddings (router_dc, hybrid) and the backends (the
    prompt selector's helper)."""

    model_selection: ModelSelection | None = None
    deployment: str | None = None
    exchange: Exchange | None = None
    timeout_ms: float | None = None
    backends: BackendSet | None = None


class DecisionSelection:
    """Each decision's selector, built once per config generation."""

    def __init__(
        self,
        routing: Routing,
        facts: Facts,
        services: SelectionServices | None = None,
    ) -> None:
        self.facts = facts
        self.routing = routing
        self.services = services or SelectionServices()
        self.settings: dict[str, tuple[str, SelectorSettings]] = {}
        # (method, decision, reason) of each chat a failing selector sent to the first modelRef
        self.fallbacks: Counter[tuple[str, str, str]] = Counter()
        for d in routing.decisions:
            algo = d.algorithm
            if algo is not None and algo.type in RUN_SELECTORS:
                self.settings[d.name] = (
                    algo.type,
                    parse_settings(algo.type, getattr(algo, algo.type)),
                )
        ms = self.services.model_selection
        first_dc = next(
            (
                s
                for d in routing.decisions
                if d.algorithm is not None
                and d.algorithm.type == ROUTER_DC
                and d.algorithm.router_dc is not None
                and isinstance(s := self.settings[d.name][1], RouterDCSettings)
            ),
            None,
        )
        self.router_dc_config = RouterDCConfig.of(ms.router_dc if ms else None, first_dc)
        self.automix_config = automix_mod.AutoMixConfig.of(ms.automix if ms else None)
        self.hybrid_global = ms.hybrid if ms else None
        self.descriptions = {c.name: (c.description or "") for c in routing.model_cards}
        self.vectors: ModelVectors | None = None
        if any(k in (ROUTER_DC, HYBRID) for k, _ in self.settings.values()):
            models = list(
                dict.fromkeys(
                    [
                        *(c.name for c in routing.model_cards),
                        *(r.model for d in routing.decisions for r in (d.model_refs or [])),
                    ]
                )
            )
            self.vectors = ModelVectors(
                model_texts(routing, models, self.router_dc_config),
                self.services.deployment,
                self.services.exchange,
                self.services.timeout_ms,
            )

    def runs_selector(self, decision: Decision | None) -> bool:
        return decision is not None and decision.name in self.settings

    # -- the selectors -------------------------------------------------------------------------

    def _sync_select(
        self, kind: str, settings: SelectorSettings, refs: Sequence[ModelRef]
    ) -> Selection:
        if isinstance(settings, LatencyAwareSettings):
            return latency_aware(refs, settings, self.facts)
        if isinstance(settings, MultiFactorSettings):
            return multi_factor(refs, settings, self.facts)
        if isinstance(settings, AutoMixSettings):
            weight = automix_mod.cost_weight(settings)
            return automix_mod.automix(refs, self.automix_config, weight, self.facts)
        raise ValueError(f"{kind} needs the request (query, helper)")

    async def _router_dc(
        self, refs: Sequence[ModelRef], query: str, embedding: QueryEmbedding | None
    ) -> Selection:
        vectors = self.vectors
        if vectors is None:
            return router_dc(refs, self.router_dc_config, None, {})
        qvec = await vectors.query(query, embedding)
        models = await vectors.models() if qvec is not None else {}
        return router_dc(refs, self.router_dc_config, qvec, models)

    async def _hybrid(
        self,
        settings: HybridSettings,
        refs: Sequence[ModelRef],
        query: str,
        embedding: QueryEmbedding | None,
    ) -> Selection:
        config = hybrid_mod.HybridConfig.of(self.hybrid_global, settings)
        weight = hybrid_mod.selection_cost_weight(settings)
        components: dict[str, dict[str, float]] = {}
        if config.experience_weight > 0:  # no Elo feedback here: every candidate alike
            components["experience"] = {r.model: 1.0 / len(refs) for r in refs}
        if config.router_dc_weight > 0:
            components["router_dc"] = (await self._router_dc(refs, query, embedding)).scores
        if config.automix_weight > 0:
            am = automix_mod.automix(refs, self.automix_config, weight, self.facts)
            components["automix"] = am.scores
        return hybrid_mod.hybrid(refs, config, weight, components, self.facts)

    async def _prompt(
        self, settings: PromptSettings, refs: Sequence[ModelRef], request: SelectionRequest
    ) -> Selection:
        backends = self.services.backends
        if backends is None or settings.model not in backends.models:
            raise prompt_mod.PromptFailed(
                "selector_unavailable", f"no backends of the helper {settings.model!r}"
            )
        clock = backends.clock
        now = clock.monotonic()
        caller: float | None = None
        ms = wire.deadline_ms(request.headers.get(wire.DEADLINE_KEY))
        if ms is not None:
            caller = (request.started if request.started is not None else now) + ms / 1000.0
        bound = now + settings.timeout_s
        if caller is not None:
            bound = min(bound, caller)
        system = prompt_mod.system_prompt(settings.instructions, refs, self.descriptions)
        body = prompt_mod.helper_body(settings, system, request.query)
        try:
            async with asyncio.timeout(max(0.0, bound - now)):
                content, usage = await prompt_mod.ask_helper(
                    backends, settings, body, request.headers, bound
                )
        except (TimeoutError, prompt_mod.PromptFailed) as exc:
            if caller is not None and clock.monotonic() >= caller:
                raise DeadlineExceeded(
                    "the caller's deadline ran out while the prompt selector asked its helper "
                    f"{settings.model!r}"
                ) from None
            if isinstance(exc, prompt_mod.PromptFailed):
                raise
            raise prompt_mod.PromptFailed(
                "selector_timeout", f"no answer from {settings.model} in {bound - now:.3f} s"
            ) from None
        log.info(
            "prompt selector: helper %s, %d prompt + %d completion tokens, %d ms",
            usage.model,
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.latency_ms,
        )
        model, rationale = prompt_mod.parse_choice(content)
        return prompt_mod.pick(refs, model, rationale)

    async def select(
        self, decision: Decision, refs: Sequence[ModelRef], request: SelectionRequest
    ) -> Selection:
        kind, settings = self.settings[decision.name]
        if isinstance(settings, RouterDCSettings):
            return await self._router_dc(refs, request.query, request.embedding)
        if isinstance(settings, HybridSettings):
            return await self._hybrid(settings, refs, request.query, request.embedding)
        if isinstance(settings, PromptSettings):
            return await self._prompt(settings, refs, request)
        return self._sync_select(kind, settings, refs)

    # -- the chat and eval ---------------------------------------------------------------------

    async def choose(
        self,
        decision: Decision | None,
        default_model: str,
        healthy: Callable[[str], bool],
        model_scores: Mapping[str, float] | None = None,
        request: SelectionRequest | None = None,
    ) -> ModelChoice:
        """The chat's model: static's choice, or the decision's selector among its healthy
        modelRefs."""
        refs: list[ModelRef] = list(decision.model_refs or []) if decision is not None else []
        if decision is None or not self.runs_selector(decision) or len(refs) <= 1:
            return choose_model(decision, default_model, healthy, model_scores)
        usable = [r for r in refs if healthy(r.model)]
        if not usable:
            return ModelChoice(default_model, "models_unhealthy")
        kind = self.settings[decision.name][0]
        try:
            picked = await self.select(decision, usable, request or SelectionRequest())
        except (NoCandidates, prompt_mod.PromptFailed) as exc:
            reason = exc.reason if isinstance(exc, prompt_mod.PromptFailed) else "selector_error"
            self.fallbacks[(kind, decision.name, reason)] += 1
            log.info("decision %s: %s; the first modelRef", decision.name, exc)
            return ModelChoice(usable[0].model, None, usable[0], kind)
        return ModelChoice(picked.ref.model, None, picked.ref, kind)

    def preview(self, decision: Decision) -> Preview:
        """Eval's dry run of a selector decision with more than one modelRef (no health
        check, as upstream's eval)."""
        refs = list(decision.model_refs or [])
        kind, settings = self.settings[decision.name]
        if kind not in DRY_RUN:
            return Preview(
                None,
                "execution_required",
                kind,
                "selector depends on request-time state that Eval does not mutate",
            )
        try:
            picked = self._sync_select(kind, settings, refs)
        except NoCandidates as exc:
            return Preview(refs[0], "fallback", kind, f"{exc}; the first modelRef")
        return Preview(picked.ref, "selected", kind, picked.reason)


def for_router(
    routing: Routing,
    providers: Providers,
    backends: BackendSet,
    model_selection: ModelSelection | None,
    deployment: str | None,
    exchange: Exchange | None,
    timeout_ms: float | None,
) -> DecisionSelection:
    """A router's decision selection on its live facts and services."""
    return DecisionSelection(
        routing,
        LiveFacts(backends.observations, backends, providers, routing),
        SelectionServices(model_selection, deployment, exchange, timeout_ms, backends),
    )
