"""pydantic models of config.yaml (the canonical resource).

Every model forbids unknown keys and documents each field with an attribute docstring (pydantic
turns them into field descriptions, which ``vllm-sr config show --json`` and docs/config.md use).
Cross-field rules (the product page's "What replicas share", Router mode's, the recipes', and
the refusals of upstream settings vllm-sr does not act on) live in :func:`semantic_problems`
(``file_rules``), which works on the raw mapping so that a file with both field errors and rule
errors gets every problem reported in one run; the models call it too, so code that builds a
config directly gets the same checks.

The file is upstream's v0.3 shape (``version``, ``listeners``, ``global``, ``providers``,
``routing``, ``entrypoints``, ``recipes``); ``global.model_catalog`` is optional: without
deployments the embedded default runs (:func:`embedded_default_deployments`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, model_validator
from pydantic_core import PydanticCustomError

from vllm_sr.config.problems import SEMANTIC_ERROR, Problem
from vllm_sr.config.recipes import (
    DEFAULT_RECIPE,
    Entrypoint,
    Listener,
    Recipe,
    normalized_names,
)
from vllm_sr.config.routing import DEFAULT_AUTO_MODEL_NAMES, Providers, Routing
from vllm_sr.config.upstream_catalog import Embeddings, ExternalModel, KnowledgeBase
from vllm_sr.config.upstream_global import (
    Integrations,
    RoutingStrategy,
    Services,
    SkipProcessing,
    StreamedBody,
)
from vllm_sr.config.upstream_learning import ModelSelection, RouterLearning
from vllm_sr.config.upstream_modules import Modules
from vllm_sr.config.upstream_stores import Stores
from vllm_sr.endpoint import ENDPOINT_ACCEPTED, endpoint_problem

DEVICE_RE = re.compile(r"^(cpu|rocm:(0|[1-9][0-9]{0,3})|cuda:(0|[1-9][0-9]{0,3}))$")
DEVICE_ACCEPTED = "cpu, rocm:N or cuda:N (N a GPU index, e.g. rocm:0)"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
NAME_ACCEPTED = "1-63 characters: letters, digits, '_', '.', '-', starting with a letter or digit"
MAX_REPLICAS = 64
MAX_THREADS = 1024
MAX_EJECTION_MS_LIMIT = 3_600_000
DEFAULT_TIMEOUT_MS = 30_000
# Outlier detection defaults: their one home (the pool's settings read them from here).
DEFAULT_CONSECUTIVE_TIMEOUTS = 3
DEFAULT_BASE_EJECTION_MS = 30_000
DEFAULT_MAX_EJECTION_PERCENT = 50
DEFAULT_ARTIFACT = "vllm-sr/d3-edge"
DEFAULT_DEPLOYMENT = "primary"
DEFAULT_AUTO_MODEL_NAME = "MoM"

Platform = Literal["cpu", "rocm", "cuda"]


def device_platform(device: str) -> str:
    """``rocm:1`` -> ``rocm``; ``cpu`` -> ``cpu``."""
    return device.split(":", 1)[0]


def device_index(device: str) -> int | None:
    """``rocm:1`` -> 1; ``cpu`` -> None."""
    _, _, idx = device.partition(":")
    return int(idx) if idx else None


def _check_device(v: str) -> str:
    if not DEVICE_RE.match(v):
        raise PydanticCustomError(
            "device_grammar",
            "'{value}' is not a device; accepted: " + DEVICE_ACCEPTED,
            {"value": v},
        )
    return v


def _check_endpoint(v: str) -> str:
    reason = endpoint_problem(v)
    if reason is not None:
        raise PydanticCustomError(
            "endpoint_grammar",
            "'{value}' is not an endpoint: {reason}; accepted: " + ENDPOINT_ACCEPTED,
            {"value": v, "reason": reason},
        )
    return v


DeviceStr = Annotated[str, AfterValidator(_check_device)]
EndpointStr = Annotated[str, AfterValidator(_check_endpoint)]


def default_max_ejection_ms(base_ejection_ms: int) -> int:
    """max_ejection_ms left unset: ten times the base, at most an hour."""
    return min(10 * base_ejection_ms, MAX_EJECTION_MS_LIMIT)


def ejection_bounds_problem(base_ejection_ms: int, max_ejection_ms: int | None) -> str | None:
    """The one cross-field check of outlier_detection: max may not be below base."""
    if max_ejection_ms is not None and max_ejection_ms < base_ejection_ms:
        return (
            f"max_ejection_ms {max_ejection_ms} is below base_ejection_ms {base_ejection_ms}; "
            f"accepted: a value >= base_ejection_ms (and at most {MAX_EJECTION_MS_LIMIT})"
        )
    return None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, populate_by_name=True)


class EngineArgs(_Strict):
    max_num_seqs: int | None = Field(default=None, ge=1, le=65536)
    """Most rows one forward batches together. Unset: the worker's default. Set it to give
    every replica the same limit; a replica reporting another value is kept out of dispatch."""

    max_num_batched_tokens: int | None = Field(default=None, ge=1, le=16_777_216)
    """Most tokens one forward batches together. Unset: each worker calibrates its own budget at
    startup, so replicas may report different values."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Precision of the forward. auto (default): on a GPU bfloat16 where the device has it,
    else float16; on a CPU bfloat16 when it has native bf16 (AMX or AVX512-BF16), else
    float32. An explicit value is honoured (a slow one is warned about). Every replica reports
    the dtype it resolved; one that differs from its peers is kept out of dispatch."""


class OutlierDetection(_Strict):
    consecutive_timeouts: int = Field(default=DEFAULT_CONSECUTIVE_TIMEOUTS, ge=0, le=1000)
    """Exchanges in a row that run past their deadline before a replica is ejected; 0 = off."""

    base_ejection_ms: int = Field(default=DEFAULT_BASE_EJECTION_MS, ge=1, le=MAX_EJECTION_MS_LIMIT)
    """First ejection's length in ms; each repeat doubles it up to max_ejection_ms."""

    max_ejection_ms: int | None = Field(default=None, ge=1, le=MAX_EJECTION_MS_LIMIT)
    """Longest ejection in ms. Default: ten times base_ejection_ms, at most 3600000 (an hour).
    Must not be below base_ejection_ms."""

    max_ejection_percent: int = Field(default=DEFAULT_MAX_EJECTION_PERCENT, ge=0, le=100)
    """Most replicas (percent) out at once; one may always be out."""

    @model_validator(mode="after")
    def _fill_max(self) -> OutlierDetection:
        problem = ejection_bounds_problem(self.base_ejection_ms, self.max_ejection_ms)
        if problem is not None:
            raise PydanticCustomError(SEMANTIC_ERROR, problem)
        if self.max_ejection_ms is None:
            self.max_ejection_ms = default_max_ejection_ms(self.base_ejection_ms)
        return self


