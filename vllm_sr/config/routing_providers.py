"""pydantic models of the top-level ``providers:`` section, with upstream's fields; its rules
on raw mappings (:func:`providers_problems`) live in ``routing_provider_rules``.

Field names and meanings follow the upstream vLLM Semantic Router (``C/canonical_providers.go``):
``defaults`` (model, reasoning_effort, reasoning_families; v0.4's names of default_model and
default_reasoning_effort, both read: ``renames``) and ``models[]``
(reasoning_family, provider_model_id, external_model_ids, api_format, pricing, reliability,
backend_refs[]). What vllm-sr does not act on is refused by name (see routing_base): Anthropic
wire format, provider profiles other than OpenAI-compatible ones, chat_path / api_version /
extra_headers, retry_on conditions its backends cannot meet, and models with no backend.
``router/backends.py`` acts on the rest (weights, ``reliability``, credentials, the model name
per backend type)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

from vllm_sr.config.deployment import EjectionPercent
from vllm_sr.config.problems import SEMANTIC_ERROR
from vllm_sr.config.renames import PROVIDER_DEFAULTS, both_names_error, current_name
from vllm_sr.config.routing_base import Strict, raise_first, rules_run_by_caller
from vllm_sr.config.routing_provider_rules import (
    ENDPOINT_RE,
    FAMILY_TYPES,
    go_duration_s,
    providers_problems,
    retry_on_words,
)

HEADER_NAME_RE = r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$"
DEFAULT_ENDPOINT_TYPE = "vllm"
REASONING_FAMILY_TYPES = ("chat_template_kwargs", "reasoning_effort", "top_level_reasoning_effort")


class BackendRef(Strict):
    name: str | None = Field(default=None, min_length=1, max_length=128)
    """The backend's name, unique within its model (upstream's endpoint id is
    ``<model>_<name>``; default ``primary`` for the first, ``backend-<i+1>`` after)."""

    endpoint: str | None = Field(default=None, max_length=300)
    """An OpenAI-compatible server as HOST[:PORT] (the API lives under /v1). A scheme
    (http:// or https://) sets the protocol; a path is ignored, as upstream does; the port
    defaults to 443 with https, else 80."""

    base_url: str | None = Field(default=None, max_length=2000)
    """Or the server's API root as a URL, e.g. https://host/v1 (chat goes to
    BASE_URL/chat/completions)."""

    protocol: Literal["http", "https"] | None = None
    """The scheme for ``endpoint`` (default http)."""

    weight: int = Field(default=0, ge=0, le=1_000_000)
    """The share of the model's chats this backend gets among the healthy ones (0 counts as
    1, as upstream)."""

    type: str | None = Field(default=None, min_length=1, max_length=64)
    """The endpoint type: the key into the model's ``external_model_ids`` (default: the
    ``provider``, else ``vllm``)."""

    provider: str | None = Field(default=None, min_length=1, max_length=64)
    """The provider profile: ``openai`` (an OpenAI-compatible API; the credential defaults to
    ``Authorization: Bearer <key>``)."""

    auth_header: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=HEADER_NAME_RE
    )
    """The header carrying the credential (default Authorization)."""

    auth_prefix: str | None = Field(default=None, max_length=64)
    """What precedes the key in that header (default by provider: ``Bearer``; empty counts as
    unset, as upstream)."""

    api_key: str | None = Field(default=None, min_length=1, max_length=4096)
    """The credential itself (wins over api_key_env). Never written to logs."""

    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """Name of the environment variable holding the credential; it is read at startup and
    never written to logs or the config. With neither key, nothing is added."""

    chat_path: str | None = Field(default=None, max_length=300)
    """Upstream: the chat path under the server (vllm-sr: only /chat/completions)."""

    api_version: str | None = Field(default=None, max_length=64)
    """Upstream: Azure's api-version query parameter (refused by vllm-sr)."""

    extra_headers: dict[str, str] | None = None
    """Upstream: headers added to every request to this backend (refused by vllm-sr)."""

    @property
    def scheme(self) -> str:
        """http or https: the endpoint's own scheme, else ``protocol``, else http."""
        m = ENDPOINT_RE.match(self.endpoint or "")
        if m and m.group("scheme"):
            return m.group("scheme")
        return self.protocol or "http"

    def api_base(self) -> str:
        """The API root without a trailing slash: SCHEME://HOST:PORT/v1 or base_url."""
        if self.base_url is not None:
            return self.base_url.rstrip("/")
        m = ENDPOINT_RE.match(self.endpoint or "")
        if m is None:  # the rules refuse such a config; keep the raw text for messages
            return f"{self.scheme}://{self.endpoint}/v1"
        port = m.group("port") or ("443" if self.scheme == "https" else "80")
        return f"{self.scheme}://{m.group('host')}:{port}/v1"

    @property
    def endpoint_type(self) -> str:
        """Upstream's endpoint type: ``type``, else ``provider``, else ``vllm``."""
        return self.type or self.provider or DEFAULT_ENDPOINT_TYPE

    @property
    def effective_weight(self) -> int:
        """``weight`` with 0 read as 1 (upstream)."""
        return self.weight or 1

    def endpoint_name(self, model: str, index: int) -> str:
        """Upstream's endpoint id: ``<model>_<name>``, ``<model>_primary`` for an unnamed
        first backend, ``<model>_backend-<index+1>`` for a later one."""
        suffix = self.name or ("primary" if index == 0 else f"backend-{index + 1}")
        return f"{model}_{suffix}"


