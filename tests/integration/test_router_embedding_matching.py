"""Embedding top_k and soft matching on real sockets: the Router-mode handlers in a real aiohttp
server, real stand-in backends, the official openai SDK as the client, and a fake exchange that
answers bundles in the worker's own format. Upstream's ``support.yaml`` embedding fragment;
what ``global.model_catalog.embeddings.semantic.embedding_config`` says changes which
embedding signals match, so where the chat goes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import openai
import yaml

from tests.support.backends import FakeWorkerExchange, StandInBackend
from vllm_sr.config.files import parse_config
from vllm_sr.httpserver import HttpServer, Request, Response, StreamResponse, resolve
from vllm_sr.router.backends import BackendSet
from vllm_sr.router.chat import build_chat_router

FRAGMENT = Path(__file__).parents[1] / "fixtures/upstream/fragments/signal/embedding/support.yaml"
# Under both rules' thresholds (0.75, 0.72), over 0.5 for both, account_management's the better
# score (toy embeddings: test_embedding_matching checks these facts).
BOTH_SOFT = "account settings troubleshooting steps"
TECH_HARD = "how to configure the system"


def config(backends: dict[str, StandInBackend], embedding_config: dict[str, Any] | None) -> str:
    signals = yaml.safe_load(FRAGMENT.read_text())["routing"]["signals"]
    doc: dict[str, Any] = {
        "providers": {
            "defaults": {"default_model": "general"},
            "models": [
                {"name": name, "backend_refs": [{"endpoint": b.endpoint}]}
                for name, b in backends.items()
            ],
        },
        "routing": {
            "signals": signals,
            "decisions": [
                {
                    "name": "support",
                    "priority": 20,
                    "rules": {"type": "embedding", "name": "technical_support"},
                    "modelRefs": [{"model": "tech"}],
                },
                {
                    "name": "account",
                    "priority": 10,
                    "rules": {"type": "embedding", "name": "account_management"},
                    "modelRefs": [{"model": "accounts"}],
                },
            ],
        },
    }
    if embedding_config is not None:
        semantic = {"embedding_config": embedding_config}
        doc["global"] = {"model_catalog": {"embeddings": {"semantic": semantic}}}
    return yaml.safe_dump(doc)


@asynccontextmanager
async def serving(
    embedding_config: dict[str, Any] | None,
) -> AsyncIterator[tuple[openai.AsyncOpenAI, dict[str, StandInBackend]]]:
    backends = {n: await StandInBackend(n).start() for n in ("general", "tech", "accounts")}
    root = parse_config(config(backends, embedding_config))
    assert root.providers is not None and root.routing is not None
    live = BackendSet(root.providers)
    await live.start(health_checks=False)
    chat = build_chat_router(
        root.providers,
        root.routing,
        exchange=FakeWorkerExchange({"primary"}),
        decision_deployment="primary",
        auto_model_names=["vllm-sr/auto"],
        backends=live,
        global_=root.global_,
        cache=None,
    )
    routes = chat.routes()

    async def handle(request: Request) -> Response | StreamResponse:
        return await resolve(routes, request)(request)

    server = HttpServer(handle, max_body=1 << 20, read_timeout_s=30, cancel_on_disconnect=True)
    _, port = await server.listen_tcp("127.0.0.1", 0)
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0
    )
    try:
        yield client, backends
    finally:
        await client.close()
        await server.close(5.0)
        await live.close()
        for b in backends.values():
            await b.stop()


async def routed(client: openai.AsyncOpenAI, text: str, *, stream: bool = False) -> dict[str, str]:
    messages: Any = [{"role": "user", "content": text}]
    if stream:
        async with client.chat.completions.with_streaming_response.create(
            model="vllm-sr/auto", messages=messages, stream=True
        ) as raw:
            body = "".join([line async for line in raw.iter_lines()])
            assert "[DONE]" in body
            return dict(raw.headers)
    answer = await client.chat.completions.with_raw_response.create(
        model="vllm-sr/auto", messages=messages
    )
    return dict(answer.headers)


def signals_of(headers: dict[str, str]) -> list[str]:
    return sorted(s for s in headers.get("x-vsr-matched-signals", "").split(",") if s)


async def test_upstreams_defaults_soft_match_and_keep_the_best_one() -> None:
    """No embedding_config: upstream's defaults, soft matching on and top_k 1."""
    async with serving(None) as (client, backends):
        headers = await routed(client, BOTH_SOFT)
        assert signals_of(headers) == ["embedding:account_management"]
        assert headers["x-vsr-selected-decision"] == "account"
        assert headers["x-vsr-selected-model"] == "accounts"
        streamed = await routed(client, BOTH_SOFT, stream=True)
        assert streamed["x-vsr-selected-decision"] == "account"
        hard = await routed(client, TECH_HARD)  # a hard match: no soft ones beside it
        assert signals_of(hard) == ["embedding:technical_support"]
        assert hard["x-vsr-selected-model"] == "tech"
        assert len(backends["accounts"].received) == 2 and len(backends["tech"].received) == 1


async def test_top_k_0_keeps_every_soft_match_so_priority_decides() -> None:
    async with serving({"top_k": 0}) as (client, backends):
        headers = await routed(client, BOTH_SOFT)
        assert signals_of(headers) == [
            "embedding:account_management",
            "embedding:technical_support",
        ]
        assert headers["x-vsr-selected-decision"] == "support"  # priority 20 over 10
        assert [r.body["messages"][0]["content"] for r in backends["tech"].received] == [BOTH_SOFT]


async def test_without_soft_matching_nothing_matches_and_the_default_model_answers() -> None:
    async with serving({"top_k": 0, "enable_soft_matching": False}) as (client, backends):
        headers = await routed(client, BOTH_SOFT)
        assert signals_of(headers) == []
        assert "x-vsr-selected-decision" not in headers
        assert headers["x-vsr-selected-model"] == "general"
        assert len(backends["general"].received) == 1
