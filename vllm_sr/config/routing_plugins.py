"""The decision plugins vllm-sr acts on (``routing.decisions[].plugins[]``), typed from upstream's
``C/plugin_config.go`` and its fragments (``config/fragments/plugin``), with upstream's names
and defaults. A decision's ``plugins`` entries stay ``{type, configuration}`` mappings in
``routing.Decision``; :func:`plugin_problems` checks one entry (at its YAML path) and
:func:`decision_plugins` turns a decision's entries into these models for the router.

``memory`` (upstream's agentic memory) is typed and accepted only disabled: vllm-sr has no
memory store.

Aliases: ``semantic-cache``, ``semantic_cache`` and ``response-cache`` name ``response_cache``
(upstream's normalisation); one plugin per type after aliasing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal, TypeVar

from pydantic import Field, ValidationError, field_validator, model_validator

from vllm_sr.config.routing_base import Path, Strict, as_dict, as_list, problem, refusal
from vllm_sr.jsontypes import JsonObject

if TYPE_CHECKING:
    from vllm_sr.config.problems import Problem
    from vllm_sr.config.routing import Plugin, Routing

PLUGIN_ALIASES = {
    "semantic-cache": "response_cache",
    "semantic_cache": "response_cache",
    "response-cache": "response_cache",
}
CACHE_DIRECTIVES = ("no-cache", "no-store", "bypass", "max-age", "ttl")


def canonical_type(kind: object) -> str:
    """A plugin type after upstream's aliasing (trimmed, lower-cased)."""
    name = str(kind).strip().lower()
    return PLUGIN_ALIASES.get(name, name)


class CacheSemantic(Strict):
    similarity_threshold: float | None = Field(default=None, ge=0, le=1)
    """A semantic hit needs this cosine or more (unset: 0.8, upstream's default)."""


class CacheRequestControls(Strict):
    enabled: bool = False
    """Honour the request's cache-control header."""

    header: str | None = None
    """The header read (unset: ``x-vsr-cache-control``)."""

    allowed: list[Literal["no-cache", "no-store", "bypass", "max-age", "ttl"]] | None = None
    """Directives honoured (unset or empty: no-cache, no-store, bypass)."""

    max_ttl_seconds: int | None = Field(default=None, ge=0)
    """A ``ttl=N`` directive is clamped to this."""


class CachePersonalized(Strict):
    mode: Literal["disabled", "exact"] | None = None
    """Upstream: caching after RAG/memory enrichment. vllm-sr has no enrichment plugins, so it
    has no effect (metadata)."""


class CacheRevision(Strict):
    """Part of every key: changing one of these starts a fresh cache for the decision."""

    cache_epoch: str | None = None
    model_revision: str | None = None
    prompt_revision: str | None = None
    policy_revision: str | None = None


class ResponseCachePlugin(Strict):
    enabled: bool = False
    """The cache is on for the decision only when true (upstream's default is off)."""

    mode: Literal["semantic", "exact", "exact_then_semantic"] | None = None
    """Lookup tiers (unset: semantic)."""

    scope: Literal["user", "team", "tenant", "global"] | None = None
    """Who shares entries (unset: user). user: ``x-authz-user-id``; team: ``x-authz-team-id``,
    else the first ``x-authz-user-groups`` entry; tenant: ``x-authz-tenant-id``. A request
    without the identity its scope needs is not cached."""

    semantic: CacheSemantic | None = None
    """The semantic tier."""

    ttl_seconds: int | None = Field(default=None, ge=0)
    """Entry lifetime (unset: the store's ``ttl_seconds``)."""

    request_controls: CacheRequestControls | None = None
    """The request header that can skip reads/writes or bound ages."""

    personalized: CachePersonalized | None = None
    """Upstream: post-enrichment caching (no effect here)."""

    revision: CacheRevision | None = None
    """Partition strings (part of every key)."""

    allow_request_controls: bool = False
    """Deprecated flat form of ``request_controls.enabled`` (used when request_controls is
    unset)."""

    control_header: str | None = None
    """Deprecated flat form of ``request_controls.header``."""

    similarity_threshold: float | None = Field(default=None, ge=0, le=1)
    """Deprecated flat form of ``semantic.similarity_threshold``."""

    @property
    def effective_mode(self) -> str:
        return self.mode or "semantic"

    @property
    def effective_scope(self) -> str:
        return self.scope or "user"

    @property
    def threshold(self) -> float:
        if self.semantic is not None and self.semantic.similarity_threshold is not None:
            return self.semantic.similarity_threshold
        if self.similarity_threshold is not None:
            return self.similarity_threshold
        return 0.8

    def controls(self) -> CacheRequestControls:
        if self.request_controls is not None:
            return self.request_controls
        return CacheRequestControls(enabled=self.allow_request_controls, header=self.control_header)


