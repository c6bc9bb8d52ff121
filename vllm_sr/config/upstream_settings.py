"""Typed sub-blocks of upstream ``global`` settings that configure no backend connection:
observability, the management API's auth, the batch classification API, Router Learning and
the learned selectors' globals (upstream ``observability_config.go``, ``management_api.go``,
``api_batch_classification_config.go``, ``learning_config.go``, ``selection_config.go``).

None changes what vllm-sr does (they are deployment settings, or read only by Router Learning
and selector algorithms, which are refused where they would run); they are typed so a
misspelled key is still an error with its path and line.
"""

from __future__ import annotations

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


class API(Strict):
    batch_classification: BatchClassification | None = None
    """Upstream: limits of the batch classification API (vllm-sr does not serve it)."""


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


# -- router.learning ---------------------------------------------------------------------------


class LearningAdaptation(Strict):
    enabled: bool | None = None
    """Upstream: adaptation on."""

    candidate_set: str | None = None
    """Upstream: which models adaptation may pick."""

    strategy: str | None = None
    """Upstream: adaptation strategy."""


class LearningIdentityHeaders(Strict):
    session: str | None = None
    """Upstream: session id header."""

    conversation: str | None = None
    """Upstream: conversation id header."""


class LearningIdentity(Strict):
    headers: LearningIdentityHeaders | None = None
    """Upstream: where the session is read."""


class LearningTuning(Strict):
    idle_timeout_seconds: int | None = None
    """Upstream: session idle timeout."""

    min_turns_before_switch: int | None = None
    """Upstream: turns before a model switch."""

    switch_margin: float | None = None
    """Upstream: score margin for a switch."""

    stability_weight: float | None = None
    """Upstream: weight of staying."""


class LearningProtection(Strict):
    enabled: bool | None = None
    """Upstream: session protection on (keeps a conversation on its model)."""

    scope: str | None = None
    """Upstream: conversation or session."""

    identity: LearningIdentity | None = None
    """Upstream: session identity."""

    tuning: LearningTuning | None = None
    """Upstream: protection knobs."""


class LearningRedis(Strict):
    address: str | None = None
    """Upstream: Redis address."""

    password: str | None = None
    """Upstream: Redis password."""

    database: int | None = None
    """Upstream: Redis database."""

    key_prefix: str | None = None
    """Upstream: key prefix."""


class LearningStateStore(Strict):
    backend: str | None = None
    """Upstream: memory or redis."""

    ttl_seconds: int | None = None
    """Upstream: state lifetime."""

    timeout_ms: int | None = None
    """Upstream: store timeout."""

    redis: LearningRedis | None = None
    """Upstream: Redis connection."""


class RouterLearning(Strict):
    enabled: bool = False
    """Upstream: Router Learning may override the base selector per session. Only false is
    supported."""

    adaptation: LearningAdaptation | None = None
    """Upstream: adaptation settings."""

    protection: LearningProtection | None = None
    """Upstream: session protection settings."""

    state_store: LearningStateStore | None = None
    """Upstream: where learning state lives."""


# -- router.model_selection --------------------------------------------------------------------


class RouterDC(Strict):
    temperature: float | None = None
    """Upstream: contrastive temperature."""

    dimension_size: int | None = None
    """Upstream: embedding size."""

    min_similarity: float | None = None
    """Upstream: least similarity."""

    use_query_contrastive: bool | None = None
    """Upstream: query contrastive loss."""

    use_model_contrastive: bool | None = None
    """Upstream: model contrastive loss."""

    require_descriptions: bool | None = None
    """Upstream: models need descriptions."""

    use_capabilities: bool | None = None
    """Upstream: use modelCards capabilities."""


class AutoMix(Strict):
    verification_threshold: float | None = None
    """Upstream: self-verification threshold."""

    max_escalations: int | None = None
    """Upstream: most escalations."""

    cost_aware_routing: bool | None = None
    """Upstream: weigh cost."""

    cost_quality_tradeoff: float | None = None
    """Upstream: cost/quality balance."""

    discount_factor: float | None = None
    """Upstream: POMDP discount."""

    use_logprob_verification: bool | None = None
    """Upstream: verify by logprobs."""


class Hybrid(Strict):
    experience_weight: float | None = None
    """Upstream: weight."""

    router_dc_weight: float | None = None
    """Upstream: weight."""

    automix_weight: float | None = None
    """Upstream: weight."""

    cost_weight: float | None = None
    """Upstream: weight."""

    quality_gap_threshold: float | None = None
    """Upstream: quality gap threshold."""

    normalize_scores: bool | None = None
    """Upstream: normalise scores."""


class Momentum(Strict):
    enabled: bool | None = None
    """Upstream: selection momentum on."""

    attack: float | None = None
    """Upstream: attack."""

    release: float | None = None
    """Upstream: release."""

    threshold: float | None = None
    """Upstream: threshold."""


class TrainedSelector(Strict):
    """One trained selector artifact (knn, kmeans, svm, mlp): the union of their fields."""

    k: int | None = None
    """Upstream (knn): neighbours."""

    num_clusters: int | None = None
    """Upstream (kmeans): clusters."""

    efficiency_weight: float | None = None
    """Upstream (kmeans): efficiency weight."""

    kernel: str | None = None
    """Upstream (svm): kernel."""

    gamma: float | None = None
    """Upstream (svm): gamma."""

    device: str | None = None
    """Upstream (mlp): device."""

    pretrained_path: str | None = None
    """Upstream: the trained artifact."""


class TrainedSelectors(Strict):
    models_path: str | None = None
    """Upstream: artifacts' directory."""

    embedding_dim: int | None = None
    """Upstream: embedding size."""

    knn: TrainedSelector | None = None
    """Upstream: knn selector."""

    kmeans: TrainedSelector | None = None
    """Upstream: kmeans selector."""

    svm: TrainedSelector | None = None
    """Upstream: svm selector."""

    mlp: TrainedSelector | None = None
    """Upstream: mlp selector."""


class ModelSelection(Strict):
    """Global settings of upstream's learned selectors (router_dc, automix, hybrid, knn...):
    read only by decisions whose ``algorithm`` is one of them, which vllm-sr refuses."""

    method: str | None = None
    """Upstream: the default learned selector."""

    enabled: bool | None = None
    """Upstream: learned selection on."""

    router_dc: RouterDC | None = None
    """Upstream: router_dc selector settings."""

    automix: AutoMix | None = None
    """Upstream: automix selector settings."""

    hybrid: Hybrid | None = None
    """Upstream: hybrid selector weights."""

    momentum: Momentum | None = None
    """Upstream: selection momentum."""

    ml: TrainedSelectors | None = None
    """Upstream: trained selector artifacts (knn, kmeans, svm, mlp)."""
