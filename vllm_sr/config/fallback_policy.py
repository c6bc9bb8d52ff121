"""v0.4's ``FallbackPolicy`` (``routing.fallback``, ``recipes[].routing.fallback``,
``global.router.fallback``): upstream's budget for trying further candidates when a backend
attempt fails (attempts, timeouts, retryable statuses, a circuit breaker). Typed so that a typo
is an unknown-key error; vllm-sr refuses a policy that is not ``enabled: false`` by name, as
its own fallback (docs/router.md "Backend fallback") is not configured by these fields."""

from __future__ import annotations

from pydantic import Field

from vllm_sr.config.problems import Problem
from vllm_sr.config.routing_base import Path, Strict, as_dict, refusal

Duration = str | int


class CircuitBreaker(Strict):
    consecutive_failures: int | None = Field(default=None, ge=0)
    """Upstream: failures in a row that open the breaker."""

    cooldown_period: Duration | None = None
    """Upstream: how long the breaker stays open ("30s" or seconds)."""

    half_open_probes: int | None = Field(default=None, ge=0)
    """Upstream: probe requests let through while half open."""


class FallbackPolicy(Strict):
    version: int | None = None
    """Upstream: the policy's schema version."""

    enabled: bool | None = None
    """Upstream: the policy applies (only false is accepted by vllm-sr)."""

    max_attempts: int | None = Field(default=None, ge=0)
    """Upstream: most candidates tried for one request."""

    total_timeout: Duration | None = None
    """Upstream: the whole request's budget."""

    per_attempt_timeout: Duration | None = None
    """Upstream: one attempt's budget."""

    retryable_status_codes: list[int] = Field(default_factory=list, max_length=64)
    """Upstream: backend statuses that move on to the next candidate."""

    circuit_breaker: CircuitBreaker | None = None
    """Upstream: per-candidate circuit breaker."""


def fallback_problems(path: Path, raw: object) -> list[Problem]:
    """A fallback policy other than ``enabled: false`` refused by name at ``path``."""
    if raw is None or as_dict(raw).get("enabled") is False:
        return []
    return [
        refusal(
            path,
            "the v0.4 fallback policy (upstream's attempts, timeouts, retryable status codes "
            "and circuit breaker across candidates)",
            "enabled: false or no fallback block; vllm-sr's own fallback applies (the next "
            "healthy modelRef before the first byte, docs/router.md 'Backend fallback')",
        )
    ]