class SystemPromptPlugin(Strict):
    enabled: bool | None = None
    """Unset: on when ``system_prompt`` is set."""

    system_prompt: str | None = None
    """The prompt."""

    mode: str | None = None
    """``insert`` (default): the prompt, a blank line, then the existing system text; any
    other value (``replace``, even ``append``): the prompt replaces it (upstream's rule)."""

    @property
    def active(self) -> bool:
        on = self.enabled if self.enabled is not None else bool(self.system_prompt)
        return on and bool(self.system_prompt)


class HeaderPair(Strict):
    name: str = Field(min_length=1)
    value: str = ""


class HeaderMutationPlugin(Strict):
    add: list[HeaderPair] = Field(default_factory=list)
    """Headers set on the request to the backend."""

    update: list[HeaderPair] = Field(default_factory=list)
    """Also set (upstream treats add and update alike)."""

    delete: list[str] = Field(default_factory=list)
    """Headers removed from the request to the backend."""


class RequestParamsPlugin(Strict):
    blocked_params: list[str] = Field(default_factory=list)
    """Body keys removed."""

    max_tokens_limit: int | None = Field(default=None, ge=0)
    """An integer ``max_tokens`` above this is lowered to it."""

    max_n: int | None = Field(default=None, ge=0)
    """An integer ``n`` above this is lowered to it."""

    strip_unknown: bool = False
    """Keep only upstream's known chat parameters."""

    default_max_tokens: Annotated[int, Field(ge=1, strict=True)] | Literal["auto"] | None = None
    """v0.4: ``max_tokens`` set to this when the request gives neither ``max_tokens`` nor
    ``max_completion_tokens`` (then capped by ``max_tokens_limit``). ``auto`` is refused."""


class FastResponsePlugin(Strict):
    message: str = Field(min_length=1)
    """The canned answer; no backend is called."""


class ToolsPlugin(Strict):
    enabled: bool = False
    """The policy applies only when true (upstream's default is off)."""

    mode: Literal["passthrough", "filtered", "none"] | None = None
    """passthrough (default): tools as sent; filtered: allow_tools/block_tools applied; none:
    every tool control removed (tools, tool_choice, functions, function_call,
    parallel_tool_calls, web_search_options)."""

    allow_tools: list[str] = Field(default_factory=list)
    """filtered: only these function names are kept (empty: all)."""

    block_tools: list[str] = Field(default_factory=list)
    """filtered: these function names are removed (wins over allow_tools)."""

    strip_tool_history: bool = False
    """none: also remove tool/function messages and assistant tool calls from the history."""

    semantic_selection: bool | None = None
    """Upstream: semantic selection from the tools database (``integrations.tools``, which
    vllm-sr does not have): no effect (metadata)."""

    strategy: str | None = None
    """Upstream: the tools database's retrieval strategy (metadata)."""

    dynamic_retrieval: JsonObject | None = None
    """Upstream: the tools database's history-aware retrieval (metadata)."""


class ToolSelectionPlugin(Strict):
    enabled: bool = False
    """Selection runs only when true."""

    mode: Literal["add", "filter"] | None = None
    """filter: keep the request's tools relevant to the query. add (upstream's default, from a
    tools database file) is refused: vllm-sr has no tools database."""

    relevance_threshold: float | None = Field(default=None, ge=0, le=1)
    """filter: a tool is kept when the cosine of its ``name description`` to the query is at
    least this (default 0.25)."""

    preserve_count: int = Field(default=0, ge=0)
    """filter: keep at least this many tools (the best scored), whatever their score."""

    fallback_to_empty: bool | None = None
    """Upstream: what an empty selection sends; vllm-sr removes ``tools`` (and ``tool_choice``)
    either way, since an empty tools list is not a valid request."""

    tools_db_path: str | None = None
    """add mode's database (refused with add)."""

    top_k: int | None = Field(default=None, ge=0)
    """add mode (refused)."""

    similarity_threshold: float | None = Field(default=None, ge=0, le=1)
    """add mode (refused)."""

    advanced_filtering: JsonObject | None = None
    """add mode (refused)."""

    strategy: str | None = None
    """add mode's retrieval strategy (refused)."""


