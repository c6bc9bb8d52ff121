"""The request shapers, the tools policy, tool selection's ranking and the fallback order,
apart from HTTP (upstream's semantics; through the SDK in
tests/integration/test_router_plugins.py)."""

from __future__ import annotations

from typing import Any

from vllm_sr.config.plugin_request import RequestParamsPlugin, SystemPromptPlugin
from vllm_sr.router.plugins import shapers


def test_shapers_follow_upstream() -> None:
    body = {"messages": [{"role": "user", "content": "q"}], "max_tokens": 9.5, "n": 4, "x": 1}
    shaped = shapers.apply_request_params(
        body, RequestParamsPlugin(max_tokens_limit=5, max_n=2, strip_unknown=True)
    )
    assert shaped == {"messages": body["messages"], "n": 2}  # fractional removed, x stripped
    replaced = shapers.apply_system_prompt(
        {"messages": [{"role": "system", "content": "old"}]},
        SystemPromptPlugin(system_prompt="new", mode="append"),
    )
    assert replaced["messages"] == [{"role": "system", "content": "new"}]
    added = shapers.apply_system_prompt(body, SystemPromptPlugin(system_prompt="new"))
    assert added["messages"][0] == {"role": "system", "content": "new"}
    off = SystemPromptPlugin(system_prompt="new", enabled=False)
    assert shapers.apply_system_prompt(body, off) is body


def test_tools_policy_follows_upstream() -> None:
    from vllm_sr.config.plugin_request import ToolsPlugin

    def tool(name: str) -> dict[str, Any]:
        return {"type": "function", "function": {"name": name, "parameters": {}}}

    body: dict[str, Any] = {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
            {"role": "tool", "tool_call_id": "1", "content": "r"},
            {"role": "assistant", "content": "so", "tool_calls": [{"id": "2"}]},
        ],
        "tools": [tool("docs.search"), tool("admin.delete"), tool("other")],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
    }
    none = shapers.apply_tools(
        body, ToolsPlugin(enabled=True, mode="none", strip_tool_history=True)
    )
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(none)
    assert none["messages"] == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "so"},
    ]
    kept = shapers.apply_tools(
        body,
        ToolsPlugin(
            enabled=True,
            mode="filtered",
            allow_tools=["docs.search", "admin.delete"],
            block_tools=["admin.delete"],
        ),
    )
    assert [t["function"]["name"] for t in kept["tools"]] == ["docs.search"]
    assert kept["tool_choice"] == "auto" and kept["messages"] == body["messages"]
    emptied = shapers.apply_tools(
        body, ToolsPlugin(enabled=True, mode="filtered", allow_tools=["missing"])
    )
    assert "tools" not in emptied and "tool_choice" not in emptied
    assert shapers.apply_tools(body, ToolsPlugin(mode="none")) is body  # not enabled


def test_tool_selection_order_threshold_and_preserve_count() -> None:
    from vllm_sr.router.plugins.tool_selection import select, tool_text

    tools = [{"function": {"name": n, "description": f"does {n}"}} for n in "abcd"]
    assert tool_text(tools[0]) == "a does a"
    scores = [0.1, 0.9, 0.3, 0.9]
    names = [t["function"]["name"] for t in select(tools, scores, 0.25, 0)]
    assert names == ["b", "d", "c"]  # best first, ties in request order
    names = [t["function"]["name"] for t in select(tools, scores, 0.95, 2)]
    assert names == ["b", "d"]  # none over the threshold: the two best preserved
    assert select(tools, scores, 0.95, 0) == []


def test_fallback_order_skips_unhealthy_models_and_ends_on_the_default() -> None:
    from vllm_sr.config.routing import ModelRef
    from vllm_sr.router.fallback import candidates
    from vllm_sr.router.route import RouteResult

    refs = tuple(ModelRef(model=m) for m in ("a", "b", "c", "a"))
    chosen = RouteResult("b", decision="d", model_ref=refs[1], decision_refs=refs)
    healthy = {"a": True, "b": True, "c": False, "default": True}.__getitem__
    assert [m for m, _ in candidates(chosen, "default", healthy)] == ["b", "a", "default"]
    no_decision = RouteResult("default")
    assert [m for m, _ in candidates(no_decision, "default", healthy)] == ["default"]
    named = RouteResult("a", routed=False)
    assert [m for m, _ in candidates(named, "default", healthy)] == ["a"]
