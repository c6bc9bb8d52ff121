"""``POST /api/v1/routing/preview`` on a real HTTP server over Router mode's routes: upstream
v0.4's mom-v1 probes (tests/fixtures/upstream/v0.4/preview/probes.yaml), sent as upstream's
sr-bench sends them, on the model-free part of mom-v1's speed recipe
(speed-tools.routing.yaml); the same handler and answer as ``/api/v1/eval``; strict envelope
refusals on the new path only; no backend called."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.support.backends import StandInBackend
from tests.support.router_app import (
    Served,
    routed_stand_ins,
)
from tests.unit.test_routing_preview import UPSTREAM
from vllm_sr.config.routing import Routing
from vllm_sr.router.chat import ChatRouter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "upstream" / "v0.4" / "preview"
PROBES = yaml.safe_load((FIXTURES / "probes.yaml").read_text())
ROUTING = yaml.safe_load((FIXTURES / "speed-tools.routing.yaml").read_text())
DECLARED = {
    "keywords": {s["name"] for s in ROUTING["signals"]["keywords"]},
    "structure": {s["name"] for s in ROUTING["signals"]["structure"]},
    "conversation": {s["name"] for s in ROUTING["signals"]["conversation"]},
}
# mom-v1's speed decisions here: "fast" is its priority-10 catch-all with no rules; with only
# the model-free decisions loaded, a request that matches none falls back to the default model,
# named "fast" below.
DECISION_HERE = {"tools": "tools", "reasoning": "reasoning", "fast": ""}


def variants() -> dict[str, tuple[str, dict[str, Any]]]:
    """Probe id -> (expected decision, variant)."""
    return {
        v["id"]: (d["expected_decision"], v) for d in PROBES["decisions"] for v in d["variants"]
    }


def image_part(fixture: str) -> dict[str, Any]:
    image = PROBES["fixtures"]["images"][fixture]
    data = "".join(image["data_base64"].split())
    return {"type": "image_url", "image_url": {"url": f"data:{image['media_type']};base64,{data}"}}


def envelope(variant: dict[str, Any]) -> dict[str, Any]:
    """The probe's request as sr-bench builds it: its text (or messages, image fixtures
    inlined) and the request fields upstream's case_request_fields takes, through upstream's
    own build_preview_request."""
    body: dict[str, Any] = dict(UPSTREAM.case_request_fields(variant))
    if "messages" in variant:
        messages = json.loads(json.dumps(variant["messages"]))
        for message in messages:
            content = message.get("content")
            if isinstance(content, list):
                message["content"] = [
                    image_part(p["fixture"]) if p.get("type") == "image_fixture" else p
                    for p in content
                ]
        body["messages"] = messages
    else:
        body["text"] = variant["query"]
    checked: dict[str, Any] = UPSTREAM.build_preview_request(body, model="vllm-sr/auto")
    return checked


@dataclass
class Stack:
    served: Served
    chat: ChatRouter
    backends: list[StandInBackend]

    async def post(self, path: str, payload: Any, query: str = "") -> tuple[int, Any]:
        data = payload if isinstance(payload, bytes) else json.dumps(payload)
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{self.served.url}{path}{query}", data=data) as resp,
        ):
            return resp.status, await resp.json()

    async def preview(self, payload: Any, query: str = "") -> tuple[int, Any]:
        return await self.post("/api/v1/routing/preview", payload, query)


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    names = ("fast", "tool-caller", "reasoner")
    async with routed_stand_ins(names, Routing.model_validate(ROUTING)) as r:
        yield Stack(r.served, r.chat, list(r.backends.values()))


ROUTED = [
    "speed_tools__weather_function",
    "speed_tools__calculator_paraphrase_messages",
    "speed_tools__active_tool_loop_without_redeclared_tools",
    "speed_interactive__declared_tool_without_execution_intent",
    "speed_v2_quoted_tool_instruction",
    "speed_image_tools__deliberate_image_tools_collision",
    "speed_image__image_description",
]


@pytest.mark.parametrize("probe", ROUTED)
async def test_upstream_probe_routes_as_upstream_expects(stack: Stack, probe: str) -> None:
    expected, variant = variants()[probe]
    status, doc = await stack.preview(envelope(variant))
    assert status == 200, doc
    assert doc["decision_result"]["decision_name"] == DECISION_HERE[expected]
    assert doc["signal_errors"] == {}
    matched = doc["decision_result"]["matched_signals"]
    for family, names in (variant.get("expected_signals") or {}).items():
        for name in names:
            if name in DECLARED.get(family, set()):
                assert name in matched.get(family, []), (family, name, matched)
    want = {"tools": "tool-caller", "reasoning": "reasoner", "fast": "fast"}[expected]
    assert doc["selected_model"] == want
    assert all(b.received == [] for b in stack.backends)  # a preview calls no backend


@pytest.mark.parametrize(
    "probe",
    [
        "balance_tools__named_choice_without_text_intent",
        "speed_tools__required_choice_without_text_intent",
    ],
)
async def test_tool_choice_probes_are_accepted_and_see_the_tools(stack: Stack, probe: str) -> None:
    _, variant = variants()[probe]
    body = envelope(variant)
    assert "tool_choice" in body and body["tools"]
    status, doc = await stack.preview(body)
    assert status == 200, doc
    assert "has_tools" in doc["decision_result"]["matched_signals"]["conversation"]
    assert "tool_intent" not in doc["decision_result"]["matched_signals"].get("keywords", [])


async def test_one_handler_two_paths_one_answer(stack: Stack) -> None:
    _, variant = variants()["speed_tools__weather_function"]
    body = envelope(variant)
    status_p, preview = await stack.preview(body)
    status_e, evaluated = await stack.post("/api/v1/eval", body)
    assert status_p == status_e == 200
    for doc in (preview, evaluated):  # per-signal timings differ from call to call
        for family in doc.pop("metrics").values():
            assert family["execution_time_ms"] >= 0
    assert preview == evaluated
    assert preview["decision_result"]["decision_name"] == "tools"


async def test_trace_from_options_or_the_query(stack: Stack) -> None:
    body = {"text": "Use the search tool to find it.", "tools": [{"type": "function"}]}
    _, plain = await stack.preview(body)
    assert "eval_trace" not in plain
    _, traced = await stack.preview({**body, "options": {"trace": True}})
    _, queried = await stack.preview(body, "?trace=true")
    for doc in (traced, queried):
        trees = {t["decision_name"]: t for t in doc["eval_trace"]}
        assert set(trees) == {"reasoning", "tools"}
        assert trees["tools"]["matched"] is True and trees["reasoning"]["matched"] is False


async def test_the_envelope_is_strict_on_the_preview_path_only(stack: Stack) -> None:
    body = {"text": "Use the search tool.", "stream": True}
    status, doc = await stack.preview(body)
    assert status == 400
    assert doc["error"]["code"] == "INVALID_INPUT"
    assert doc["error"]["message"].startswith("field stream: unknown field")
    assert doc["error"]["timestamp"]
    status, doc = await stack.preview(body, "?trace=true")  # the query does not change the path
    assert status == 400 and "stream" in doc["error"]["message"]
    status, doc = await stack.post("/api/v1/eval", body)  # 3d48f8c9's eval reads what it knows
    assert status == 200 and doc["original_text"] == "Use the search tool."
    status, doc = await stack.post("/api/v1/eval", {"text": "x", "options": "trace"})
    assert status == 400  # it was a 500 internal_error
    assert doc["error"]["message"] == (
        'field options: got "trace"; accepted: an object (e.g. {"trace": true})'
    )
    status, doc = await stack.preview({"text": "x", "preview_context": {"sampling_seed": "7"}})
    assert status == 400
    assert "preview_context.sampling_seed" in doc["error"]["message"]
    status, doc = await stack.preview(b'{"text": "x", "options": {"confidence_threshold": NaN}}')
    assert status == 400 and "NaN" in doc["error"]["message"]


async def test_preview_refuses_a_model_that_is_not_an_auto_name(stack: Stack) -> None:
    status, doc = await stack.preview({"text": "hi", "model": "reasoner"})
    assert (status, doc["error"]["code"]) == (400, "INVALID_ROUTING_MODEL")
    status, doc = await stack.preview(
        {"messages": [{"role": "user", "content": "hi"}], "preview_context": {"session_id": "s"}}
    )
    assert status == 200 and doc["requested_model"] == "vllm-sr/auto"


async def test_the_frontend_serves_the_preview_path_strictly() -> None:
    from tests.integration.test_router_publish import PlanChangingService, plan_to
    from vllm_sr.frontend.app import Frontend
    from vllm_sr.httpserver import Request

    backend = await StandInBackend("m").start()
    frontend = Frontend(PlanChangingService(plan_to(backend)))
    try:
        await frontend.sync_router()
        good = json.dumps({"text": "hi", "model": "auto", "options": {"trace": True}}).encode()
        answer = await frontend.handle(Request("POST", "/api/v1/routing/preview", "", {}, good))
        assert answer.status == 200
        doc = json.loads(answer.body)
        assert doc["requested_model"] == "auto" and doc["selected_model"] == "m"
        assert doc["eval_trace"] == []  # traced, and this routing has no decision
        bad = json.dumps({"text": "hi", "model": "auto", "user": "u"}).encode()
        answer = await frontend.handle(Request("POST", "/api/v1/routing/preview", "", {}, bad))
        assert answer.status == 400
        assert json.loads(answer.body)["error"]["message"].startswith("field user: unknown")
        answer = await frontend.handle(Request("POST", "/api/v1/eval", "", {}, bad))
        assert answer.status == 200
        assert backend.received == []
    finally:
        await frontend.stop()
        await backend.stop()
