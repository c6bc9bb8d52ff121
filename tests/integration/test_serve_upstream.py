"""An upstream-shaped config on a real `vllm-sr serve`: upstream's own signal fragments
(tests/fixtures/upstream, unchanged) under `routing.signals`, a `listeners:` entry and no
`global.model_catalog` at all. Every family here is model-free, so no worker runs (issue 39);
the service listens where the listener says. Chats go through the official openai SDK and
are routed by each deterministic family; /api/v1/eval answers on the same port."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml

from tests.integration.test_router_upstream import DECISIONS, upstream_signals
from tests.integration.test_serve import free_port
from tests.support.backends import StandInBackend
from tests.support.serving import served

pytestmark = pytest.mark.slow


def upstream_config(port: int, general: str, coder: str) -> dict[str, Any]:
    return {
        "version": "v0.3",
        "listeners": [{"name": "http", "address": "127.0.0.1", "port": port, "timeout": "300s"}],
        "providers": {
            "defaults": {
                "default_model": "general",
                "reasoning_families": {
                    "qwen3": {"type": "chat_template_kwargs", "parameter": "enable_thinking"}
                },
            },
            "models": [
                {"name": "general", "backend_refs": [{"endpoint": general}]},
                {
                    "name": "coder",
                    "reasoning_family": "qwen3",
                    "backend_refs": [{"endpoint": coder, "weight": 1}],
                },
            ],
        },
        "routing": {"signals": upstream_signals(), "decisions": DECISIONS},
    }


def tool(i: int) -> dict[str, Any]:
    return {"type": "function", "function": {"name": f"t{i}", "parameters": {}}}


async def test_upstream_fragments_route_on_a_real_serve_with_the_embedded_default(
    tmp_path: Path,
) -> None:
    general = await StandInBackend("general").start()
    coder = await StandInBackend("coder").start()
    port = free_port()
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(upstream_config(port, general.endpoint, coder.endpoint)))
    log = tmp_path / "serve.log"
    url = f"http://127.0.0.1:{port}"
    try:  # no --listen: the listener's port
        async with served(config, url, log=log):
            await routes_by_every_family(url, log, coder)
    finally:
        await general.stop()
        await coder.stop()


async def routes_by_every_family(url: str, log: Path, coder: StandInBackend) -> None:
    assert "routing needs no model, so no worker runs" in log.read_text()
    assert "the embedded default runs" not in log.read_text()
    assert "language models loaded" in log.read_text()  # before the loop, not on a chat
    assert "written" not in log.read_text()  # no deployment flag: the file is left alone
    client = openai.AsyncOpenAI(
        base_url=url + "/v1",
        api_key="unused",
        max_retries=0,
        default_headers={"x-authz-user-id": "alice"},
    )
    models = {m.id for m in (await client.models.list()).data}
    assert {"vllm-sr/auto", "auto", "MoM", "general", "coder"} <= models
    assert "primary" not in models  # no deployment, no worker
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("no_consent", "hello", {"extra_body": {"metadata": {"consent": "denied"}}}),
        ("admins", "hello", {"extra_headers": {"x-authz-user-groups": "platform-admins"}}),
        ("long", "word " * 40_000, {}),  # context: about 50K tokens by upstream's estimate
        ("questions", "Why? How? When? Where?", {}),
        ("agentic", "go", {"tools": [tool(i) for i in range(3)]}),  # conversation
        ("spanish", "¿Dónde está la estación de tren? Necesito llegar pronto a casa.", {}),
        ("urgent", "this is urgent please", {}),
    ]
    for decision, text, extra in cases:
        raw = await client.chat.completions.with_raw_response.create(
            model="MoM",
            messages=[{"role": "user", "content": text}],
            **extra,
        )
        assert raw.headers["x-vsr-selected-decision"] == decision, (decision, raw.headers)
        assert "x-vsr-routing-fallback" not in raw.headers, raw.headers  # backends healthy
    assert coder.received[-1].body["chat_template_kwargs"] == {"enable_thinking": True}
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/api/v1/eval", json={"text": "1. first\n2. then"}) as r,
    ):
        doc = await r.json()
    assert r.status == 200
    assert "numbered_steps" in doc["decision_result"]["matched_signals"]["structure"]