class Replica(_Strict):
    device: DeviceStr | None = None
    """Managed worker placement: cpu, rocm:N or cuda:N. N is a host GPU index, or, when the
    process was given GPUs (a *_VISIBLE_DEVICES variable set, or a Kubernetes pod), an
    allocation ordinal into them."""

    endpoint: EndpointStr | None = None
    """Attached runtime URL (http://HOST:PORT or unix:/path); the runtime manages itself."""

    model: str | None = None
    """Served model name of an attached replica (required with endpoint)."""

    @property
    def attached(self) -> bool:
        return self.endpoint is not None


class Deployment(_Strict):
    provider: Literal["model_runtime"] = "model_runtime"
    """Who runs the workers; only model_runtime (vllm-sr's own workers) exists."""

    artifact: str = Field(default=DEFAULT_ARTIFACT, min_length=1, max_length=512)
    """Model artifact: a built-in name such as vllm-sr/d3-edge, vllm-sr/NAME for a model
    installed under the artifacts directory (host setting artifacts_dir), or a local directory."""

    revision: str | None = Field(default=None, max_length=128)
    """Artifact revision; every replica uses the same one."""

    engine_args: EngineArgs = Field(default_factory=EngineArgs)
    """Batch limits and precision shared by every replica (see EngineArgs)."""

    timeout_ms: int = Field(default=DEFAULT_TIMEOUT_MS, ge=1, le=3_600_000)
    """Deadline of one exchange with a worker, in ms (default 30000); a caller's deadline can be
    shorter. An exchange past it counts toward outlier ejection."""

    hang_after_ms: int | None = Field(default=None, ge=1000, le=86_400_000)
    """A managed worker whose forward has run longer than this (its own /health says so) is
    hung: the supervisor restarts it. Default: max(3 x timeout_ms, 10000)."""

    threads: int | None = Field(default=None, ge=1, le=MAX_THREADS)
    """Intra-op threads of each of this deployment's CPU workers (--threads writes it; point it
    at the count the adaptive learner reports). Capped at the CPU budget; takes precedence over
    VLLM_SRUN_CPU_THREADS for this deployment. Unset: VLLM_SRUN_CPU_THREADS, else half the
    budget. Refused on GPU deployments and on deployments with only attached replicas."""

    replicas: list[Replica] | None = Field(default=None, min_length=1, max_length=MAX_REPLICAS)
    """Independent workers, each with its own copy of the weights (at most 64). Not to be
    combined with a deployment-level device or endpoint."""

    device: DeviceStr | None = None
    """One-worker shorthand: the device of the single managed worker. Omitting replicas,
    device and endpoint means one CPU worker."""

    endpoint: EndpointStr | None = None
    """One-worker shorthand: the URL of a single attached runtime."""

    model: str | None = None
    """With the endpoint shorthand: the attached runtime's served model name."""

    outlier_detection: OutlierDetection = Field(default_factory=OutlierDetection)
    """Ejection of replicas that keep timing out (every field optional)."""

    def effective_replicas(self) -> list[Replica]:
        """The canonical replica list: the authored one, or the shorthand as one replica."""
        if self.replicas:
            return list(self.replicas)
        if self.endpoint is not None:
            return [Replica(endpoint=self.endpoint, model=self.model)]
        return [Replica(device=self.device or "cpu")]

    @property
    def platform(self) -> str | None:
        """cpu, rocm or cuda for managed workers; None when every replica is attached."""
        for r in self.effective_replicas():
            if r.device is not None:
                return device_platform(r.device)
        return None


