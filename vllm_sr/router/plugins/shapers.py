"""The plugins that reshape the request to the backend, with upstream's exact semantics
(``X/req_filter_sys_prompt.go``, ``X/req_filter_request_params.go``,
``X/req_filter_header_mutation.go``, ``X/req_filter_tools*.go``). Each is a pure function of
the body (a new dict; the caller's is never changed). They run in upstream's order: the
``tools`` policy, then (after the reasoning fields) ``system_prompt``, ``request_params`` and
``header_mutation``."""

from __future__ import annotations

import copy

from vllm_sr.config.plugin_request import (
    HeaderMutationPlugin,
    RequestParamsPlugin,
    SystemPromptPlugin,
    ToolsPlugin,
)
from vllm_sr.jsontypes import JsonObject, json_object
from vllm_sr.router.message_text import SYSTEM, message_text

# Upstream's allowedTopLevelFields: what strip_unknown keeps.
KNOWN_PARAMS = frozenset(
    {
        "model", "messages", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
        "presence_penalty", "response_format", "seed", "stop", "stream", "temperature",
        "top_logprobs", "top_p", "tools", "tool_choice", "user", "reasoning_effort",
    }
)  # fmt: skip


def apply_system_prompt(body: JsonObject, plugin: SystemPromptPlugin) -> JsonObject:
    """insert (the default): the prompt, a blank line, the existing first system message's
    text; any other mode: the prompt alone. No system message first: one is prepended."""
    messages = body.get("messages")
    if not plugin.active or not isinstance(messages, list) or plugin.system_prompt is None:
        return body
    prompt = plugin.system_prompt
    mode = plugin.mode or "insert"
    first = json_object(messages[0]) if messages else None
    if first is None or first.get("role") != "system":
        return {**body, "messages": [{"role": "system", "content": prompt}, *messages]}
    content = (
        prompt + "\n\n" + message_text(first["content"], SYSTEM) if mode == "insert" else prompt
    )
    return {**body, "messages": [{**first, "content": content}, *messages[1:]]}


def _whole_number(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def apply_request_params(body: JsonObject, plugin: RequestParamsPlugin) -> JsonObject:
    """Blocked keys removed; v0.4's ``default_max_tokens`` set as ``max_tokens`` when the
    request gives no output limit; an integer ``max_tokens`` / ``n`` above its limit lowered to
    it (a fractional one removed, so a cap cannot be dodged by truncation); with
    ``strip_unknown`` only upstream's known chat parameters kept."""
    out = copy.copy(body)
    for name in plugin.blocked_params:
        out.pop(name, None)
    default = plugin.default_max_tokens
    if isinstance(default, int) and "max_tokens" not in out and "max_completion_tokens" not in out:
        out["max_tokens"] = default
    for name, limit in (("max_tokens", plugin.max_tokens_limit), ("n", plugin.max_n)):
        if limit is None or name not in out:
            continue
        value = out[name]
        whole = _whole_number(value)
        if whole is None:
            if isinstance(value, float):
                del out[name]
            continue
        if whole > limit:
            out[name] = limit
    if plugin.strip_unknown:
        out = {k: v for k, v in out.items() if k in KNOWN_PARAMS}
    return out


def header_changes(plugin: HeaderMutationPlugin) -> tuple[dict[str, str], list[str]]:
    """(headers set on the request to the backend, headers removed): add and update both set
    (the later wins); delete removes."""
    setting: dict[str, str] = {}
    for pair in [*plugin.add, *plugin.update]:
        setting[pair.name] = pair.value
    return setting, list(plugin.delete)


TOOL_CONTROLS = (
    "tools", "tool_choice", "functions", "function_call", "parallel_tool_calls",
    "web_search_options",
)  # fmt: skip


def _tool_name(tool: object) -> str | None:
    fn = tool.get("function") if isinstance(tool, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    return name if isinstance(name, str) else None


def _without_tool_history(messages: list[object]) -> list[object]:
    """Tool and function messages removed; assistant messages lose their tool calls, and go
    when nothing else (content, refusal, audio) is left."""
    out: list[object] = []
    for msg in messages:
        if not isinstance(msg, dict):
            out.append(msg)
            continue
        if msg.get("role") in ("tool", "function"):
            continue
        if msg.get("role") == "assistant" and (msg.get("tool_calls") or msg.get("function_call")):
            msg = {k: v for k, v in msg.items() if k not in ("tool_calls", "function_call")}
            content = msg.get("content")
            has_payload = (
                isinstance(content, str)
                or (isinstance(content, list) and bool(content))
                or msg.get("refusal") is not None
                or bool(msg.get("audio"))
            )
            if not has_payload:
                continue
        out.append(msg)
    return out


def apply_tools(body: JsonObject, plugin: ToolsPlugin) -> JsonObject:
    """none: every tool control removed (and with strip_tool_history, the tool history);
    filtered: tools outside allow_tools or in block_tools removed (by function name); a
    ``tool_choice`` left with no tools is removed too. passthrough (and a disabled policy):
    unchanged."""
    mode = plugin.mode or "passthrough"
    if not plugin.enabled or mode == "passthrough":
        return body
    out = copy.copy(body)
    if mode == "none":
        for key in TOOL_CONTROLS:
            out.pop(key, None)
        messages = out.get("messages")
        if plugin.strip_tool_history and isinstance(messages, list):
            out["messages"] = _without_tool_history(messages)
        return out
    tools = out.get("tools")
    if isinstance(tools, list):
        allow, block = set(plugin.allow_tools), set(plugin.block_tools)
        kept = [
            t for t in tools if _tool_name(t) not in block and (not allow or _tool_name(t) in allow)
        ]
        if kept:
            out["tools"] = kept
        else:
            out.pop("tools", None)
    if not out.get("tools"):
        out.pop("tool_choice", None)
    return out
