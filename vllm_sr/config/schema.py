"""pydantic models of config.yaml (the canonical resource).

Every model forbids unknown keys and documents each field with an attribute docstring (pydantic
turns them into field descriptions, which ``vllm-sr config show --json`` and docs/config.md use).
Cross-field rules (the product page's "What replicas share", Router mode's, the recipes', and
the refusals of upstream settings vllm-sr does not act on) live in :func:`semantic_problems`
(``file_rules``), which works on the raw mapping so that a file with both field errors and rule
errors gets every problem reported in one run; the models call it too, so code that builds a
config directly gets the same checks. One deployment's models (replicas, engine arguments,
outlier detection) are in ``deployment``.

The file is upstream's v0.3 shape (``version``, ``listeners``, ``global``, ``providers``,
``routing``, ``entrypoints``, ``recipes``); ``global.model_catalog`` is optional: without
deployments the embedded default runs (:func:`embedded_default_deployments`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

from vllm_sr.config.deployment import (
    DEFAULT_ARTIFACT,
    DEFAULT_BASE_EJECTION_MS,
    DEFAULT_CONSECUTIVE_TIMEOUTS,
    DEFAULT_MAX_EJECTION_PERCENT,
    DEFAULT_TIMEOUT_MS,
    MAX_EJECTION_MS_LIMIT,
    MAX_REPLICAS,
    Deployment,
    OutlierDetection,
    Replica,
    default_max_ejection_ms,
    device_index,
    device_platform,
    ejection_bounds_problem,
)
from vllm_sr.config.fallback_policy import FallbackPolicy
from vllm_sr.config.problems import SEMANTIC_ERROR, Problem
from vllm_sr.config.recipes import (
    DEFAULT_RECIPE,
    Entrypoint,
    Listener,
    Recipe,
    normalized_names,
)
from vllm_sr.config.routing import DEFAULT_AUTO_MODEL_NAMES, Routing
from vllm_sr.config.routing_base import as_dict, rules_run_by_caller
from vllm_sr.config.routing_catalog import Admission, Evaluation, ModelBinding
from vllm_sr.config.routing_providers import Providers
from vllm_sr.config.signal_classifiers import BINDING_PREFIX
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
from vllm_sr.jsontypes import JsonObject

# A deployment's models and constants live in ``deployment``; the ones placement, kube, the
# pool and the supervisor import from here are re-exported.
__all__ = [
    "DEFAULT_ARTIFACT",
    "DEFAULT_AUTO_MODEL_NAME",
    "DEFAULT_BASE_EJECTION_MS",
    "DEFAULT_CONSECUTIVE_TIMEOUTS",
    "DEFAULT_DEPLOYMENT",
    "DEFAULT_MAX_EJECTION_PERCENT",
    "DEFAULT_TIMEOUT_MS",
    "MAX_EJECTION_MS_LIMIT",
    "MAX_REPLICAS",
    "DecisionModel",
    "Deployment",
    "GlobalSection",
    "ModelCatalog",
    "OutlierDetection",
    "Replica",
    "RootConfig",
    "Router",
    "System",
    "default_max_ejection_ms",
    "device_index",
    "device_platform",
    "ejection_bounds_problem",
    "embedded_default_deployments",
    "semantic_problems",
]

DEFAULT_DEPLOYMENT = "primary"
DEFAULT_AUTO_MODEL_NAME = "MoM"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, populate_by_name=True)


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
    """Upstream: the selectors' global settings (router_dc, automix, hybrid read them)."""

    learning: RouterLearning = Field(default_factory=RouterLearning)
    """Upstream: Router Learning (adaptation and protection; vllm_sr/router/learning)."""

    fallback: FallbackPolicy | None = None
    """v0.4: upstream's global fallback policy (refused unless enabled: false)."""

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

    safety: str | None = None
    """v0.4: the deployment whose head answers safety rules that name none."""

    hazard: str | None = None
    """v0.4: the deployment whose head answers hazard blocks that name none (unset: the safety
    rule's own head)."""

    feedback_detector: str | None = None
    """Upstream: feedback classifier path (user_feedback signals, refused)."""


