"""Per-deployment pool settings: admission limit, deadline, failure backoff, outlier
ejection and the limits every replica must report when config sets them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from vllm_sr.pool import outlier


class PoolSettings(BaseModel):
    """Per-deployment pool settings (from config.yaml's deployment entry)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_inflight_per_replica: int = Field(
        default=32, ge=1, description="In-flight HTTP requests per worker."
    )
    timeout_ms: int = Field(default=30_000, ge=1, description="Per exchange with a worker.")
    consecutive_timeouts: int = Field(
        default=3, ge=0, description="Timeouts in a row that eject; 0 = off."
    )
    base_ejection_ms: int = Field(default=30_000, ge=1, le=outlier.MAX_EJECTION_CAP_MS)
    max_ejection_ms: int | None = Field(
        default=None,
        ge=1,
        le=outlier.MAX_EJECTION_CAP_MS,
        description="Default: ten times the base.",
    )
    max_ejection_percent: int = Field(default=50, ge=0, le=100)
    failure_backoff_s: float = Field(
        default=0.1, gt=0, description="First short backoff after a failure."
    )
    failure_backoff_max_s: float = Field(
        default=3.2, gt=0, description="Cap of the doubling backoff."
    )
    configured_max_num_seqs: int | None = Field(default=None, ge=1)
    configured_max_num_batched_tokens: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _check(self) -> PoolSettings:
        if self.max_ejection_ms is not None and self.max_ejection_ms < self.base_ejection_ms:
            raise ValueError(
                f"max_ejection_ms ({self.max_ejection_ms}) must be at least base_ejection_ms "
                f"({self.base_ejection_ms})"
            )
        if self.failure_backoff_max_s < self.failure_backoff_s:
            raise ValueError("failure_backoff_max_s must be at least failure_backoff_s")
        return self

    @property
    def effective_max_ejection_ms(self) -> int:
        if self.max_ejection_ms is not None:
            return self.max_ejection_ms
        return min(10 * self.base_ejection_ms, outlier.MAX_EJECTION_CAP_MS)

    def policy(self) -> outlier.OutlierPolicy:
        return outlier.OutlierPolicy(
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
    def from_deployment(cls, deployment: Any, **overrides: Any) -> PoolSettings:
        """Build from a config deployment object (``vllm_sr.config.schema``), read by
        attribute: ``timeout_ms``, ``outlier_detection.*``, ``engine_args.max_num_*``.
        Attributes it lacks keep the defaults."""
        values: dict[str, Any] = {}
        timeout = getattr(deployment, "timeout_ms", None)
        if timeout is not None:
            values["timeout_ms"] = timeout
        od = getattr(deployment, "outlier_detection", None)
        for name in (
            "consecutive_timeouts",
            "base_ejection_ms",
            "max_ejection_ms",
            "max_ejection_percent",
        ):
            value = getattr(od, name, None) if od is not None else None
            if value is not None:
                values[name] = value
        engine = getattr(deployment, "engine_args", None)
        if engine is not None:
            values["configured_max_num_seqs"] = getattr(engine, "max_num_seqs", None)
            values["configured_max_num_batched_tokens"] = getattr(
                engine, "max_num_batched_tokens", None
            )
        values.update(overrides)
        return cls(**values)