class Router(_Strict):
    enabled: bool = True
    """Routing consumers on. Engine mode (-e / --engine) writes false."""

    auto_model_names: list[str] = Field(default_factory=list, max_length=16)
    """Chat model names that mean "route this request" (the default recipe). Omitted:
    vllm-sr/auto, auto and auto_model_name, as upstream; [] means none (only entrypoints
    route)."""

    auto_model_name: str = Field(default=DEFAULT_AUTO_MODEL_NAME, min_length=1, max_length=128)
    """Upstream's single alias (default MoM): joins the default alias list when
    auto_model_names is omitted."""

    strategy: RoutingStrategy = "priority"
    """How the winner among matching decisions is chosen when a routing profile does not say
    (routing.strategy overrides): priority or confidence."""

    config_source: str | None = None
    """Upstream: file or kubernetes; vllm-sr reads its file (only file is supported)."""

    include_config_models_in_list: bool | None = None
    """Upstream: list provider models in /v1/models (accepted; vllm-sr's /v1/models lists
    what it serves)."""

    clear_route_cache: bool | None = None
    """Upstream: Envoy route cache clearing (deployment; no effect here)."""

    streamed_body: StreamedBody = Field(default_factory=StreamedBody)
    """Upstream: Envoy body streaming (deployment; vllm-sr reads whole bodies)."""

    skip_processing: SkipProcessing = Field(default_factory=SkipProcessing)
    """Upstream: the x-vsr-skip-processing pass-through (refused when enabled)."""

    model_selection: ModelSelection = Field(default_factory=ModelSelection)
    """Upstream: learned selectors' global settings (read only by refused algorithms)."""

    learning: RouterLearning = Field(default_factory=RouterLearning)
    """Upstream: Router Learning (refused when enabled)."""

    @model_validator(mode="after")
    def _default_aliases(self) -> Router:
        if "auto_model_names" not in self.model_fields_set:
            self.auto_model_names = [*DEFAULT_AUTO_MODEL_NAMES, self.auto_model_name]
        self.auto_model_names = normalized_names(self.auto_model_names)
        return self


