"""The Responses API on a real `vllm-sr serve`: upstream's maintained privacy recipe (backends
pointed at a local stand-in) with the agent recipe's ``global.services.response_api`` block as
upstream ships it (memory store, ttl 86400, max_responses 1000) serves /v1/responses on the
frontend's listener through the official openai SDK: created, routed, chained, streamed,
retrieved and deleted. Without the block, /v1/responses is a 404 saying how to turn it on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml

from tests.integration.test_serve import free_port
from tests.integration.test_serve_recipes import RECIPES, first_probe, pointed_at
from tests.support.backends import StandInBackend
from tests.support.serving import served

pytestmark = pytest.mark.slow


def agent_response_api() -> dict[str, Any]:
    agent = yaml.safe_load((RECIPES / "agent" / "config.yaml").read_text())
    block: dict[str, Any] = agent["global"]["services"]["response_api"]
    return block


async def test_the_agent_recipes_response_api_block_is_served(tmp_path: Path) -> None:
    backend = await StandInBackend("llm").start()
    doc = pointed_at("privacy", backend.endpoint)
    block = agent_response_api()
    assert block == {"enabled": True, "store_backend": "memory", "ttl_seconds": 86400,
                     "max_responses": 1000}  # fmt: skip
    doc.setdefault("global", {}).setdefault("services", {})["response_api"] = block
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    text = first_probe("privacy")
    try:
        async with served(config, url, "--listen", f"127.0.0.1:{port}", log=tmp_path / "s.log"):
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            headers = {"x-authz-user-id": "alice"}
            raw = await client.responses.with_raw_response.create(
                model="vllm-sr/auto", input=text, extra_headers=headers
            )
            first = raw.parse()
            assert first.output_text == f"llm got: {text}"
            assert raw.headers["x-vsr-selected-model"]  # routed like a chat
            second = await client.responses.create(
                model="vllm-sr/auto",
                input="and then?",
                previous_response_id=first.id,
                extra_headers=headers,
            )
            messages = backend.received[-1].body["messages"]
            assert {"role": "user", "content": text} in messages
            assert messages[-1] == {"role": "user", "content": "and then?"}
            stream = await client.responses.create(
                model="vllm-sr/auto", input="stream it", stream=True, extra_headers=headers
            )
            events = [e async for e in stream]
            assert events[-1].type == "response.completed"
            assert (await client.responses.retrieve(second.id)).output_text == "llm got: and then?"
            await client.responses.delete(second.id)
            with pytest.raises(openai.NotFoundError):
                await client.responses.retrieve(second.id)
            await client.close()
            async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
                metrics = await r.text()
            assert 'vllm_sr_router_responses_stored_total{store="memory"} 3.0' in metrics
            assert 'vllm_sr_router_responses_store_failures_total{store="memory"} 0.0' in metrics
    finally:
        await backend.stop()


async def test_without_the_block_responses_are_not_served(tmp_path: Path) -> None:
    backend = await StandInBackend("llm").start()
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(pointed_at("privacy", backend.endpoint), sort_keys=False))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    try:
        async with (
            served(config, url, "--listen", f"127.0.0.1:{port}", log=tmp_path / "s.log"),
            aiohttp.ClientSession() as s,
            s.post(url + "/v1/responses", json={"model": "vllm-sr/auto", "input": "x"}) as r,
        ):
            assert r.status == 404
            err = (await r.json())["error"]
            assert err["code"] == "responses_api_off"
            assert "global.services.response_api" in err["message"]
    finally:
        await backend.stop()
