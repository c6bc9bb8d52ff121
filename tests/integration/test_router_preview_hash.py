"""The routing preview's config identity over a real HTTP server: the answer carries the
served config's hash (``config_hash``), and ``X-SR-Bench-Expected-Config-Hash`` naming another
config is refused with a 409 in upstream's error envelope, on both preview paths."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from tests.integration.test_router_preview import ROUTING
from tests.support.backends import StandInBackend
from tests.support.router_app import (
    Served,
    providers_on,
    routed_stand_ins,
)
from vllm_sr.config.routing import Routing
from vllm_sr.router.chat import ChatRouter

SERVED = hashlib.sha256(b"version: v0.3\n").hexdigest()
BODY = {"text": "what is the weather in Paris?", "model": "vllm-sr/auto"}


@dataclass
class Stack:
    served: Served
    chat: ChatRouter
    backends: list[StandInBackend]

    async def post(self, path: str, headers: dict[str, str]) -> tuple[int, Any]:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{self.served.url}{path}", data=json.dumps(BODY), headers=headers) as r,
        ):
            return r.status, await r.json()


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    names = ("fast", "tool-caller", "reasoner")
    async with routed_stand_ins(names, Routing.model_validate(ROUTING)) as r:
        r.chat.config_hash = SERVED  # read per request
        yield Stack(r.served, r.chat, list(r.backends.values()))


PATHS = ["/api/v1/routing/preview", "/api/v1/eval"]


@pytest.mark.parametrize("path", PATHS)
async def test_answer_names_the_served_config_hash(stack: Stack, path: str) -> None:
    status, doc = await stack.post(path, {})
    assert status == 200, doc
    assert doc["config_hash"] == SERVED


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("sent", [SERVED, SERVED.upper(), f'"{SERVED}"'])
async def test_a_matching_expected_hash_is_answered(stack: Stack, path: str, sent: str) -> None:
    status, doc = await stack.post(path, {"X-SR-Bench-Expected-Config-Hash": sent})
    assert status == 200, doc
    assert doc["config_hash"] == SERVED


@pytest.mark.parametrize("path", PATHS)
async def test_another_expected_hash_is_refused_409(stack: Stack, path: str) -> None:
    other = hashlib.sha256(b"another config").hexdigest()
    status, doc = await stack.post(path, {"X-SR-Bench-Expected-Config-Hash": other})
    assert status == 409, doc
    assert doc["error"]["code"] == "CONFIG_HASH_MISMATCH"
    assert other in doc["error"]["message"] and SERVED in doc["error"]["message"]
    assert set(doc["error"]) == {"code", "message", "timestamp"}
    assert all(b.received == [] for b in stack.backends)


async def test_without_a_config_file_any_expected_hash_is_refused(stack: Stack) -> None:
    stack.chat.config_hash = None
    status, doc = await stack.post("/api/v1/routing/preview", {})
    assert status == 200 and doc["config_hash"] is None
    status, doc = await stack.post(
        "/api/v1/routing/preview", {"X-SR-Bench-Expected-Config-Hash": SERVED}
    )
    assert status == 409 and doc["error"]["code"] == "CONFIG_HASH_MISMATCH"


async def test_the_mount_gives_each_generation_its_plans_hash() -> None:
    """The frontend's chat mount hands the plan's hash to the router it builds; a published
    generation with another text answers (and pins) with its own."""
    from vllm_sr.frontend.chat_mount import ChatMount
    from vllm_sr.httpserver import Request
    from vllm_sr.plan import RouterPlan
    from vllm_sr.pool.directory import PoolDirectory

    backend = await StandInBackend("m").start()
    plan = RouterPlan(True, ("vllm-sr/auto",), providers_on(backend), Routing(), "primary")
    mount = ChatMount(PoolDirectory())
    other = hashlib.sha256(b"version: v0.3\n# edited\n").hexdigest()

    async def preview(expected: str) -> tuple[int, Any]:
        headers = {"x-sr-bench-expected-config-hash": expected}
        answer = await mount.handle_eval(
            Request("POST", "/api/v1/routing/preview", "", headers, json.dumps(BODY).encode())
        )
        return answer.status, json.loads(answer.body)

    try:
        await mount.update(dataclasses.replace(plan, config_hash=SERVED))
        status, doc = await preview(SERVED)
        assert status == 200 and doc["config_hash"] == SERVED, doc
        await mount.update(dataclasses.replace(plan, config_hash=other))
        assert (await preview(SERVED))[0] == 409
        status, doc = await preview(other)
        assert status == 200 and doc["config_hash"] == other, doc
    finally:
        await mount.close()
        await backend.stop()


async def test_previews_past_max_concurrency_are_refused_429(stack: Stack) -> None:
    """``max_concurrency``: with one preview held in evaluation, the next is answered 429 at
    once (both paths share the gate); once it finishes, previews are answered again."""
    from vllm_sr.router.preview_limits import PreviewGate

    stack.chat.preview_gate = PreviewGate(max_concurrency=1)
    release, entered = asyncio.Event(), asyncio.Event()
    evaluate = stack.chat.evaluate

    async def held(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        await release.wait()
        return await evaluate(*args, **kwargs)

    stack.chat.evaluate = held  # type: ignore[method-assign]
    first = asyncio.ensure_future(stack.post("/api/v1/routing/preview", {}))
    await asyncio.wait_for(entered.wait(), 10)
    for path in PATHS:
        status, doc = await stack.post(path, {})
        assert status == 429, doc
        assert doc["error"]["code"] == "TOO_MANY_REQUESTS"
        assert "max_concurrency" in doc["error"]["message"]
    release.set()
    status, doc = await first
    assert status == 200, doc
    assert stack.chat.preview_gate.in_flight == 0
    assert (await stack.post("/api/v1/routing/preview", {}))[0] == 200


async def test_a_preview_past_its_deadline_is_answered_504(stack: Stack) -> None:
    """``request_timeout_seconds``: a preview still evaluating at its deadline is cancelled and
    answered 504 REQUEST_TIMEOUT in the error envelope (a short deadline set on the gate)."""
    from vllm_sr.router.preview_limits import PreviewGate

    stack.chat.preview_gate = PreviewGate(timeout_s=0.05)
    cancelled = asyncio.Event()

    async def stuck(*args: Any, **kwargs: Any) -> Any:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    stack.chat.evaluate = stuck  # type: ignore[method-assign]
    status, doc = await stack.post("/api/v1/routing/preview", {})
    assert status == 504, doc
    assert doc["error"]["code"] == "REQUEST_TIMEOUT"
    assert set(doc["error"]) == {"code", "message", "timestamp"}
    assert cancelled.is_set() and stack.chat.preview_gate.in_flight == 0