class DecisionModel(_Strict):
    deployment: str
    """The deployment that serves the decision model; -dp and MODEL act on it."""


class System(_Strict):
    decision_model: DecisionModel | None = None
    """Where routing decisions are computed; default: the first declared deployment (the
    embedded primary when none is declared)."""

    prompt_guard: str | None = None
    """Upstream: jailbreak classifier path (jailbreak signals, refused)."""

    domain_classifier: str | None = None
    """Upstream: domain classifier path (vllm-sr's domains use its deployment)."""

    pii_classifier: str | None = None
    """Upstream: PII classifier path (pii signals, refused)."""

    fact_check_classifier: str | None = None
    """Upstream: fact-check classifier path (fact_check signals, refused)."""

    hallucination_detector: str | None = None
    """Upstream: hallucination detector path (hallucination plugin, refused)."""

    hallucination_explainer: str | None = None
    """Upstream: NLI explainer path (hallucination plugin, refused)."""

    feedback_detector: str | None = None
    """Upstream: feedback classifier path (user_feedback signals, refused)."""


class ModelCatalog(_Strict):
    deployments: dict[str, Deployment] | None = Field(default=None, min_length=1)
    """Logical deployments by name; a replica's id is <name>-<index>. Omitted: the embedded
    default, one CPU worker of vllm-sr/d3-edge named primary."""

    system: System = Field(default_factory=System)
    """System models and the deployments that serve them."""

    embeddings: Embeddings = Field(default_factory=Embeddings)
    """Upstream: embedding models and matching options (docs/router.md, "Upstream fields
    outside routing and providers")."""

    external: list[ExternalModel] = Field(default_factory=list)
    """Upstream: LLMs for llm classifiers and remote guards (used by refused families)."""

    kbs: list[KnowledgeBase] = Field(default_factory=list)
    """Upstream: knowledge bases (kb signals, refused)."""

    modules: Modules = Field(default_factory=Modules)
    """Upstream: classifier modules and prompt compression (refused when on)."""


class GlobalSection(_Strict):
    router: Router = Field(default_factory=Router)
    """Routing front settings."""

    services: Services = Field(default_factory=Services)
    """Upstream services: authz identity headers (acted on), the rest deployment or refused."""

    stores: Stores = Field(default_factory=Stores)
    """Upstream stores: response cache, memory, vector store."""

    integrations: Integrations = Field(default_factory=Integrations)
    """Upstream integrations: the tool database and the looper endpoint."""

    model_catalog: ModelCatalog = Field(default_factory=ModelCatalog)
    """Deployments and system models (optional: the embedded default when omitted)."""


def embedded_default_deployments() -> dict[str, Deployment]:
    """What runs when no deployment is declared: d3-edge on one CPU worker (what ``vllm-sr
    serve`` writes into a new config)."""
    return {
        DEFAULT_DEPLOYMENT: Deployment(artifact=DEFAULT_ARTIFACT, replicas=[Replica(device="cpu")])
    }