class ModelPricing(Strict):
    currency: str | None = Field(default=None, min_length=1, max_length=8)
    """The prices' currency (default USD when any price is set)."""

    prompt_per_1m: float = Field(default=0.0, ge=0.0)
    """Price per million prompt tokens."""

    completion_per_1m: float = Field(default=0.0, ge=0.0)
    """Price per million completion tokens."""

    cached_input_per_1m: float = Field(default=0.0, ge=0.0)
    """Price per million cached prompt tokens."""

    cache_write_per_1m: float | None = Field(default=None, ge=0.0)
    """Price per million prompt tokens written to the provider's cache."""

    @property
    def configured(self) -> bool:
        """Upstream's rule: any price, or a currency alone (a free model)."""
        return bool(
            self.prompt_per_1m
            or self.completion_per_1m
            or self.cached_input_per_1m
            or self.cache_write_per_1m is not None
            or self.currency
        )


class ProviderReliability(Strict):
    """Upstream's Envoy data-plane settings, acted on by vllm-sr's router (docs/router.md
    "Retries, ejection and health checks"): the spread (lb_policy), retries on another backend
    of the model before the first byte (retry_count, retry_on; router/backend_retry.py),
    ejection after consecutive 5xx (router/backend_outlier.py) and the active health check."""

    lb_policy: Literal["round_robin", "least_request"] | None = None
    """How chats spread over the model's healthy backends, by backend_refs[].weight:
    least_request (and omitted): the fewest chats in flight per unit of weight first, a
    weighted round robin breaking ties; round_robin: the plain weighted round robin."""

    retry_count: int = Field(default=0, ge=0, le=5)
    """How many times a chat whose backend failed before the first byte is sent to another
    usable backend of the same model (0-5; 0: never), before any fallback to another model."""

    retry_on: str | None = Field(default=None, min_length=1, max_length=300)
    """Envoy's comma list of the failures retried (required when retry_count > 0): 5xx,
    gateway-error, reset, connect-failure, refused-stream."""

    consecutive_5xx: int = Field(default=0, ge=0)
    """Eject a backend after this many chats in a row answered 5xx or could not reach it
    (0, the default: no ejection; as upstream, only for a model with two or more backends)."""

    base_ejection_time: str | None = Field(default=None, max_length=64)
    """How long an ejection lasts, times the number of times that backend was ejected (a Go
    duration, default 30s; at most 300s or this, whichever is longer, as Envoy)."""

    max_ejection_percent: EjectionPercent = 50
    """The most of the model's backends ejected at once, in percent of them rounded down
    (default 50, as upstream; one backend always stays)."""

    health_check_path: str | None = Field(default=None, min_length=1, max_length=300)
    """The active health check's path on the backend's server, e.g. /health (default: the
    API's /models, e.g. /v1/models)."""

    health_check_interval: str | None = Field(default=None, max_length=64)
    """How often a healthy backend is checked (a Go duration, default 5s)."""

    health_check_timeout: str | None = Field(default=None, max_length=64)
    """How long a check may take before it counts as failed (a Go duration, default 3s)."""

    @property
    def retry_on_words(self) -> list[str]:
        """``retry_on`` as its words (none when unset)."""
        return retry_on_words(self.retry_on or "")


