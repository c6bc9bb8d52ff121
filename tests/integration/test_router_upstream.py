"""Upstream's deterministic signal families, reasoning mode, headers and /api/v1/eval on real
sockets: the Router-mode handlers in our HTTP server, real stand-in OpenAI-compatible backends
that record what they receive, the official openai SDK as the client. The routing signals are
upstream's own fragments (tests/fixtures/upstream, copied unchanged), assembled into one config
with decisions that each name one family."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml

from tests.support.backends import StandInBackend
from tests.support.router_app import serve_routes, start_router
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.router.chat import ChatRouter
from vllm_sr.router.route import AuthzOptions

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "upstream"
FRAGMENTS = ["keyword/regex", "context/long-context", "structure/request-shape",
             "conversation/agentic-shape", "language/multilingual", "metadata/routing-hints",
             "authz/rbac"]  # fmt: skip


def fragment(name: str) -> dict[str, Any]:
    (path,) = FIXTURES.glob(f"**/fragments/signal/{name}.yaml")
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


def upstream_signals() -> dict[str, Any]:
    """The signal fragments merged into one ``routing.signals`` (each family once)."""
    signals: dict[str, Any] = {}
    for name in FRAGMENTS:
        for family, items in fragment(name)["routing"]["signals"].items():
            signals.setdefault(family, []).extend(items)
    return signals


def leaf(kind: str, name: str) -> dict[str, Any]:
    return {"operator": "AND", "conditions": [{"type": kind, "name": name}]}


DECISIONS: list[dict[str, Any]] = [
    {"name": "no_consent", "priority": 100, "rules": leaf("metadata", "consent-denied"),
     "modelRefs": [{"model": "general"}]},
    {"name": "admins", "priority": 90, "rules": leaf("authz", "admin"),
     "modelRefs": [{"model": "coder"}]},
    {"name": "long", "priority": 80, "rules": leaf("context", "long_context"),
     "modelRefs": [{"model": "coder"}]},
    {"name": "questions", "priority": 70, "rules": leaf("structure", "many_questions"),
     "modelRefs": [{"model": "coder"}]},
    {"name": "agentic", "priority": 60, "rules": leaf("conversation", "tool_heavy"),
     "modelRefs": [{"model": "coder"}]},
    {"name": "spanish", "priority": 50, "rules": leaf("language", "es"),
     "modelRefs": [{"model": "coder", "use_reasoning": True, "reasoning_effort": "high"}]},
    {"name": "urgent", "priority": 40, "rules": leaf("keyword", "urgent_keywords"),
     "modelRefs": [{"model": "coder", "use_reasoning": True}]},
]  # fmt: skip


@dataclass
class Stack:
    url: str
    general: StandInBackend
    coder: StandInBackend
    chat: ChatRouter
    client: openai.AsyncOpenAI


async def start_stack(fail_open: bool = False) -> AsyncIterator[Stack]:
    general = await StandInBackend("general").start()
    coder = await StandInBackend("coder").start()
    providers = Providers.model_validate(
        {
            "defaults": {
                "default_model": "general",
                "reasoning_families": {
                    "qwen3": {"type": "chat_template_kwargs", "parameter": "enable_thinking"}
                },
            },
            "models": [
                {"name": "general", "backend_refs": [{"endpoint": general.endpoint}]},
                {
                    "name": "coder",
                    "reasoning_family": "qwen3",
                    "backend_refs": [{"endpoint": coder.endpoint}],
                },
            ],
        }
    )
    routing = Routing.model_validate({"signals": upstream_signals(), "decisions": DECISIONS})
    chat = await start_router(
        providers,
        routing,
        auto_model_names=("vllm-sr/auto", "auto", "MoM"),
        authz=AuthzOptions(fail_open=fail_open),
    )
    served = await serve_routes(chat.routes())
    client = served.client(
        "caller-key", {"x-authz-user-id": "alice", "x-authz-user-groups": "staff"}
    )
    try:
        yield Stack(served.url, general, coder, chat, client)
    finally:
        await served.close()
        await chat.backends.close()
        await general.stop()
        await coder.stop()


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async for s in start_stack():
        yield s


async def routed(stack: Stack, messages: list[dict[str, Any]], **extra: Any) -> Any:
    return await stack.client.chat.completions.with_raw_response.create(
        model="auto",
        messages=messages,  # type: ignore[arg-type]
        **extra,
    )


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


async def test_each_deterministic_family_routes_a_chat(stack: Stack) -> None:
    cases: list[tuple[str, list[dict[str, Any]], dict[str, Any]]] = [
        ("no_consent", user("hello there"), {"extra_body": {"metadata": {"consent": "denied"}}}),
        ("long", user("word " * 40_000), {}),
        ("questions", user("Why? How? When? Where? Who?"), {}),
        (
            "agentic",
            user("go"),
            {
                "tools": [
                    {"type": "function", "function": {"name": f"t{i}", "parameters": {}}}
                    for i in range(3)
                ]
            },
        ),
        (
            "spanish",
            user("¿Dónde está la biblioteca? Necesito estudiar para el examen de mañana."),
            {},
        ),
        ("urgent", user("this is urgent, the build is broken"), {}),
    ]
    for decision, messages, extra in cases:
        raw = await routed(stack, messages, **extra)
        assert raw.headers["x-vsr-selected-decision"] == decision, decision
        assert raw.headers["x-vsr-selected-algorithm"] == "single"
        assert float(raw.headers["x-vsr-selected-confidence"]) > 0
    # Nothing matched: the default model, no decision headers.
    raw = await routed(stack, user("tell me a story about a cat"))
    assert raw.headers["x-vsr-selected-model"] == "general"
    assert "x-vsr-selected-decision" not in raw.headers
    assert raw.headers["x-vsr-selected-algorithm"] == "default"


async def test_role_bindings_route_by_the_identity_headers(stack: Stack) -> None:
    raw = await stack.client.chat.completions.with_raw_response.create(
        model="auto",
        messages=user("hello"),  # type: ignore[arg-type]
        extra_headers={"x-authz-user-groups": "platform-admins"},
    )
    assert raw.headers["x-vsr-selected-decision"] == "admins"


async def test_no_identity_with_role_bindings_is_403_unless_fail_open(stack: Stack) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{stack.url}/v1/chat/completions",
            json={"model": "auto", "messages": user("hello")},
        ) as resp,
    ):
        assert resp.status == 403
        assert (await resp.json())["error"]["code"] == "authz_required"
    async for open_stack in start_stack(fail_open=True):
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{open_stack.url}/v1/chat/completions",
                json={"model": "auto", "messages": user("hello")},
            ) as resp,
        ):
            assert resp.status == 200


async def test_reasoning_fields_reach_the_backend_as_upstream_sets_them(stack: Stack) -> None:
    await routed(stack, user("this is urgent"), extra_body={"reasoning_effort": "low"})
    got = stack.coder.received[-1].body
    assert got["chat_template_kwargs"] == {"enable_thinking": True}
    assert "reasoning_effort" not in got  # the client's top-level effort is removed
    # A named model is sent as the caller wrote it.
    await stack.client.chat.completions.create(
        model="coder",
        messages=user("this is urgent"),  # type: ignore[arg-type]
        extra_body={"reasoning_effort": "low"},
    )
    got = stack.coder.received[-1].body
    assert "chat_template_kwargs" not in got
    assert got["reasoning_effort"] == "low"


async def test_debug_headers_name_each_matched_family(stack: Stack) -> None:
    raw = await stack.client.chat.completions.with_raw_response.create(
        model="auto",
        messages=user("urgent: 1. first\n2. then\nWhy? How? When? Where?"),  # type: ignore[arg-type]
        extra_headers={"x-vsr-debug": "true"},
    )
    assert raw.headers["x-vsr-matched-keywords"] == "urgent_keywords"
    assert "many_questions" in raw.headers["x-vsr-matched-structure"].split(",")
    assert raw.headers["x-vsr-selected-reasoning"] == "off"  # questions: no use_reasoning
    plain = await routed(stack, user("urgent: Why? How? When? Where?"))
    assert "x-vsr-matched-keywords" not in plain.headers  # only with x-vsr-debug: true
    assert "keyword:urgent_keywords" in plain.headers["x-vsr-matched-signals"].split(",")


async def test_a_model_that_is_not_configured_is_400_as_upstream(stack: Stack) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await stack.client.chat.completions.create(
            model="gpt-nope",
            messages=user("hi"),  # type: ignore[arg-type]
        )
    err = info.value.body
    assert isinstance(err, dict)
    assert err["message"].startswith('model "gpt-nope" is not available')
    assert err["type"] == "invalid_request_error"


async def post_eval(stack: Stack, payload: Any, query: str = "") -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{stack.url}/api/v1/eval{query}", data=json.dumps(payload)) as resp,
    ):
        return resp.status, await resp.json()


async def test_eval_answers_upstreams_document_without_calling_a_backend(stack: Stack) -> None:
    status, doc = await post_eval(stack, {"text": "urgent: Why? How? When? Where?"}, "?trace=true")
    assert status == 200
    assert doc["requested_model"] == "vllm-sr/auto"
    assert doc["recipe"] == "default"
    result = doc["decision_result"]
    assert result["decision_name"] == "questions"
    assert result["algorithm"] == "static"
    assert result["used_signals"] == {"structure": ["many_questions"]}
    assert "urgent_keywords" in result["matched_signals"]["keywords"]
    assert "sensitive_data_keywords" in result["unmatched_signals"]["keywords"]
    assert doc["signal_values"]["structure:many_questions"] == 4
    assert doc["selected_model"] == "coder"
    assert doc["selection_status"] == "selected"
    assert doc["recommended_models"] == ["coder"]
    assert doc["routing_decision"] == "questions"
    assert doc["signal_errors"] == {}
    traces = {t["decision_name"]: t for t in doc["eval_trace"]}
    assert set(traces) == {d["name"] for d in DECISIONS}
    assert traces["questions"]["matched"] and not traces["agentic"]["matched"]
    assert traces["questions"]["root_trace"]["children"][0]["signal_name"] == "many_questions"
    assert stack.coder.received == [] and stack.general.received == []
    # Authz is not run by eval: no identity, no 403.
    status, doc = await post_eval(stack, {"text": "tell me a story"})
    assert status == 200 and doc["decision_result"]["decision_name"] == ""
    assert "eval_trace" not in doc
    assert doc["selection_status"] == "fallback" and doc["selected_model"] == "general"


async def test_eval_refuses_as_upstream(stack: Stack) -> None:
    status, doc = await post_eval(stack, {"text": "hi", "model": "coder"})
    assert (status, doc["error"]["code"]) == (400, "INVALID_ROUTING_MODEL")
    assert doc["error"]["timestamp"]
    status, doc = await post_eval(stack, ["not", "an", "object"])
    assert (status, doc["error"]["code"]) == (400, "INVALID_INPUT")