class ModelCatalog(_Strict):
    deployments: dict[str, Deployment] | None = None
    """Logical deployments by name; a replica's id is <name>-<index>. Omitted: the embedded
    default, one CPU worker of vllm-sr/d3-edge named primary, unless Router mode's routing
    needs no model (then no worker runs). {}: no worker (Router mode, when nothing in the
    routing needs a deployment)."""

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

    bindings: dict[str, ModelBinding] = Field(default_factory=dict, max_length=256)
    """v0.4 metadata: model consumer -> deployment (vllm_sr/config/routing_catalog.py)."""

    admission: dict[str, Admission] = Field(default_factory=dict, max_length=256)
    """v0.4: per-deployment admission limits (refused when any is written: a worker's
    admission is its engine_args and the pool's own bounds)."""


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

    evaluation: Evaluation | None = None
    """v0.4: benchmark definitions, indices and measured records (routing_catalog.py);
    operator-rating records give model cards their quality."""

    _embedded_default: bool = PrivateAttr(default=False)

    @model_validator(mode="after")
    def _rules(self, info: ValidationInfo[object]) -> RootConfig:
        raw = self.model_dump(by_alias=True, exclude_none=True)
        # A loader that runs the rules on the raw mapping itself (``files.collect_problems``,
        # to report them with every field error in one run) says so, so they run once.
        if not rules_run_by_caller(info):
            problems = semantic_problems(raw)
            if problems:
                raise PydanticCustomError(
                    SEMANTIC_ERROR, "; ".join(p.render_plain() for p in problems)
                )
        catalog = self.global_.model_catalog
        routings = [self.routing, *(r.routing for r in self.recipes)]
        for rule in (s for rt in routings if rt is not None for s in rt.signals.safety):
            rule.bind_system(catalog.system.safety, catalog.system.hazard)
        declared = catalog.deployments or {}  # (the embedded default is no binding's)
        for rt in (r for r in routings if r is not None):
            for clf in rt.signals.classifiers:
                binding = rt.model_bindings.get(BINDING_PREFIX + clf.name)
                dep = binding.deployment if binding is not None else None
                clf.bind_deployment(dep if dep in declared else None)
        ratings = self.evaluation.operator_ratings() if self.evaluation is not None else {}
        for card in (c for rt in routings if rt is not None for c in rt.model_cards):
            card.bind_rating(ratings.get(card.name))
        if catalog.deployments is None and _needs_no_worker(raw):
            catalog.deployments = {}  # Router mode whose routing asks no model: no worker
        elif catalog.deployments is None:
            # Filled in so every consumer (plans, config show, kube) sees what runs.
            catalog.deployments = embedded_default_deployments()
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
        """The decision model's deployment, else the first declared one (the target of -dp);
        with none declared, the embedded default's name (what -dp writes into the file)."""
        dm = self.global_.model_catalog.system.decision_model
        if dm is not None:
            return dm.deployment
        return next(iter(self.deployments), DEFAULT_DEPLOYMENT)

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


def _needs_no_worker(raw: JsonObject) -> bool:
    """No deployment declared, and none is needed: Router mode, no decision model named, and
    nothing in the routing that a deployment answers (``deployment_needs``)."""
    from vllm_sr.config.deployment_needs import deployment_needs, router_mode

    catalog = as_dict(as_dict(raw.get("global")).get("model_catalog"))
    named = as_dict(catalog.get("system")).get("decision_model") is not None
    return router_mode(raw) and not named and not deployment_needs(raw)


def _with_strategy(routing: Routing, inherited: str) -> Routing:
    if "strategy" in routing.model_fields_set:
        return routing
    copy = routing.model_copy(update={"strategy": inherited})
    copy.__pydantic_fields_set__.discard("strategy")
    return copy


def semantic_problems(raw: object) -> list[Problem]:
    """Every cross-field rule and refusal of a raw config mapping (``file_rules``, which
    builds on this module's models and constants)."""
    from vllm_sr.config.file_rules import semantic_problems as rules

    return rules(raw)
