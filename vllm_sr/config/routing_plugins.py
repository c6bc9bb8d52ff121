"""A decision's plugins (``routing.decisions[].plugins[]``) as vllm-sr acts on them: the types
it supports and their models (each typed from upstream's ``C/plugin_config.go`` and its
fragments, ``config/fragments/plugin``, in its own module: ``plugin_cache``,
``plugin_request``, ``plugin_shadow``, ``plugin_memory``, ``router_replay``). A decision's
``plugins`` entries stay ``{type, configuration}`` mappings in ``routing.Decision``;
:func:`plugin_problems` checks one entry (at its YAML path) and :func:`decision_plugins` turns
a decision's entries into these models for the router.

``memory`` (upstream's agentic memory) is typed and accepted only disabled: vllm-sr has no
memory store.

Aliases: ``semantic-cache``, ``semantic_cache`` and ``response-cache`` name ``response_cache``
(upstream's normalisation); one plugin per type after aliasing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from pydantic import ValidationError

from vllm_sr.config.plugin_cache import ResponseCachePlugin
from vllm_sr.config.plugin_memory import MemoryPlugin
from vllm_sr.config.plugin_request import (
    FastResponsePlugin,
    HeaderMutationPlugin,
    MaskingPlugin,
    RequestParamsPlugin,
    SystemPromptPlugin,
    ToolSelectionPlugin,
    ToolsPlugin,
)
from vllm_sr.config.plugin_shadow import ShadowDispatchPlugin
from vllm_sr.config.router_replay import RouterReplayPlugin
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


def canonical_type(kind: object) -> str:
    """A plugin type after upstream's aliasing (trimmed, lower-cased)."""
    name = str(kind).strip().lower()
    return PLUGIN_ALIASES.get(name, name)


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