class RootConfig(_Strict):
    version: str | None = Field(default=None, max_length=32)
    """Upstream's schema version (v0.3); metadata."""

    listeners: list[Listener] = Field(default_factory=list, max_length=64)
    """Where to listen: ``vllm-sr serve`` takes the first one unless --listen is given."""

    global_: GlobalSection = Field(default_factory=GlobalSection, alias="global")
    """Deployments, system models and the router's switches."""

    providers: Providers | None = None
    """OpenAI-compatible LLM backends that chat requests go to (Router mode)."""

    routing: Routing | None = None
    """Signals and decisions (Router mode): the recipe ``default``."""

    entrypoints: list[Entrypoint] = Field(default_factory=list, max_length=256)
    """Request model names that select a recipe."""

    recipes: list[Recipe] = Field(default_factory=list, max_length=256)
    """Named routing profiles beside the default one."""

    _embedded_default: bool = PrivateAttr(default=False)

    @model_validator(mode="after")
    def _rules(self) -> RootConfig:
        problems = semantic_problems(self.model_dump(by_alias=True, exclude_none=True))
        if problems:
            raise PydanticCustomError(SEMANTIC_ERROR, "; ".join(p.render_plain() for p in problems))
        if self.global_.model_catalog.deployments is None:
            # Filled in so every consumer (plans, config show, kube) sees what runs.
            self.global_.model_catalog.deployments = embedded_default_deployments()
            self._embedded_default = True
        return self

    @property
    def deployments(self) -> dict[str, Deployment]:
        """The declared deployments, or the embedded default when none is declared."""
        deps = self.global_.model_catalog.deployments
        return deps if deps is not None else embedded_default_deployments()

    @property
    def uses_embedded_default(self) -> bool:
        """True when the file declares no deployment and the embedded default runs (the
        decision model is vllm-sr/d3-edge on one CPU worker)."""
        return self._embedded_default or self.global_.model_catalog.deployments is None

    def default_deployment(self) -> str:
        """The decision model's deployment, else the first declared one (the target of -dp)."""
        dm = self.global_.model_catalog.system.decision_model
        if dm is not None:
            return dm.deployment
        return next(iter(self.deployments))

    def listen_address(self) -> tuple[str, int] | None:
        """(address, port) of the first listener, or None when there is none."""
        if not self.listeners:
            return None
        return self.listeners[0].address, self.listeners[0].port

    def recipes_by_name(self) -> dict[str, Routing]:
        """Every recipe's routing by name, ``default`` first, each with its effective
        strategy (its own, else the top-level routing's, else global.router.strategy)."""
        top = self.routing
        base = self.global_.router.strategy
        if top is not None and "strategy" in top.model_fields_set:
            base = top.strategy
        out: dict[str, Routing] = {}
        named = {r.name: r.routing for r in self.recipes}
        default = named.pop(DEFAULT_RECIPE, None) or top or Routing()
        out[DEFAULT_RECIPE] = _with_strategy(default, self.global_.router.strategy)
        for name, routing in named.items():
            out[name] = _with_strategy(routing, base)
        return out

    def recipe_name_for(self, model_name: str) -> str | None:
        """The recipe a request ``model`` selects: ``default`` for an auto alias, an
        entrypoint's recipe for its names; None for a concrete model name."""
        name = model_name.strip()
        if name in self.global_.router.auto_model_names:
            return DEFAULT_RECIPE
        for entry in self.entrypoints:
            if name in normalized_names(entry.model_names):
                return entry.recipe.strip()
        return None

    def recipe_for(self, model_name: str) -> Routing | None:
        """The routing a request ``model`` selects (see recipe_name_for); None for a concrete
        model (forwarded without signals or decisions)."""
        recipe = self.recipe_name_for(model_name)
        return None if recipe is None else self.recipes_by_name().get(recipe)


def _with_strategy(routing: Routing, inherited: str) -> Routing:
    if "strategy" in routing.model_fields_set:
        return routing
    copy = routing.model_copy(update={"strategy": inherited})
    copy.__pydantic_fields_set__.discard("strategy")
    return copy


def semantic_problems(raw: Any) -> list[Problem]:
    """Every cross-field rule and refusal of a raw config mapping (``file_rules``, which
    builds on this module's models and constants)."""
    from vllm_sr.config.file_rules import semantic_problems as rules

    return rules(raw)
