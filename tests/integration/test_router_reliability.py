"""``providers.models[].reliability`` on real sockets: the Router-mode handlers in our HTTP
server, real stand-in OpenAI-compatible backends that fail on demand, the official openai SDK
as the client. A retry reaches the model's other backend before the first byte; an ejected
backend gets no chats until its time is up (the set's clock is a fake one, moved by the test);
the health check probes the configured path."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from tests.support.backends import StandInBackend
from tests.support.router_app import AUTO, serve_routes, start_router
from vllm_sr.clock import SYSTEM_CLOCK, Clock, FakeClock
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.router.backends import BackendSet

# "fallback" in a chat: the decision tries m, then other
ROUTING = {
    "signals": {"keywords": [{"name": "fb", "operator": "OR", "keywords": ["fallback"]}]},
    "decisions": [
        {
            "name": "fb",
            "priority": 10,
            "rules": {"operator": "AND", "conditions": [{"type": "keyword", "name": "fb"}]},
            "modelRefs": [{"model": "m"}, {"model": "other"}],
        }
    ],
}


@dataclass
class Stack:
    first: StandInBackend
    second: StandInBackend
    other: StandInBackend
    backends: BackendSet
    client: openai.AsyncOpenAI


@pytest.fixture
async def make_stack() -> AsyncIterator[Callable[..., Any]]:
    """Builds a stack whose model ``m`` has two backends (first, second) with ``reliability``,
    and model ``other`` one backend without it."""
    cleanups: list[Callable[[], Any]] = []

    async def make(
        reliability: dict[str, Any], *, clock: Clock = SYSTEM_CLOCK, health_checks: bool = False
    ) -> Stack:
        first = await StandInBackend("first").start()
        second = await StandInBackend("second").start()
        other = await StandInBackend("other").start()
        providers = Providers.model_validate(
            {
                "defaults": {"default_model": "m"},
                "models": [
                    {
                        "name": "m",
                        "reliability": reliability,
                        "backend_refs": [
                            {"endpoint": first.endpoint},
                            {"endpoint": second.endpoint},
                        ],
                    },
                    {"name": "other", "backend_refs": [{"endpoint": other.endpoint}]},
                ],
            }
        )
        chat = await start_router(
            providers, Routing.model_validate(ROUTING), clock=clock, health_checks=health_checks
        )
        served = await serve_routes(chat.routes(), cancel_on_disconnect=False)

        async def cleanup() -> None:
            await served.close()
            await chat.backends.close()
            for b in (first, second, other):
                await b.stop()

        cleanups.append(cleanup)
        return Stack(first, second, other, chat.backends, served.client())

    yield make
    for cleanup in cleanups:
        await cleanup()


async def ask(client: openai.AsyncOpenAI, text: str, model: str = "m", **extra: Any) -> Any:
    return await client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": text}], **extra
    )


async def ask_stream(client: openai.AsyncOpenAI, text: str) -> tuple[Any, str]:
    raw = await client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": text}], stream=True
    )
    parts = [c.choices[0].delta.content or "" async for c in raw.parse() if c.choices]
    return raw, "".join(parts)


# -- retries -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "retry_on", "reason"),
    [
        ("reset", "reset", "reset"),
        ("503", "gateway-error", "http_503"),
        ("503", "5xx", "http_503"),
        ("stream_before_first", "reset", "stream_first_chunk"),
    ],
)
async def test_a_retry_reaches_the_second_backend(
    make_stack: Callable[..., Any], fault: str, retry_on: str, reason: str
) -> None:
    st = await make_stack({"retry_count": 1, "retry_on": retry_on})
    st.first.fault = fault  # the first pick (equal weights: the first backend)
    if fault.startswith("stream"):
        raw, text = await ask_stream(st.client, "hello")
    else:
        raw = await ask(st.client, "hello")
        text = raw.parse().choices[0].message.content
    assert text == "second got: hello"
    assert len(st.first.received) == 1 and len(st.second.received) == 1
    assert raw.headers["x-vsr-selected-model"] == "m"
    assert raw.headers["x-vsr-backend-retries"] == f"m_primary:{reason}"
    assert "x-vsr-backend-fallback" not in raw.headers
    first = next(b for b in st.backends.inventory() if b["id"] == "m_primary")
    assert first["retried_from"] == 1


async def test_a_failure_retry_on_does_not_name_is_the_answer(
    make_stack: Callable[..., Any],
) -> None:
    st = await make_stack({"retry_count": 2, "retry_on": "connect-failure,refused-stream"})
    st.first.fault = "503"
    with pytest.raises(openai.APIStatusError) as info:
        await ask(st.client, "hello")
    assert info.value.status_code == 503
    assert "first fault 503" in info.value.message  # the backend's own answer
    assert not st.second.received
    assert "x-vsr-backend-retries" not in info.value.response.headers


async def test_retries_stop_at_retry_count_and_at_the_last_backend(
    make_stack: Callable[..., Any],
) -> None:
    st = await make_stack({"retry_count": 5, "retry_on": "5xx"})
    st.first.fault = st.second.fault = "503"
    with pytest.raises(openai.APIStatusError) as info:
        await ask(st.client, "hello")
    assert info.value.status_code == 503
    # each backend once: a retry never goes back to a backend the chat tried
    assert len(st.first.received) == 1 and len(st.second.received) == 1
    assert info.value.response.headers["x-vsr-backend-retries"] == "m_primary:http_503"


async def test_retries_come_first_then_the_fallback_to_the_next_model(
    make_stack: Callable[..., Any],
) -> None:
    st = await make_stack({"retry_count": 1, "retry_on": "5xx"})
    st.first.fault = st.second.fault = "503"
    raw = await ask(st.client, "fallback please", model=AUTO)
    assert raw.parse().choices[0].message.content == "other got: fallback please"
    assert len(st.first.received) == 1 and len(st.second.received) == 1
    assert raw.headers["x-vsr-selected-model"] == "other"
    assert raw.headers["x-vsr-backend-retries"] == "m_primary:http_503"
    assert raw.headers["x-vsr-backend-fallback"] == "m:http_503"


# -- ejection ----------------------------------------------------------------------------------


async def test_an_ejected_backend_gets_no_chats_until_its_time_is_up(
    make_stack: Callable[..., Any],
) -> None:
    clock = FakeClock()
    st = await make_stack(
        {"consecutive_5xx": 2, "base_ejection_time": "10s", "max_ejection_percent": 50},
        clock=clock,
    )
    st.first.fault = "503"
    statuses = []
    for i in range(4):  # first, second, first (ejected now), second
        try:
            await ask(st.client, f"chat {i}")
            statuses.append(200)
        except openai.APIStatusError as exc:
            statuses.append(exc.status_code)
    assert statuses == [503, 200, 503, 200]
    assert len(st.first.received) == 2
    st.first.fault = None
    for i in range(4):
        await ask(st.client, f"while ejected {i}")
    assert len(st.first.received) == 2 and len(st.second.received) == 6
    doc = next(b for b in st.backends.inventory() if b["id"] == "m_primary")
    assert doc["ejections"] == 1 and doc["ejected_for_s"] == pytest.approx(10.0)
    clock.advance(9.9)
    await ask(st.client, "still ejected")
    assert len(st.first.received) == 2
    clock.advance(0.1)
    for i in range(2):
        await ask(st.client, f"back {i}")
    assert len(st.first.received) == 3  # its share again


# -- health checks -----------------------------------------------------------------------------


async def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_the_configured_health_check_path_is_the_one_probed(
    make_stack: Callable[..., Any],
) -> None:
    st = await make_stack(
        {
            "health_check_path": "/health",
            "health_check_interval": "100ms",
            "health_check_timeout": "2s",
        },
        health_checks=True,
    )
    await wait_for(lambda: len(st.first.probes) >= 3 and len(st.second.probes) >= 3)
    assert set(st.first.probes) == {"/health"} and set(st.second.probes) == {"/health"}
    assert set(st.other.probes) == {"/v1/models"}  # the default
    st.first.healthy = False  # /health answers 503 now
    first = st.backends.models["m"][0]
    await wait_for(lambda: first.health.state == "unhealthy")
    assert first.health.last_error == "GET /health answered 503"
