"""The router is built when a plan is published, never on a user's request (issue 36 item 6):
the frontend's chat mount builds a generation's router apart from the one serving, swaps it in
one step, and closes the old one's resources only once its chats in flight have finished; on
real sockets (stand-in LLM backends, the real outbound client)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.backends import StandInBackend
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.frontend.app import Frontend
from vllm_sr.frontend.chat_mount import ChatMount
from vllm_sr.httpserver import Request, Response, StreamResponse
from vllm_sr.plan import RouterPlan
from vllm_sr.pool.directory import PoolDirectory


def plan_to(backend: StandInBackend) -> RouterPlan:
    providers = Providers.model_validate(
        {
            "defaults": {"default_model": "m"},
            "models": [{"name": "m", "backend_refs": [{"endpoint": backend.endpoint}]}],
        }
    )
    return RouterPlan(True, ("auto",), providers, Routing(), "primary")


def chat_request(text: str) -> Request:
    body = {"model": "auto", "messages": [{"role": "user", "content": text}]}
    return Request("POST", "/v1/chat/completions", "", {}, json.dumps(body).encode())


def content_of(answer: Response | StreamResponse) -> str:
    assert isinstance(answer, Response) and answer.status == 200, answer
    return str(json.loads(answer.body)["choices"][0]["message"]["content"])


async def until(cond: Callable[[], Any], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_a_swap_serves_new_chats_while_chats_in_flight_finish_on_the_old_router() -> None:
    old, new = await StandInBackend("old").start(), await StandInBackend("new").start()
    old.hold = asyncio.Event()
    mount = ChatMount(PoolDirectory())
    try:
        await mount.update(plan_to(old))
        first_chat, first_backends = mount.chat, mount._backends
        assert first_chat is not None and first_backends is not None
        in_flight = asyncio.ensure_future(mount.handle_chat(chat_request("held"), True))
        await until(lambda: old.inflight == 1)

        staged = await mount.build(plan_to(new))
        assert mount.chat is first_chat  # a build leaves the serving router alone
        retired = mount.swap(staged)
        assert mount.chat is staged.chat and mount.plan == plan_to(new)
        assert content_of(await mount.handle_chat(chat_request("after"), True)) == (
            "new got: after"
        )

        retiring = asyncio.ensure_future(mount.retire(retired))
        with pytest.raises(TimeoutError):  # the old router's chat is still in flight
            await asyncio.wait_for(asyncio.shield(retiring), 0.2)
        first_backends.clients  # noqa: B018  still open: raises once closed
        old.hold.set()
        assert content_of(await in_flight) == "old got: held"  # finished on the old router
        await asyncio.wait_for(retiring, 10)
        with pytest.raises(RuntimeError, match="start"):
            first_backends.clients  # noqa: B018  closed once its chat finished
    finally:
        old.hold.set()
        await mount.close()
        await old.stop()
        await new.stop()


async def test_a_retired_router_whose_chat_never_ends_is_closed_after_the_grace() -> None:
    old, new = await StandInBackend("old").start(), await StandInBackend("new").start()
    old.hold = asyncio.Event()
    mount = ChatMount(PoolDirectory(), retire_grace_s=0.2)
    try:
        await mount.update(plan_to(old))
        first_backends = mount._backends
        assert first_backends is not None
        in_flight = asyncio.ensure_future(mount.handle_chat(chat_request("held"), True))
        await until(lambda: old.inflight == 1)
        await asyncio.wait_for(mount.update(plan_to(new)), 10)  # bounded by the grace
        with pytest.raises(RuntimeError, match="start"):
            first_backends.clients  # noqa: B018
        in_flight.cancel()
    finally:
        old.hold.set()
        await mount.close()
        await old.stop()
        await new.stop()


async def test_a_failed_build_is_discarded_and_the_serving_router_stays() -> None:
    old, new = await StandInBackend("old").start(), await StandInBackend("new").start()
    mount = ChatMount(PoolDirectory())
    try:
        await mount.update(plan_to(old))
        serving = mount.chat
        staged = await mount.build(plan_to(new))
        assert staged.backends is not None and staged.backends is not mount._backends
        await mount.discard(staged)
        with pytest.raises(RuntimeError, match="start"):
            staged.backends.clients  # noqa: B018  the staged backends were closed
        assert mount.chat is serving
        assert content_of(await mount.handle_chat(chat_request("x"), True)) == "old got: x"
    finally:
        await mount.close()
        await old.stop()
        await new.stop()


class PlanChangingService:
    """A service whose published router plan changes (its directory's generation too)."""

    def __init__(self, plan: RouterPlan) -> None:
        self.directory = PoolDirectory()
        self.admitting = True
        self.plan = plan

    def router_plan(self) -> RouterPlan:
        return self.plan

    def inventory(self) -> dict[str, Any]:
        return {}

    def health(self) -> dict[str, Any]:
        return {"ready": True}


async def test_a_request_never_builds_a_router(monkeypatch: pytest.MonkeyPatch) -> None:
    old, new = await StandInBackend("old").start(), await StandInBackend("new").start()
    service = PlanChangingService(plan_to(old))
    frontend = Frontend(service)
    try:
        await frontend.sync_router()  # what start does
        built: list[object] = []
        build = ChatMount.build

        async def counting(self: ChatMount, plan: RouterPlan | None) -> Any:
            built.append(plan)
            return await build(self, plan)

        monkeypatch.setattr(ChatMount, "build", counting)
        # a new generation is published without its router being handed over: requests
        # keep being served by the router that was built, and none of them builds one
        service.plan = plan_to(new)
        service.directory.publish({}, "primary", {}, service.directory.generation + 1)
        body = chat_request("hi").body
        for method, path in (
            ("POST", "/v1/chat/completions"),
            ("POST", "/api/v1/eval"),
            ("GET", "/v1/models"),
            ("GET", "/metrics"),
        ):
            answer = await frontend.handle(Request(method, path, "", {}, body))
            assert answer.status == 200, (path, answer)
        assert built == []
        assert old.received and not new.received
    finally:
        await frontend.stop()
        await old.stop()
        await new.stop()
