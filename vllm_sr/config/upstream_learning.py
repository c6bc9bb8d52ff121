"""Typed sub-blocks of upstream ``global.router`` that Router Learning and the learned selectors
read: ``learning`` and ``model_selection`` (upstream ``learning_config.go``,
``selection_config.go``).

Router Learning runs in Router mode (vllm_sr/router/learning): the values upstream's
``validator_learning.go`` accepts are checked by ``learning_rules`` (an unknown value is an
error naming the field, the value and what is accepted). The selectors' globals are
read only by decisions whose ``algorithm`` is a learned selector, which vllm-sr refuses; they
are typed so a misspelled key is still an error with its path and line.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vllm_sr.config.learning_rules import CandidateSetField
from vllm_sr.config.routing_base import Strict

# -- router.learning ---------------------------------------------------------------------------


class LearningAdaptation(Strict):
    enabled: bool | None = None
    """Online model-choice learning (omitted: on when learning is on)."""

    candidate_set: CandidateSetField | None = None
    """Which models adaptation may pick: decision (the matched decision's modelRefs, the
    default), tier (every decision of the same tier), global (every deployed model)."""

    strategy: str | None = Field(default=None, max_length=64)
    """The adaptation strategy: routing_sampling (the default and only one)."""


class LearningIdentityHeaders(Strict):
    session: str | None = Field(default=None, max_length=128)
    """The request header naming the session (default x-session-id)."""

    conversation: str | None = Field(default=None, max_length=128)
    """The request header naming the conversation (default x-conversation-id)."""


class LearningIdentity(Strict):
    headers: LearningIdentityHeaders | None = None
    """Where protection reads the client's identity."""


class ProgressGate(Strict):
    enabled: bool | None = None
    """Upstream v0.4: gate switches on measured progress (refused when true)."""

    mode: Literal["observe", "enforce"] | None = None
    """Upstream: observe or enforce."""

    calibration_id: str | None = None
    """Upstream: calibration."""

    window_size: int | None = Field(default=None, ge=1, le=256)
    """Upstream: outcomes per window."""

    window_ttl_seconds: int | None = Field(default=None, ge=1, le=86400)
    """Upstream: a window's lifetime."""

    min_window_outcomes: int | None = Field(default=None, ge=0)
    """Upstream: outcomes before it acts."""

    min_consecutive_regressions: int | None = Field(default=None, ge=0)
    """Upstream: regressions before a switch."""

    min_consecutive_recoveries: int | None = Field(default=None, ge=0)
    """Upstream: recoveries before a switch back."""

    cooldown_seconds: float | None = Field(default=None, ge=0)
    """Upstream: time between switches."""

    max_switches_per_window: int | None = Field(default=None, ge=0, le=256)
    """Upstream: switch budget."""


class LearningTuning(Strict):
    idle_timeout_seconds: int | None = Field(default=None, ge=0)
    """Seconds without a turn after which a conversation starts over (default 300; 0: never)."""

    min_turns_before_switch: int | None = Field(default=None, ge=0)
    """Turns a conversation stays on its model before a switch may be considered (default 1)."""

    switch_margin: float | None = Field(default=None, ge=0)
    """How much a new model's score must beat the current one's by (default 0.05)."""

    stability_weight: float | None = Field(default=None, ge=0)
    """Scales the costs of switching (handoff, prefix cache, switch history; default 1)."""

    progress_gate: ProgressGate | None = None
    """Upstream v0.4: switches gated on measured progress (refused when enabled)."""


class LearningProtection(Strict):
    enabled: bool | None = None
    """Stability protection: keeps a conversation on its model (omitted: on when learning is
    on)."""

    scope: str | None = Field(default=None, max_length=32)
    """conversation (session and conversation headers, the default) or session (the session
    header alone: the whole session stays on its model)."""

    identity: LearningIdentity | None = None
    """Where the identity is read."""

    tuning: LearningTuning | None = None
    """Protection knobs."""


class LearningRedis(Strict):
    address: str | None = Field(default=None, max_length=256)
    """host:port of the Redis server (required with the redis backend)."""

    password: str | None = None
    """Redis password."""

    database: int | None = Field(default=None, ge=0)
    """Redis database number (default 0)."""

    key_prefix: str | None = Field(default=None, max_length=256)
    """Prefix of the conversation keys (default vsr:router-session:v1:)."""


class LearningStateStore(Strict):
    backend: str | None = Field(default=None, max_length=32)
    """local (in this process, the default) or redis (conversations shared by routers)."""

    ttl_seconds: int | None = Field(default=None, ge=0)
    """How long a conversation's state lives after its last turn (omitted or 0: 24 h)."""

    timeout_ms: int | None = Field(default=None, ge=0)
    """The redis store's timeout per operation (default 50 ms; slower counts as down)."""

    redis: LearningRedis | None = None
    """Redis connection (redis backend)."""


class RouterLearning(Strict):
    enabled: bool = False
    """Router Learning: adaptation and protection may change the decision's model per
    conversation (docs/router.md, "Router Learning")."""

    adaptation: LearningAdaptation | None = None
    """Adaptation settings."""

    protection: LearningProtection | None = None
    """Protection settings."""

    state_store: LearningStateStore | None = None
    """Where learning state lives."""


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

    model_type: str | None = None
    """Upstream v0.4: the trained selector family (its algorithms are refused)."""

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
    """Global settings of upstream's selectors: ``router_dc``, ``automix`` and ``hybrid`` are
    read by those decisions as upstream reads them (vllm_sr/router/selection); ``ml`` names the
    trained selectors' artifacts (knn, kmeans, svm, mlp: refused)."""

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