class RouterReplayPlugin(Strict):
    enabled: bool | None = None
    """Record this decision's chats (false: never); unset: ``global.services.router_replay.
    enabled``, as upstream layers them."""

    max_records: int = Field(default=10000, ge=1)
    """Records kept for the decision by the memory store (oldest dropped first); the redis and
    postgres stores are bounded by ``ttl_seconds`` alone, as upstream's are."""

    capture_request_body: bool = True
    """Keep the request body (its first max_body_bytes)."""

    capture_response_body: bool = True
    """Keep the answer body, or a stream's bytes (its first max_body_bytes)."""

    max_body_bytes: int = Field(default=4096, ge=0)
    """Bodies are cut to this many bytes (``*_truncated`` says so)."""

    max_tool_trace_bytes: int = Field(default=0, ge=0)
    """Upstream: tool traces; vllm-sr records none (metadata)."""

    max_tool_trace_steps: int = Field(default=100, ge=0)
    """Upstream: tool trace steps (metadata)."""


class MemoryReflection(Strict):
    """Upstream's recall post-processing (``MemoryReflectionConfig``; metadata here)."""

    enabled: bool | None = None
    """Upstream: reflection on (unset: on)."""

    algorithm: str | None = None
    """Upstream: the reflection algorithm."""

    max_inject_tokens: int | None = None
    """Upstream: most tokens of recalled memories injected."""

    recency_decay_days: int | None = None
    """Upstream: older memories weigh less over this many days."""

    dedup_threshold: float | None = None
    """Upstream: near-duplicate memories above this similarity are merged."""

    block_patterns: list[str] = Field(default_factory=list)
    """Upstream: memories matching these patterns are never injected."""


class MemoryPlugin(Strict):
    """Upstream's per-decision agentic memory (``MemoryPluginConfig``): recalled memories
    injected into the request, conversations stored. vllm-sr has no agentic memory store, so
    only ``enabled: false`` is accepted; it has no effect here, as in upstream when the global
    memory is off (``global.stores.memory.enabled: true`` is refused too)."""

    enabled: bool = False
    """Upstream: memory on for this decision (refused when true)."""

    retrieval_limit: int | None = None
    """Upstream: memories recalled per request."""

    similarity_threshold: float | None = Field(default=None, ge=0, le=1)
    """Upstream: recall's cosine threshold (0 to 1, as upstream checks)."""

    auto_store: bool | None = None
    """Upstream: store this decision's conversations."""

    hybrid_search: bool = False
    """Upstream: hybrid search on."""

    hybrid_mode: str | None = None
    """Upstream: the hybrid search's mode."""

    reflection: MemoryReflection | None = None
    """Upstream: recall post-processing."""


MASK_INDEX = "{index}"
# Headers that carry a caller's credential: a shadow copy never carries them (upstream's
# SHADOW_CREDENTIAL_HEADERS in its CLI's models.py, kept in step with its router).
SHADOW_CREDENTIAL_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "x-user-openai-key",
        "x-user-anthropic-key",
        "x-user-azure-openai-key",
        "x-user-bedrock-key",
        "x-user-gemini-key",
        "x-user-vertex-ai-key",
        "x-user-minimax-key",
    }
)


class MaskingPlugin(Strict):
    """Upstream's ``masking`` (``C/plugin_masking.go``): detected PII in the request to the
    backend is replaced by placeholders. It fails closed: a detector failure answers 503,
    never the unmasked request."""

    enabled: bool = False
    """Masking runs only when true."""

    threshold: float = Field(default=0.0, ge=0, le=1)
    """Least detector score for a span to be masked (0: the detector's own floor,
    vllm_sr/router/plugins/masking.py)."""

    entity_types: list[str] = Field(default_factory=list, max_length=64)
    """Only these types are masked (an include list; empty: every detected type)."""

    placeholders: dict[str, str] = Field(default_factory=dict)
    """Entity type -> template containing ``{index}`` (unset: ``[TYPE_{index}]``)."""

    @field_validator("placeholders")
    @classmethod
    def _templates_have_index(cls, value: dict[str, str]) -> dict[str, str]:
        for kind, template in value.items():
            if MASK_INDEX not in template:
                raise ValueError(
                    f"placeholder {template!r} for {kind!r} has no {MASK_INDEX}; accepted: a "
                    f"template containing {MASK_INDEX} (distinct values need distinct "
                    "placeholders)"
                )
        return value

    def template(self, entity_type: str) -> str:
        return self.placeholders.get(entity_type) or f"[{entity_type}_{MASK_INDEX}]"


