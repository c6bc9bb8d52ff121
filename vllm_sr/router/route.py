"""One config generation's router: signals -> decision -> model, without HTTP.

The deployments are reached only through the injected ``exchange(deployment, path, body,
timeout_ms) -> (status, body)`` (the lead's wiring sends it through the deployment's
``ReplicaPool`` with kind "routing", so routing load is admitted and counted like native
load). A routing failure (an exchange that raises, a non-200 answer, a malformed answer) never
fails the chat: it routes to ``default_model`` and says why (``RouteResult.fallback``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from vllm_sr.config.routing import Providers, Routing
from vllm_sr.errors import VllmSrError
from vllm_sr.router.backends import BackendSet
from vllm_sr.router.questions import BUNDLE_PATH, DeploymentQuestions, QuestionPlan
from vllm_sr.router.rules import SignalKey, choose_model, rank
from vllm_sr.router.signals import SignalResult

log = logging.getLogger("vllm_sr.router")

Exchange = Callable[[str, str, bytes, float | None], Awaitable[tuple[int, bytes]]]
NO_DECISION = "(default)"  # the decision label of a request no decision matched


@dataclass(frozen=True)
class RouteResult:
    model: str
    decision: str | None = None
    confidence: float | None = None
    matched_signals: tuple[str, ...] = ()  # "type:name", sorted
    fallback: str | None = None  # why default_model was used, when routing could not decide


@dataclass
class RouterStats:
    """Counters for /metrics: decisions by (decision, model), matched signals, fallbacks."""

    decisions: Counter[tuple[str, str]] = field(default_factory=Counter)
    signals: Counter[str] = field(default_factory=Counter)
    fallbacks: Counter[str] = field(default_factory=Counter)
    direct: Counter[str] = field(default_factory=Counter)  # chats naming a model directly

    def record(self, result: RouteResult) -> None:
        self.decisions[(result.decision or NO_DECISION, result.model)] += 1
        for sig in result.matched_signals:
            self.signals[sig] += 1
        if result.fallback is not None:
            self.fallbacks[result.fallback] += 1

    def to_json(self) -> dict[str, object]:
        return {
            "decisions": [
                {"decision": d, "model": m, "count": n}
                for (d, m), n in sorted(self.decisions.items())
            ],
            "signals": dict(sorted(self.signals.items())),
            "fallbacks": dict(sorted(self.fallbacks.items())),
            "direct": dict(sorted(self.direct.items())),
        }


class Router:
    def __init__(
        self,
        providers: Providers,
        routing: Routing,
        *,
        exchange: Exchange,
        backends: BackendSet,
        decision_deployment: str,
        signal_timeout_ms: float | None = None,
        stats: RouterStats | None = None,
    ) -> None:
        self.providers = providers
        self.routing = routing
        self.exchange = exchange
        self.backends = backends
        self.signal_timeout_ms = signal_timeout_ms
        self.plan = QuestionPlan(routing, decision_deployment)
        self.stats = stats if stats is not None else RouterStats()

    @property
    def default_model(self) -> str:
        return self.providers.defaults.default_model

    async def warm(self) -> dict[str, str | None]:
        """Ask each deployment once for what the router and the workers cache (candidate
        embeddings, domain centroids). -> per deployment, None or why it failed (a failed warm
        is retried by the first request, which then carries the candidates itself)."""
        out: dict[str, str | None] = {}
        for dep, q in self.plan.deployments.items():
            body = q.warm_bundle()
            if body is None:
                out[dep] = None
                continue
            try:
                status, answer = await self.exchange(dep, BUNDLE_PATH, body, self.signal_timeout_ms)
                if status != 200:
                    out[dep] = f"http_{status}"
                    continue
                q.read(answer, warm=True)
                out[dep] = None
            except VllmSrError as exc:
                out[dep] = exc.code
        return out

    async def route(self, text: str) -> RouteResult:
        """Signals on ``text`` (the last user message), the decision, its model."""
        results = self.plan.keyword_results(text)
        if self.plan.deployments and text.strip():
            failure = await self._ask_all(text, results)
            if failure is not None:
                result = RouteResult(self.default_model, fallback=f"signals:{failure}")
                self.stats.record(result)
                return result
        matches = rank(self.routing.decisions, results, self.routing.strategy)
        signals = tuple(sorted(f"{t}:{n}" for (t, n), r in results.items() if r.matched))
        best = matches[0] if matches else None
        choice = choose_model(
            best.decision if best else None, self.default_model, self.backends.healthy
        )
        result = RouteResult(
            choice.model,
            best.decision.name if best else None,
            best.confidence if best else None,
            signals,
            choice.fallback,
        )
        self.stats.record(result)
        return result

    async def _ask_all(self, text: str, results: dict[SignalKey, SignalResult]) -> str | None:
        """One exchange per deployment, concurrently; their results go into ``results``.
        -> None, or the first failure's reason code."""
        questions = list(self.plan.deployments.values())
        answers = await asyncio.gather(
            *(self._ask(q, text) for q in questions), return_exceptions=True
        )
        for q, answer in zip(questions, answers, strict=True):
            if isinstance(answer, VllmSrError):
                log.info("routing on %s failed: %s", q.deployment, answer.message)
                return answer.code
            if isinstance(answer, str):
                return answer
            if isinstance(answer, BaseException):
                if isinstance(answer, asyncio.CancelledError):
                    raise answer
                log.error("routing on %s failed", q.deployment, exc_info=answer)
                return "internal_error"
            results.update(answer)
        return None

    async def _ask(self, q: DeploymentQuestions, text: str) -> dict[SignalKey, SignalResult] | str:
        status, body = await self.exchange(
            q.deployment, BUNDLE_PATH, q.bundle(text), self.signal_timeout_ms
        )
        if status != 200:
            return f"http_{status}"
        return q.read(body)
