"""Router Learning around one routed chat: reads the request (identity headers, the
messages), runs adaptation then protection (upstream's applyRouterLearning order) over the
matched decision, records the conversation's turn, and learns from the answer. The state
(conversations, experience, counters) is one ``LearningState`` per process that survives
config reloads; the settings come with each generation."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_sr.config.learning_rules import CandidateSet
from vllm_sr.jsontypes import JsonObject
from vllm_sr.router.learning import adaptation as adapt
from vllm_sr.router.learning import protection as protect
from vllm_sr.router.learning.facts import cache_pressure, conversation_facts, prices, scoped
from vllm_sr.router.learning.policy import PROTECTION, Policies, Policy
from vllm_sr.router.learning.settings import (
    APPLY,
    BYPASS,
    DecisionLearning,
    LearningSettings,
    for_decision,
)
from vllm_sr.router.learning.state import LearningState

if TYPE_CHECKING:
    from vllm_sr.config.routing import Decision
    from vllm_sr.config.upstream_learning import LearningStateStore
    from vllm_sr.router.route import Router, RouteResult

log = logging.getLogger("vllm_sr.router.learning")


MAX_IDENTITY = 256  # characters of session/conversation kept as written


@dataclass(frozen=True)
class Turn:
    """One chat's learning: the result it routes with and what to record afterwards."""

    result: RouteResult
    policies: Policies
    decision: str
    tier: int
    memory_key: str | None  # protection's conversation (None: not tracked)
    learns: bool  # the answer feeds adaptation's experience

    def headers(self) -> dict[str, str]:
        return self.policies.headers()


@dataclass(frozen=True)
class _RouterFacts:
    router: Router
    decisions: dict[str, Decision]
    costs: dict[str, float]  # prompt + completion price per model
    pressure: dict[str, float]  # cache checkout price share per model


@dataclass(frozen=True)
class _Proposal:
    model: str
    candidates: list[str]
    scores: dict[str, float]


@dataclass(frozen=True)
class _Request:
    identity: str | None
    conversation: protect.Conversation


