"""A deployment's settings as the pool applies them: admission limit, deadline, failure backoff,
outlier ejection and the limits every replica must report when config sets them.

This is the one settings type per deployment: built once from the validated config
(``from_deployment``) and handed down through the supervisor's plan to the pool. Defaults that
config.yaml documents, the bounds of every field config.yaml sets, and the one cross-field check
of outlier_detection have their home in ``vllm_sr.config.deployment``; this model reads them
from there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, model_validator

from vllm_sr.cluster.ejection import EjectionRules
from vllm_sr.config.deployment import (
    DEFAULT_BASE_EJECTION_MS,
    DEFAULT_CONSECUTIVE_TIMEOUTS,
    DEFAULT_MAX_EJECTION_PERCENT,
    DEFAULT_TIMEOUT_MS,
    ConsecutiveTimeouts,
    EjectionMs,
    EjectionPercent,
    HangAfterMs,
    MaxNumBatchedTokens,
    MaxNumSeqs,
    TimeoutMs,
    default_max_ejection_ms,
    ejection_bounds_problem,
)
from vllm_sr.pool import outlier

if TYPE_CHECKING:
    from vllm_sr.config.schema import Deployment


# The ignore: mypy reads pydantic's own ``__init__(**data: Any)`` into every model class.
class PoolSettings(BaseModel):
    """Per-deployment pool settings (from config.yaml's deployment entry)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_inflight_per_replica: int = Field(
        default=32, ge=1, description="In-flight HTTP requests per worker."
    )
    # The bounds of the fields config.yaml sets are config's (``vllm_sr.config.deployment``).
    timeout_ms: TimeoutMs = Field(default=DEFAULT_TIMEOUT_MS, description="Per exchange.")
    consecutive_timeouts: ConsecutiveTimeouts = Field(
        default=DEFAULT_CONSECUTIVE_TIMEOUTS, description="Timeouts in a row; 0 = off."
    )
    base_ejection_ms: EjectionMs = DEFAULT_BASE_EJECTION_MS
    max_ejection_ms: EjectionMs | None = Field(
        default=None, description="Default: ten times the base."
    )
    max_ejection_percent: EjectionPercent = DEFAULT_MAX_EJECTION_PERCENT
    failure_backoff_s: float = Field(
        default=0.1, gt=0, description="First short backoff after a failure."
    )
    failure_backoff_max_s: float = Field(
        default=3.2, gt=0, description="Cap of the doubling backoff."
    )
    hang_after_ms: HangAfterMs | None = Field(
        default=None,
        description="A forward running longer than this is a hung worker (restarted). "
        "Default: max(3 x timeout_ms, 10 s).",
    )
    configured_max_num_seqs: MaxNumSeqs | None = None
    configured_max_num_batched_tokens: MaxNumBatchedTokens | None = None

    @model_validator(mode="after")
    def _check(self) -> PoolSettings:
        problem = ejection_bounds_problem(self.base_ejection_ms, self.max_ejection_ms)
        if problem is not None:
            raise ValueError(problem)
        if self.failure_backoff_max_s < self.failure_backoff_s:
            raise ValueError("failure_backoff_max_s must be at least failure_backoff_s")
        return self

    @property
    def effective_max_ejection_ms(self) -> int:
        if self.max_ejection_ms is not None:
            return self.max_ejection_ms
        return default_max_ejection_ms(self.base_ejection_ms)

    @property
    def hang_bound_s(self) -> float:
        """How long one forward may run before its worker counts as hung."""
        if self.hang_after_ms is not None:
            return self.hang_after_ms / 1000.0
        return max(3 * self.timeout_ms, 10_000) / 1000.0

    def policy(self) -> EjectionRules:
        """The outlier_detection settings as the cluster's ejection rules (in ms)."""
        return outlier.rules(
            consecutive_timeouts=self.consecutive_timeouts,
            base_ejection_ms=self.base_ejection_ms,
            max_ejection_ms=self.effective_max_ejection_ms,
            max_ejection_percent=self.max_ejection_percent,
        )

    def deadline_s(self, caller_timeout_ms: float | None = None) -> float:
        """The exchange's deadline: the shorter of ``timeout_ms`` and the caller's."""
        ms: float = self.timeout_ms
        if caller_timeout_ms is not None and caller_timeout_ms > 0:
            ms = min(ms, caller_timeout_ms)
        return ms / 1000.0

    @classmethod
    def from_deployment(cls, deployment: Deployment, **overrides: object) -> PoolSettings:
        """The settings of a validated config deployment (``vllm_sr.config.schema``)."""
        od = deployment.outlier_detection
        values: dict[str, object] = {
            "timeout_ms": deployment.timeout_ms,
            "consecutive_timeouts": od.consecutive_timeouts,
            "base_ejection_ms": od.base_ejection_ms,
            "max_ejection_ms": od.max_ejection_ms,
            "max_ejection_percent": od.max_ejection_percent,
            "hang_after_ms": deployment.hang_after_ms,
            "configured_max_num_seqs": deployment.engine_args.max_num_seqs,
            "configured_max_num_batched_tokens": deployment.engine_args.max_num_batched_tokens,
        }
        values.update(overrides)
        return cls.model_validate(values)
