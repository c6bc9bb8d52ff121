"""What one backend attempt of a routed chat is sent: the body and the request headers the
matched decision's plugins shape (upstream's step 7, per attempt, because the reasoning fields
depend on the model and backend the attempt goes to).

For a chat whose decision matched: the ``tools`` policy, upstream's reasoning fields
(vllm_sr/router/reasoning.py; a decision without modelRefs turns reasoning off on the default
model), then ``system_prompt`` and ``request_params``; ``header_mutation`` sets and removes
request headers. A chat naming a model, or one no decision matched, goes as the caller wrote
it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vllm_sr.config.routing_plugins import DecisionPlugins
from vllm_sr.config.routing_providers import ProviderDefaults, ProviderModel
from vllm_sr.jsontypes import JsonObject
from vllm_sr.router.backend import Backend
from vllm_sr.router.plugins import shapers
from vllm_sr.router.reasoning import apply_reasoning, reasoning_enabled
from vllm_sr.router.route import RouteResult

NO_PLUGINS = DecisionPlugins()


@dataclass(frozen=True)
class HeaderChanges:
    """``header_mutation`` on the request to the backend: headers set, headers removed."""

    set: Mapping[str, str] = field(default_factory=dict)
    drop: Sequence[str] = ()


NO_HEADER_CHANGES = HeaderChanges()  # the usual decision's (one for every chat)


def header_changes(plugins: DecisionPlugins) -> HeaderChanges:
    if plugins.header_mutation is None:
        return NO_HEADER_CHANGES
    setting, dropping = shapers.header_changes(plugins.header_mutation)
    return HeaderChanges(setting, tuple(dropping))


def shape(
    body: JsonObject,
    result: RouteResult,
    backend: Backend,
    plugins: DecisionPlugins,
    model: ProviderModel,
    defaults: ProviderDefaults,
    effects: list[str] | None = None,
) -> JsonObject:
    """The body for one attempt on ``backend`` of ``model`` (``result``: the attempt's
    model and modelRef). ``effects`` (when given) gets the names of what changed it."""
    if result.decision is None:
        return body
    done: list[str] = []
    if plugins.tools is not None:
        body = shapers.apply_tools(body, plugins.tools)
        done.append("tools")
    out: JsonObject = apply_reasoning(
        body,
        result.model_ref,
        model,
        defaults,
        backend.ref,
        decision_refs=result.decision_refs,
    )
    done.append("reasoning:on" if reasoning_enabled(result.model_ref) else "reasoning:off")
    if plugins.system_prompt is not None:
        out = shapers.apply_system_prompt(out, plugins.system_prompt)
        done.append("system_prompt")
    if plugins.request_params is not None:
        out = shapers.apply_request_params(out, plugins.request_params)
        done.append("request_params")
    if effects is not None:
        for effect in done:
            if effect not in effects:
                effects.append(effect)
    return out