def seconds_or(value: str | None, default: float) -> float:
    """A reliability duration (``"30s"``) in seconds, ``default`` when unset."""
    parsed = None if value is None else go_duration_s(value)
    return default if parsed is None else parsed


class ModelReasoning(Strict):
    """v0.4's ``providers.models[].reasoning``: a family by name, or the family inline. vllm-sr
    acts on ``family`` (a ``defaults.reasoning_families`` key, as ``reasoning_family``) and on
    an inline ``type`` + ``parameter``; ``levels``, ``modes`` and ``default_mode`` are metadata;
    ``type: reasoning_mode``, ``activation_parameter``, ``effort_flags``, ``default`` and
    ``disabled`` are refused by name (routing_provider_rules)."""

    family: str | None = Field(default=None, min_length=1, max_length=64)
    """A ``defaults.reasoning_families`` key (upstream: also its built-in families)."""

    type: str | None = None
    """Inline: chat_template_kwargs, reasoning_effort, top_level_reasoning_effort (as a
    family's type); reasoning_mode is refused."""

    parameter: str | None = Field(default=None, min_length=1, max_length=128)
    """Inline: the JSON key set."""

    activation_parameter: str | None = None
    """Upstream: a separate on/off key (refused)."""

    effort_flags: dict[str, str] = Field(default_factory=dict)
    """Upstream: one flag per effort (refused)."""

    levels: list[str] = Field(default_factory=list)
    """Upstream: the efforts the model takes (metadata)."""

    default: str | None = None
    """Upstream: the model's own default effort (refused: providers.defaults.reasoning_effort
    and modelRefs' reasoning_effort decide)."""

    modes: list[str] = Field(default_factory=list)
    """Upstream: enabled, disabled, adaptive (metadata)."""

    default_mode: str | None = None
    """Upstream: the default mode (metadata)."""

    disabled: str | None = None
    """Upstream: the value sent to switch reasoning off (refused)."""


class ProviderModel(Strict):
    name: str = Field(min_length=1, max_length=128, pattern=r"^\S+$")
    """The model's name: what decisions' modelRefs and callers' ``model`` use."""

    reasoning_family: str | None = Field(default=None, min_length=1, max_length=64)
    """A ``defaults.reasoning_families`` key: how this model's reasoning is switched (§6)."""

    reasoning: ModelReasoning | None = None
    """v0.4's form of ``reasoning_family``: ``{family}`` or an inline ``{type, parameter}``
    (see ModelReasoning); not both with reasoning_family."""

    catalog: str | None = Field(default=None, max_length=256)
    """v0.4: a built-in model catalog entry (refused: vllm-sr has no built-in catalog; write
    the model's fields and ``reasoning`` inline)."""

    provider_model_id: str | None = Field(default=None, min_length=1, max_length=256)
    """The model name the backends expect in ``model`` (default: name)."""

    external_model_ids: dict[str, str] | None = None
    """Endpoint type -> the model name that type of backend expects; when set it replaces
    provider_model_id (a backend whose type has no entry gets ``name``), as upstream."""

    api_format: str | None = Field(default=None, min_length=1, max_length=32)
    """The backends' wire format: ``openai`` (the default; the only one vllm-sr speaks)."""

    pricing: ModelPricing | None = None
    """Prices (reported in the inventory and /v1/models; for cost-aware algorithms)."""

    reliability: ProviderReliability | None = None
    """Upstream's load-balancing, retry and health settings (see ProviderReliability)."""

    backend_refs: list[BackendRef] = Field(default_factory=list, max_length=64)
    """The servers that serve this model; a request goes to a healthy one."""

    @property
    def family_name(self) -> str | None:
        """The ``defaults.reasoning_families`` key: reasoning_family, else reasoning.family."""
        if self.reasoning_family is not None:
            return self.reasoning_family
        return self.reasoning.family if self.reasoning is not None else None

    @property
    def inline_family(self) -> ReasoningFamily | None:
        """v0.4's inline ``reasoning{type, parameter}`` as a family (None when not inline or
        not one vllm-sr acts on; the config rules refuse those)."""
        r = self.reasoning
        if r is None or r.type not in FAMILY_TYPES or r.parameter is None:
            return None
        return ReasoningFamily.model_validate({"type": r.type, "parameter": r.parameter})

    @property
    def backend_model(self) -> str:
        """The ``model`` sent to a backend when external_model_ids is not set."""
        return self.provider_model_id or self.name

    def model_id_for(self, ref: BackendRef) -> str:
        """The ``model`` sent to backend ``ref`` (upstream's ResolveExternalModelID):
        external_model_ids[ref.endpoint_type] when external_model_ids is set (else name),
        otherwise provider_model_id, otherwise name."""
        if self.external_model_ids:
            return self.external_model_ids.get(ref.endpoint_type) or self.name
        return self.backend_model


