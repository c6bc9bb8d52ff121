"""Adaptation's ``routing_sampling`` strategy (upstream's router_learning_adaptation.go), pure,
and the experience it learns from (router_learning_runtime.go, router_learning_telemetry.go).

Each candidate's quality is a Beta posterior (a 0.5 prior worth 2 outcomes, plus good_fit and
underpowered counts); a sampled draw (or the mean, when sampling is not allowed) minus a cost
penalty (its price against the most expensive candidate), an overuse and a reliability penalty
(share of overprovisioned and failed outcomes) and a latency term, plus a cache term. The best
score wins when it beats the base model by the candidate set's margin and the extra cost; when
sampling, a candidate never observed yet is tried first (cold start)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.config.learning_rules import CandidateSet
from vllm_sr.router.learning.policy import ADAPTATION, Policy
from vllm_sr.router.learning.settings import BYPASS, OBSERVE

EWMA_ALPHA = 0.20
VERDICTS = ("good_fit", "underpowered", "overprovisioned", "failed")
GLOBAL = "_global"
COST_MULTIPLIER: dict[CandidateSet, float] = {"decision": 0.04, "tier": 0.06, "global": 0.10}
SAMPLING_MARGIN: dict[CandidateSet, float] = {"decision": 0.0, "tier": 0.03, "global": 0.08}


@dataclass
class Experience:
    quality_seed: float = 0.5
    seed_weight: float = 2.0
    good_fit: int = 0
    underpowered: int = 0
    overprovisioned: int = 0
    failed: int = 0
    latency_ewma: float = 0.0
    cache_hit_ewma: float = 0.0
    last_updated: float | None = None  # None: never observed (cold start)


def _ewma(previous: float, observed: float) -> float:
    if observed < 0:
        return previous
    if previous <= 0:
        return observed
    return previous * (1 - EWMA_ALPHA) + observed * EWMA_ALPHA


class ExperienceStore:
    """What the router has seen of each model: per (decision, tier), per tier and overall.
    Keys come from the config (decisions x models), so it stays bounded."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self._exp: dict[tuple[str, int, str], Experience] = {}

    def _keys(self, decision: str, tier: int, model: str) -> list[tuple[str, int, str]]:
        keys = [(decision or GLOBAL, tier, model)]
        if decision:
            keys.append((GLOBAL, tier, model))
        if tier:
            keys.append((GLOBAL, 0, model))
        return keys

    def _each(self, decision: str, tier: int, model: str) -> list[Experience]:
        return [self._exp.setdefault(k, Experience()) for k in self._keys(decision, tier, model)]

    def record_verdict(
        self, decision: str, tier: int, model: str, verdict: str, score: float = 0.0
    ) -> None:
        """An outcome verdict (good_fit, underpowered, overprovisioned, failed); ``score`` >= 1
        counts as that many outcomes."""
        if verdict not in VERDICTS:
            raise ValueError(f"verdict {verdict!r}; accepted: {', '.join(VERDICTS)}")
        count = int(score) if score >= 1 else 1
        now = self.clock.monotonic()
        for exp in self._each(decision, tier, model):
            setattr(exp, verdict, getattr(exp, verdict) + count)
            exp.last_updated = now

    def record_answer(
        self,
        decision: str,
        tier: int,
        model: str,
        *,
        latency_s: float | None = None,
        cache_hit_ratio: float | None = None,
        failed: bool = False,
    ) -> None:
        """What a backend's answer showed: its latency and cached share of the prompt, or a
        failure (a 429, a 5xx, or no answer before the first byte)."""
        now = self.clock.monotonic()
        for exp in self._each(decision, tier, model):
            if latency_s is not None and latency_s > 0:
                exp.latency_ewma = _ewma(exp.latency_ewma, latency_s)
            if cache_hit_ratio is not None:
                exp.cache_hit_ewma = _ewma(exp.cache_hit_ewma, _clamp01(cache_hit_ratio))
            if failed:
                exp.failed += 1
            exp.last_updated = now

    def snapshot(self, decision: str, tier: int, model: str) -> Experience:
        """The most specific experience known (decision, then tier, then overall)."""
        for key in ((decision or GLOBAL, tier, model), (GLOBAL, tier, model), (GLOBAL, 0, model)):
            exp = self._exp.get(key)
            if exp is not None:
                return Experience(**exp.__dict__)
        return Experience()