class RouterLearning:
    def __init__(
        self,
        settings: LearningSettings,
        state: LearningState | None = None,
        store: LearningStateStore | None = None,
    ) -> None:
        """``store``: ``global.router.learning.state_store`` (redis shares the conversations)."""
        self.settings = settings
        self.state = state if state is not None else LearningState()
        self.state.memory.ttl_s = settings.state_ttl_s
        self.state.use_store(store if settings.enabled else None)
        self._facts: dict[str, _RouterFacts] = {}

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    def inventory(self) -> JsonObject:
        """Conversations tracked here, the store, its failures and the actions by decision."""
        st = self.state
        return {
            "conversations": len(st.memory),
            "store": "redis" if st.shared is not None else "local",
            "store_errors": st.store_errors,
            "actions": [
                {"decision": d, "method": m, "action": a, "count": n}
                for (d, m, a), n in sorted(st.actions.items())
            ],
        }

    def _of(self, router: Router) -> _RouterFacts:
        """What learning reads of a recipe's router, once per generation."""
        facts = self._facts.get(router.recipe)
        if facts is None or facts.router is not router:
            facts = _RouterFacts(
                router,
                {d.name: d for d in router.routing.decisions},
                prices(router),
                cache_pressure(router),
            )
            self._facts[router.recipe] = facts
        return facts

    async def apply(
        self,
        router: Router,
        result: RouteResult,
        body: Mapping[str, object],
        headers: Mapping[str, str],
    ) -> Turn | None:
        """The routed chat's learning, None when learning does not touch it (off, a named
        model, no decision, or routing fell back to the default model)."""
        if not self.enabled or not result.routed or result.decision is None:
            return None
        try:
            return await self._apply(router, result, self._read(body, headers))
        except Exception:  # learning must never fail a chat: it goes as routed
            log.exception("Router Learning failed on decision %s", result.decision)
            return None

    async def _apply(self, router: Router, result: RouteResult, req: _Request) -> Turn | None:
        if result.fallback is not None:
            return None
        decision = self._of(router).decisions.get(result.decision or "")
        if decision is None:
            return None
        cfg = for_decision(self.settings, decision.adaptations)
        sampling, preflight = self._preflight(cfg, req)
        policies = Policies(protection=preflight)
        proposal = self._propose(router, result, decision, cfg, sampling, policies)
        final = proposal.model
        key = None
        if req.identity is not None and self.settings.protection and cfg.protection_mode != BYPASS:
            key = scoped(result.recipe, req.identity)
        if key is not None:
            found = await self._protect(router, result, decision, cfg, req, key, proposal)
            final, policies.protection = found.model, found.policy
        for policy in policies.listed():
            self.state.actions[(decision.name, policy.method, policy.action)] += 1
        learns = self.settings.adaptation and cfg.adaptation_mode != BYPASS
        routed = result if final == result.model else _moved(result, final)
        name = scoped(result.recipe, decision.name)
        return Turn(routed, policies, name, decision.tier, key, learns)

    def _propose(
        self,
        router: Router,
        result: RouteResult,
        decision: Decision,
        cfg: DecisionLearning,
        sampling: bool,
        policies: Policies,
    ) -> _Proposal:
        """Adaptation's proposal (the decision's pick when adaptation is off or keeps it),
        with the candidates and scores protection weighs it among, as upstream hands them on:
        adaptation's only when it proposed a switch."""
        models = self._decision_models(router, result)
        base = {m: 1.0 - i * 0.001 for i, m in enumerate(models)}
        if not self.settings.adaptation:
            return _Proposal(result.model, list(base), base)
        found, candidates = self._adapt(router, result, decision, cfg, sampling)
        policies.adaptation = found.policy
        if found.model == result.model:
            return _Proposal(result.model, list(base), base)
        return _Proposal(found.model, candidates, {**base, **found.scores})

    async def _protect(
        self,
        router: Router,
        result: RouteResult,
        decision: Decision,
        cfg: DecisionLearning,
        req: _Request,
        key: str,
        proposal: _Proposal,
    ) -> protect.SwitchResult:
        """Protection's switch step over the conversation's state; the turn is recorded (and
        shared, with the redis store)."""
        name = scoped(result.recipe, decision.name)
        shared = self.state.shared
        if shared is not None:
            doc = await shared.load(key)
            if doc is not None:
                self.state.memory.hydrate(key, doc)
        snapshot = self.state.memory.snapshot(key)
        conversation = req.conversation
        if snapshot is not None:
            conversation = dataclasses.replace(
                conversation,
                model=snapshot.model,
                turns=snapshot.turns,
                switches=snapshot.switches,
                idle_s=snapshot.idle_s,
            )
        candidates = list(proposal.candidates)
        current = conversation.model
        if current and current not in candidates and router.backends.healthy(current):
            candidates.append(current)  # upstream's addCurrentLearningCandidate
        found = protect.switch(
            protect.SwitchInput(
                mode=cfg.protection_mode,
                scope=self.settings.scope,
                tuning=cfg.tuning,
                conversation=conversation,
                candidates=candidates,
                scores=proposal.scores,
                base_model=result.model,
                proposal=proposal.model,
                cost_pressure=self._of(router).pressure,
                evidence=lambda m: self.state.experience.snapshot(name, decision.tier, m),
            )
        )
        self.state.memory.record_decision(key, found.model, conversation.turn_index, name)
        await self._share(key)
        return found

    async def _share(self, key: str) -> None:
        doc = self.state.memory.export(key)
        if self.state.shared is not None and doc is not None:
            await self.state.shared.save(key, doc)

    async def observe(
        self,
        turn: Turn | None,
        answered_by: str | None,
        status: int,
        failed: Sequence[tuple[str, str]],
        latency_s: float | None,
    ) -> None:
        """What the answer showed: the models that failed before their first byte, the one
        that answered (its status and latency); the conversation is now on the model that
        answered."""
        if turn is None:
            return
        if turn.learns:
            exp = self.state.experience
            for model, _reason in failed:
                exp.record_answer(turn.decision, turn.tier, model, failed=True)
            if answered_by is not None and answered_by not in dict(failed):
                bad = status == 429 or status >= 500
                exp.record_answer(
                    turn.decision,
                    turn.tier,
                    answered_by,
                    latency_s=None if bad else latency_s,
                    failed=bad,
                )
        key = turn.memory_key
        if key is not None and answered_by is not None and status < 400:
            moved = answered_by != turn.result.model
            self.state.memory.record_answer(key, answered_by)
            if moved:
                await self._share(key)

    # -- the parts ------------------------------------------------------------------------

    def _read(self, body: Mapping[str, object], headers: Mapping[str, str]) -> _Request:
        s = self.settings
        session = headers.get(s.session_header.lower(), "").strip()
        conversation = headers.get(s.conversation_header.lower(), "").strip()
        identity: str | None = None
        if session and s.scope == "session":
            identity = session
        elif session and conversation:
            identity = f"{session}/{conversation}"
        if identity is not None and len(identity) > MAX_IDENTITY:
            # the memory is bounded in entries; a long id is kept as its digest
            identity = "sha256:" + hashlib.sha256(identity.encode()).hexdigest()
        return _Request(identity, conversation_facts(body.get("messages")))

    def _preflight(self, cfg: DecisionLearning, req: _Request) -> tuple[bool, Policy | None]:
        """(whether adaptation may sample, protection's policy before the switch step)."""
        if not self.settings.protection:
            return cfg.adaptation_mode == APPLY, None
        mode, scope = cfg.protection_mode, self.settings.scope
        if mode == BYPASS:
            return cfg.adaptation_mode == APPLY, Policy(
                PROTECTION, mode, "bypass", "decision_bypass", scope
            )
        if req.identity is None:
            return cfg.adaptation_mode == APPLY, Policy(
                PROTECTION, mode, "suppress_sampling", "missing_identity", scope
            )
        if cfg.adaptation_mode != APPLY:
            return False, None
        if mode != APPLY:
            return True, None
        return not req.conversation.active_tool_loop, None

    def _adapt(
        self,
        router: Router,
        result: RouteResult,
        decision: Decision,
        cfg: DecisionLearning,
        sampling: bool,
    ) -> tuple[adapt.AdaptationResult, list[str]]:
        name = scoped(result.recipe, decision.name)
        candidates = self._candidate_set(router, result, decision, cfg.candidate_set)
        found = adapt.routing_sampling(
            cfg.adaptation_mode,
            candidates,
            lambda m: self.state.experience.snapshot(name, decision.tier, m),
            result.model,
            cfg.candidate_set,
            self._of(router).costs,
            sampling_allowed=sampling,
            seed=self.state.seed_source() if sampling else 0,
        )
        return found, candidates

    def _decision_models(self, router: Router, result: RouteResult) -> list[str]:
        """The decision's models in static's order (its pick first, then the rest as written),
        those with a usable backend."""
        models = [result.model, *(r.model for r in result.decision_refs)]
        return [result.model] + [
            m for m in dict.fromkeys(models[1:]) if m != result.model and router.backends.healthy(m)
        ]

    def _candidate_set(
        self, router: Router, result: RouteResult, decision: Decision, candidate_set: CandidateSet
    ) -> list[str]:
        """decision: its modelRefs; tier: every decision's of the same tier (tier > 0);
        global: the default model, every decision's, every provider model. Only models with a
        usable backend."""
        models = [r.model for r in result.decision_refs] or [result.model]
        decisions = router.routing.decisions
        if candidate_set == "tier" and decision.tier > 0:
            models = [r.model for d in decisions if d.tier == decision.tier for r in d.model_refs]
        elif candidate_set == "global":
            models = [router.default_model, *(r.model for d in decisions for r in d.model_refs)]
            models += sorted(m.name for m in router.providers.models)
        known = router.backends.models
        return [m for m in dict.fromkeys(models) if m in known and router.backends.healthy(m)]


def _moved(result: RouteResult, model: str) -> RouteResult:
    """The result on another model: its modelRef from the decision, else a bare one (upstream
    adds the current model as ``ModelRef{Model: current}``)."""
    from vllm_sr.config.routing import ModelRef

    ref = next((r for r in result.decision_refs if r.model == model), None)
    return dataclasses.replace(result, model=model, model_ref=ref or ModelRef(model=model))
