"""Typed sub-blocks of upstream ``global.services`` that configure no backend connection:
observability, the management API's auth and the batch classification API (upstream
``observability_config.go``, ``management_api.go``, ``api_batch_classification_config.go``).
Router Learning and the learned selectors' globals are typed in ``upstream_learning``.

None changes what vllm-sr does (they are deployment settings); they are typed so a misspelled
key is still an error with its path and line.
"""

from __future__ import annotations

from pydantic import Field

from vllm_sr.config.routing_base import Strict

# -- services.observability --------------------------------------------------------------------


class TracingExporter(Strict):
    type: str | None = None
    """Upstream: otlp, jaeger, stdout."""

    endpoint: str | None = None
    """Upstream: collector address."""

    insecure: bool | None = None
    """Upstream: plaintext to the collector."""


class TracingSampling(Strict):
    type: str | None = None
    """Upstream: always_on, always_off, probabilistic."""

    rate: float | None = None
    """Upstream: probabilistic sampling rate."""


class TracingResource(Strict):
    service_name: str | None = None
    """Upstream: service.name."""

    service_version: str | None = None
    """Upstream: service.version."""

    deployment_environment: str | None = None
    """Upstream: deployment.environment."""


class Tracing(Strict):
    enabled: bool | None = None
    """Upstream: OpenTelemetry tracing on."""

    provider: str | None = None
    """Upstream: opentelemetry."""

    exporter: TracingExporter | None = None
    """Upstream: where spans go."""

    sampling: TracingSampling | None = None
    """Upstream: which requests are traced."""

    resource: TracingResource | None = None
    """Upstream: resource attributes."""


class WindowedMetrics(Strict):
    enabled: bool | None = None
    """Upstream: windowed load metrics on."""

    time_windows: list[str] | None = None
    """Upstream: windows (1m, 5m, 1h)."""

    update_interval: str | None = None
    """Upstream: refresh period."""

    model_metrics: bool | None = None
    """Upstream: per-model metrics."""

    queue_depth_estimation: bool | None = None
    """Upstream: queue depth estimate."""

    max_models: int | None = None
    """Upstream: most models tracked."""


class Metrics(Strict):
    enabled: bool | None = None
    """Upstream: Prometheus metrics on."""

    windowed_metrics: WindowedMetrics | None = None
    """Upstream: windowed load metrics."""


class Observability(Strict):
    profiling: Profiling | None = None
    """Upstream v0.4: a pprof server (refused when enabled)."""

    tracing: Tracing | None = None
    """Upstream: OpenTelemetry tracing. vllm-sr has its own logs and metrics."""

    metrics: Metrics | None = None
    """Upstream: Prometheus metrics settings."""


# -- services.api, services.management_api ----------------------------------------------------


class BatchSizeRange(Strict):
    min: int | None = None
    """Upstream: smallest batch of the range."""

    max: int | None = None
    """Upstream: largest batch of the range."""

    label: str | None = None
    """Upstream: the range's metric label."""


class BatchClassificationMetrics(Strict):
    sample_rate: float | None = None
    """Upstream: sampled share."""

    batch_size_ranges: list[BatchSizeRange] | None = None
    """Upstream: batch size buckets."""

    duration_buckets: list[float] | None = None
    """Upstream: latency histogram buckets."""

    size_buckets: list[float] | None = None
    """Upstream: size histogram buckets."""

    enabled: bool | None = None
    """Upstream: metrics on."""

    detailed_goroutine_tracking: bool | None = None
    """Upstream: goroutine tracking."""

    high_resolution_timing: bool | None = None
    """Upstream: high-resolution timing."""


class BatchClassification(Strict):
    max_batch_size: int | None = None
    """Upstream: largest batch."""

    concurrency_threshold: int | None = None
    """Upstream: batch size that turns on concurrency."""

    max_concurrency: int | None = None
    """Upstream: most concurrent classifications."""

    metrics: BatchClassificationMetrics | None = None
    """Upstream: batch API metrics."""


class EmbeddingsAPI(Strict):
    enabled: bool | None = None
    """Upstream v0.4: its diagnostics embeddings API (vllm-sr: each worker's /v1/embeddings)."""


class RoutingPreviewAPI(Strict):
    request_timeout_seconds: int | None = Field(default=None, ge=1, le=3600)
    """Upstream v0.4: a preview's time limit (acted on: vllm_sr/router/preview_limits.py)."""

    max_concurrency: int | None = Field(default=None, ge=1)
    """Upstream v0.4: previews at once (acted on: vllm_sr/router/preview_limits.py)."""


class Profiling(Strict):
    enabled: bool | None = None
    """Upstream v0.4: Go's pprof server (refused when true: vllm-sr has none)."""

    port: int | None = None
    """Upstream: its port."""

    bind: str | None = None
    """Upstream: its address."""


class API(Strict):
    batch_classification: BatchClassification | None = None
    """Upstream: limits of the batch classification API (vllm-sr does not serve it)."""

    embeddings: EmbeddingsAPI | None = None
    """Upstream v0.4: the diagnostics embeddings API switch (metadata)."""

    routing_preview: RoutingPreviewAPI | None = None
    """Upstream v0.4: /api/v1/routing/preview's limits (metadata; vllm-sr serves it)."""


class ManagementToken(Strict):
    env: str | None = None
    """Upstream: environment variable holding the token."""

    role: str | None = None
    """Upstream: the token's role."""


class ManagementAuth(Strict):
    mode: str | None = None
    """Upstream: disabled, token..."""

    tokens: list[ManagementToken] | None = None
    """Upstream: accepted tokens."""

    roles: dict[str, list[str]] | None = None
    """Upstream: permissions per role."""