@dataclass(frozen=True)
class CandidateScore:
    model: str
    score: float
    posterior_mean: float
    predicted_quality: float
    cost_penalty: float
    reliability_penalty: float
    cold_start: bool


@dataclass(frozen=True)
class AdaptationResult:
    model: str  # the proposal (the base model when nothing beat it, or in observe mode)
    policy: Policy
    scores: dict[str, float] = field(default_factory=dict)


def score_candidates(
    candidates: Sequence[str],
    experience: Callable[[str], Experience],
    base_model: str,
    candidate_set: CandidateSet,
    costs: Mapping[str, float],
    rng: random.Random | None,
) -> list[CandidateScore]:
    """Every candidate's score, best first (ties by name). ``rng`` None: posterior means."""
    max_cost = max((costs.get(m, 0.0) for m in candidates), default=0.0)
    out = []
    for model in candidates:
        exp = experience(model)
        alpha = exp.seed_weight * exp.quality_seed + exp.good_fit + 1
        beta = exp.seed_weight * (1 - exp.quality_seed) + exp.underpowered + 1
        mean = alpha / (alpha + beta)
        predicted = _clamp01(rng.betavariate(alpha, beta)) if rng is not None else mean
        cost = 0.0
        if max_cost > 0:
            cost = COST_MULTIPLIER[candidate_set] * _clamp01(costs.get(model, 0.0) / max_cost)
        total = exp.good_fit + exp.underpowered + exp.overprovisioned + exp.failed + 1
        overuse = 0.03 * exp.overprovisioned / total
        reliability = 0.10 * exp.failed / total
        score = predicted - cost - overuse - reliability
        score += -0.02 * _clamp01(exp.latency_ewma) + 0.02 * _clamp01(exp.cache_hit_ewma)
        if model == base_model:
            score += 0.001
        out.append(
            CandidateScore(
                model, score, mean, predicted, cost, reliability, exp.last_updated is None
            )
        )
    out.sort(key=lambda s: (-s.score, s.model))
    return out


def routing_sampling(
    mode: str,
    candidates: Sequence[str],
    experience: Callable[[str], Experience],
    base_model: str,
    candidate_set: CandidateSet,
    costs: Mapping[str, float],
    *,
    sampling_allowed: bool,
    seed: int,
) -> AdaptationResult:
    """The proposal for this turn. ``mode`` observe computes and keeps the base model;
    bypass does nothing."""
    if mode == BYPASS:
        return AdaptationResult(base_model, Policy(ADAPTATION, mode, "bypass", "decision_bypass"))
    if not candidates:
        return AdaptationResult(
            base_model, Policy(ADAPTATION, mode, "keep_base", "candidate_set_empty")
        )
    sampling = sampling_allowed and mode != OBSERVE
    rng = random.Random(seed) if sampling else None
    scores = score_candidates(candidates, experience, base_model, candidate_set, costs, rng)
    winner = _winner(scores, base_model, candidate_set)
    if sampling:
        winner = next((s for s in scores if s.cold_start), winner)
    if mode == OBSERVE:
        action, reason = "observe", "observe_only"
    elif winner.model == base_model:
        action, reason = "keep_base", "base_best"
    else:
        action, reason = "propose_switch", "sampled_win" if sampling else "posterior_win"
    if winner.cold_start and mode != OBSERVE:
        reason = "cold_start"
    details = {
        "candidate_set": candidate_set,
        "strategy": "routing_sampling",
        "base_model": base_model,
        "proposal_model": winner.model,
        "sampling": {"used": sampling, "seed": seed if sampling else 0},
    }
    policy = Policy(ADAPTATION, mode, action, reason, details=details)
    proposal = base_model if mode == OBSERVE else winner.model
    return AdaptationResult(proposal, policy, {s.model: s.score for s in scores})


def _winner(
    scores: list[CandidateScore], base_model: str, candidate_set: CandidateSet
) -> CandidateScore:
    best = scores[0]
    base = next((s for s in scores if s.model == base_model), best)
    margin = SAMPLING_MARGIN[candidate_set] + max(0.0, best.cost_penalty - base.cost_penalty)
    if best.model != base_model and best.score < base.score + margin:
        return base
    return best


def _clamp01(value: float) -> float:
    if value != value or value in (float("inf"), float("-inf")):
        return 0.0
    return min(max(value, 0.0), 1.0)