class ShadowDispatchPlugin(Strict):
    """Upstream's ``shadow_dispatch``: a bounded, sampled asynchronous copy of the request to
    a secondary model after the primary dispatch; the caller's answer never waits for it
    and never changes because of it (vllm_sr/router/plugins/shadow.py)."""

    enabled: bool
    """Required (upstream: an omitted flag must not read as on)."""

    model: str | None = None
    """The providers.models name the copy goes to (required when enabled)."""

    sample_rate: float | None = Field(default=None, ge=0, le=1)
    """Share of the decision's chats copied (unset: every one)."""

    max_concurrency: int = Field(default=2, ge=0)
    """Copies in flight at once for this decision (0: the default, 2)."""

    max_queue_depth: int = Field(default=8, ge=0)
    """Copies waiting for a slot; a copy beyond it is dropped and counted (0: the default,
    8)."""

    timeout_seconds: int = Field(default=30, ge=0)
    """One copy's time limit, retries included (0: the default, 30)."""

    max_response_bytes: int = Field(default=1048576, ge=0)
    """The secondary's answer is read up to this many bytes (0: the default, 1 MiB); a longer
    one counts as ``too_large``."""

    max_retries: int = Field(default=0, ge=0, le=3)
    """Further tries after a connection failure or a 5xx."""

    capture_response_body: bool = False
    """Upstream: keep the secondary's answer in its replay record. vllm-sr keeps none
    (metadata; the outcome is counted)."""

    max_capture_bytes: int = Field(default=4096, ge=0)
    """Upstream: the captured answer's size (metadata, as capture_response_body)."""

    tls_skip_verify: bool = False
    """Refused when true: vllm-sr always verifies a backend's TLS."""

    forward_headers: list[str] = Field(default_factory=list)
    """Names set by the decision's header_mutation that the copy carries too; nothing else
    the decision sets for the primary is forwarded. Credential headers are refused."""

    @field_validator("forward_headers")
    @classmethod
    def _no_credentials(cls, names: list[str]) -> list[str]:
        for name in names:
            bare = name.strip()
            if not bare or bare.startswith(":"):
                raise ValueError(
                    f"forward_headers entry {name!r}; accepted: a header name (not empty, not "
                    "a pseudo-header)"
                )
            if bare.lower() in SHADOW_CREDENTIAL_HEADERS:
                raise ValueError(
                    f"forward_headers entry {name!r} is a credential header; accepted: header "
                    "names other than " + ", ".join(sorted(SHADOW_CREDENTIAL_HEADERS))
                )
        return names

    @model_validator(mode="after")
    def _model_when_enabled(self) -> ShadowDispatchPlugin:
        if self.enabled and not (self.model or "").strip():
            raise ValueError("shadow_dispatch: model is required when enabled is true")
        return self


PLUGIN_MODELS: dict[str, type[Strict]] = {
    "response_cache": ResponseCachePlugin,
    "system_prompt": SystemPromptPlugin,
    "header_mutation": HeaderMutationPlugin,
    "request_params": RequestParamsPlugin,
    "fast_response": FastResponsePlugin,
    "router_replay": RouterReplayPlugin,
    "tools": ToolsPlugin,
    "tool_selection": ToolSelectionPlugin,
    "masking": MaskingPlugin,
    "shadow_dispatch": ShadowDispatchPlugin,
    "memory": MemoryPlugin,
}
SUPPORTED_PLUGIN_TYPES = tuple(PLUGIN_MODELS)


def plugin_problems(path: Path, kind: str, configuration: object) -> list[Problem]:
    """One supported plugin's ``configuration`` checked against its model; each error at its
    YAML path, naming the value and what is accepted."""
    model = PLUGIN_MODELS[kind]
    if configuration is None:
        return [
            problem(
                (*path, "configuration"),
                f"the plugin {kind!r} has no configuration; accepted: a mapping with its "
                f"fields ({', '.join(model.model_fields)})",
            )
        ]
    try:
        typed = model.model_validate(configuration)
    except ValidationError as exc:
        out = []
        for err in exc.errors():
            where = (*path, "configuration", *err["loc"])
            value = err.get("input")
            out.append(problem(where, f"{err['msg']} (got {value!r}) in the plugin {kind!r}"))
        return out
    if isinstance(typed, ShadowDispatchPlugin) and typed.tls_skip_verify:
        return [
            refusal(
                (*path, "configuration", "tls_skip_verify"),
                "shadow_dispatch tls_skip_verify: true (vllm-sr always verifies a backend's TLS)",
                "false",
            )
        ]
    if isinstance(typed, RequestParamsPlugin) and typed.default_max_tokens == "auto":
        return [
            refusal(
                (*path, "configuration", "default_max_tokens"),
                "default_max_tokens 'auto' (each candidate model's own output limit, from "
                "upstream's native model limits)",
                "a positive integer",
            )
        ]
    if isinstance(typed, MemoryPlugin) and typed.enabled:
        return [
            refusal(
                (*path, "configuration", "enabled"),
                "the memory plugin enabled: true (agentic memory: recall from and writes to a "
                "memory store, which vllm-sr does not have)",
                "enabled: false",
            )
        ]
    if isinstance(typed, ToolSelectionPlugin) and typed.enabled and typed.mode != "filter":
        return [
            refusal(
                (*path, "configuration", "mode"),
                f"tool_selection mode {typed.mode or 'add'!r} (tools from a tools database)",
                "mode: filter (the request's own tools, ranked by relevance to the query)",
            )
        ]
    return []