class ReasoningFamily(Strict):
    type: Literal["chat_template_kwargs", "reasoning_effort", "top_level_reasoning_effort"]
    """How reasoning is switched: chat_template_kwargs[parameter] = true/false; a reasoning
    effort under ``parameter``; or the top-level ``reasoning_effort`` field."""

    parameter: str = Field(min_length=1, max_length=128)
    """The JSON key set (one literal key; must be reasoning_effort for
    top_level_reasoning_effort)."""


class ProviderDefaults(Strict):
    """Written ``model`` / ``reasoning_effort`` (v0.4's names, current) or ``default_model`` /
    ``default_reasoning_effort`` (3d48f8c9's), not both: the aliases come from the one table
    of renames (``config/renames.py``)."""

    model_config = ConfigDict(alias_generator=lambda name: current_name(PROVIDER_DEFAULTS, name))

    default_model: str = Field(min_length=1, max_length=128)
    """The model used when no decision matches, the chosen decision's models are all down,
    or routing itself fails (signals' deployment down or full)."""

    default_reasoning_effort: str | None = Field(default=None, min_length=1, max_length=32)
    """The reasoning effort when the chosen modelRef sets none (default: medium)."""

    reasoning_families: dict[str, ReasoningFamily] = Field(default_factory=dict)
    """Named ways of switching reasoning, referred to by models[].reasoning_family."""

    @model_validator(mode="before")
    @classmethod
    def _one_name(cls, data: object) -> object:
        message = both_names_error(data, PROVIDER_DEFAULTS)
        if message is not None:  # the raw rules report it at its path (both_names_problems)
            raise PydanticCustomError(SEMANTIC_ERROR, message)
        return data


class Providers(Strict):
    defaults: ProviderDefaults
    """Defaults for routing (the default model, reasoning)."""

    models: list[ProviderModel] = Field(min_length=1, max_length=256)
    """The LLMs chat requests can go to, each with its OpenAI-compatible backends."""

    @model_validator(mode="after")
    def _rules(self, info: ValidationInfo[object]) -> Providers:
        if not rules_run_by_caller(info):
            raise_first(providers_problems(self.model_dump(by_alias=True, exclude_none=True)))
        return self

    def model(self, name: str) -> ProviderModel | None:
        """The model named ``name``, or None."""
        return next((m for m in self.models if m.name == name), None)

    def reasoning_family_of(self, model: str) -> ReasoningFamily | None:
        """The reasoning family of model ``model`` (None: no family, or no such model)."""
        m = self.model(model)
        if m is None:
            return None
        if m.inline_family is not None:
            return m.inline_family
        name = m.family_name
        return None if name is None else self.defaults.reasoning_families.get(name)
