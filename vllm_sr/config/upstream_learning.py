"""Typed sub-blocks of upstream ``global.router`` that only Router Learning and the learned
selectors read: ``learning`` and ``model_selection`` (upstream ``learning_config.go``,
``selection_config.go``).

Neither changes what vllm-sr does: Router Learning is refused when enabled, and the selectors'
globals are read only by decisions whose ``algorithm`` is a learned selector, which vllm-sr
refuses; they are typed so a misspelled key is still an error with its path and line.
"""

from __future__ import annotations

from vllm_sr.config.routing_base import Strict

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