_P = TypeVar("_P", bound=Strict)


@dataclass(frozen=True)
class DecisionPlugins:
    """A decision's plugins as the router runs them (None: not configured)."""

    response_cache: ResponseCachePlugin | None = None
    system_prompt: SystemPromptPlugin | None = None
    header_mutation: HeaderMutationPlugin | None = None
    request_params: RequestParamsPlugin | None = None
    fast_response: FastResponsePlugin | None = None
    router_replay: RouterReplayPlugin | None = None
    tools: ToolsPlugin | None = None
    tool_selection: ToolSelectionPlugin | None = None
    masking: MaskingPlugin | None = None
    shadow_dispatch: ShadowDispatchPlugin | None = None
    names: tuple[str, ...] = ()  # canonical types, YAML order (eval's decision_result.plugins)


def decision_plugins(
    plugins: Sequence[Plugin | JsonObject] | None, replay_allowed: bool = True
) -> DecisionPlugins:
    """A decision's ``plugins`` list (its Plugin models or raw mappings, validated at load)
    -> the typed plugins (a type given twice: the last one). With ``replay_allowed`` false
    (the recipe's v0.4 ``data_policy.replay: false``), router_replay is off whatever the
    decision or the global default says."""
    configs: JsonObject = {}
    names: list[str] = []
    for entry in plugins or []:
        if isinstance(entry, dict):
            written, configuration = entry.get("type"), entry.get("configuration")
        else:
            written, configuration = entry.type, entry.configuration
        kind = canonical_type(written)
        names.append(kind)
        configs[kind] = configuration or {}

    def typed(kind: str, model: type[_P]) -> _P | None:
        return model.model_validate(configs[kind]) if kind in configs else None

    return DecisionPlugins(
        response_cache=typed("response_cache", ResponseCachePlugin),
        system_prompt=typed("system_prompt", SystemPromptPlugin),
        header_mutation=typed("header_mutation", HeaderMutationPlugin),
        request_params=typed("request_params", RequestParamsPlugin),
        fast_response=typed("fast_response", FastResponsePlugin),
        router_replay=typed("router_replay", RouterReplayPlugin)
        if replay_allowed
        else RouterReplayPlugin(enabled=False),
        tools=typed("tools", ToolsPlugin),
        tool_selection=typed("tool_selection", ToolSelectionPlugin),
        masking=typed("masking", MaskingPlugin),
        shadow_dispatch=typed("shadow_dispatch", ShadowDispatchPlugin),
        names=tuple(names),
    )


def shadow_model_problems(path: Path, decision: JsonObject, models: list[str]) -> list[Problem]:
    """An enabled ``shadow_dispatch`` whose ``model`` is not a providers.models name (every
    copy must resolve to a backend, as upstream checks)."""
    out: list[Problem] = []
    for j, entry in enumerate(as_list(decision.get("plugins"))):
        raw = as_dict(entry)
        if canonical_type(raw.get("type")) != "shadow_dispatch":
            continue
        conf = as_dict(raw.get("configuration"))
        model = conf.get("model")
        if conf.get("enabled") is True and isinstance(model, str) and model not in models:
            out.append(
                problem(
                    (*path, "plugins", j, "configuration", "model"),
                    f"shadow_dispatch model {model!r} is not a providers.models name; "
                    f"accepted: one of {', '.join(models) or '(no models)'}",
                )
            )
    return out


def replay_allowed(routing: Routing) -> bool:
    """False when the routing's v0.4 ``data_policy.replay`` is false."""
    return routing.data_policy is None or routing.data_policy.replay is not False
