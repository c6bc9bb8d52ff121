"""Upstream v0.4's released built-in bundle (tests/fixtures/upstream/v0.4/mom-v1, the wheel's
``cli/model_assets/v0.4/mom-v1``) on a real `vllm-sr serve`. The bundle is loaded unchanged; it
ships neither ``providers`` nor ``entrypoints`` (upstream's v0.4 CLI adds them), so the test adds
one model whose backend is a local stand-in and one entrypoint per recipe, as
``bench/router_probes.py`` does, and nothing else. For each of the five recipes a plain-text
probe of its own goes through the official openai SDK and lands on the decision that
``/api/v1/routing/preview`` names for the same request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml

from tests.support.backends import StandInBackend
from tests.support.serving import free_port, served

pytestmark = pytest.mark.slow
BUNDLE = Path(__file__).resolve().parents[1] / "fixtures/upstream/v0.4/mom-v1"
ENTRY = "vllm-sr/mom-v1-{}"
LOOPERS = {"confidence", "ratings", "remom", "fusion", "workflows"}


def completed(endpoint: str) -> tuple[dict[str, Any], list[str]]:
    """The unchanged bundle plus a stand-in model and one entrypoint per recipe."""
    doc: dict[str, Any] = yaml.safe_load((BUNDLE / "config.yaml").read_text())
    assert "providers" not in doc and "entrypoints" not in doc  # nothing of the bundle replaced
    doc["providers"] = {
        "defaults": {"model": "stand-in"},
        "models": [{"name": "stand-in", "backend_refs": [{"endpoint": endpoint}]}],
    }
    recipes = [r["name"] for r in doc["recipes"]]
    doc["entrypoints"] = [{"model_names": [ENTRY.format(n)], "recipe": n} for n in recipes]
    return doc, recipes


def plain_probes() -> dict[str, str]:
    """Per recipe, its first probe that is one plain text (no padding, tools or messages)."""
    probes = yaml.safe_load((BUNDLE / "probes.yaml").read_text())["decisions"]
    out: dict[str, str] = {}
    for probe in probes:
        recipe = probe.get("expected_recipe")
        for variant in probe["variants"]:
            plain = not ({"padding", "tools", "messages", "functions"} & variant.keys())
            if recipe and recipe not in out and plain and variant.get("query"):
                out[recipe] = variant["query"]
    return out


async def test_v04_mom_v1_loads_unchanged_and_serves_every_recipe(tmp_path: Path) -> None:
    backend = await StandInBackend("llm").start()
    doc, recipes = completed(backend.endpoint)
    probes = plain_probes()
    assert set(probes) == set(recipes), (sorted(probes), recipes)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    routed: dict[str, str] = {}
    try:
        async with served(config, url, "--listen", f"127.0.0.1:{port}", log=tmp_path / "s.log"):
            for recipe in recipes:
                text, model = probes[recipe], ENTRY.format(recipe)
                preview = await previewed(url, text, model)
                assert preview["signal_errors"] == {}, (recipe, preview["signal_errors"])
                decision = preview["decision_result"]["decision_name"]
                raw = await client.chat.completions.with_raw_response.create(
                    model=model,
                    messages=[{"role": "user", "content": text}],
                    extra_headers={"x-vsr-debug": "true"},
                )
                assert raw.status_code == 200, (recipe, raw.text)
                assert raw.headers.get("x-vsr-selected-decision", "") == decision, recipe
                assert raw.headers.get("x-vsr-selected-recipe") == recipe
                assert "x-vsr-routing-fallback" not in raw.headers, (recipe, raw.headers)
                content = raw.parse().choices[0].message.content
                if raw.headers.get("x-vsr-fast-response") == "true":  # vault's guard
                    assert content and "cannot be processed" in content, (recipe, content)
                elif preview["decision_result"].get("algorithm") in LOOPERS:
                    # accuracy's workflows / fusion: several internal calls, then one answer
                    assert raw.headers.get("x-vsr-looper-model"), (recipe, raw.headers)
                    assert content and content.startswith("llm got: "), (recipe, content)
                else:
                    assert content == f"llm got: {text}", (recipe, content)
                    assert raw.headers["x-vsr-selected-model"] == "stand-in"
                routed[recipe] = decision
    finally:
        await client.close()
        await backend.stop()
    assert set(routed) == set(recipes)


async def previewed(url: str, text: str, model: str) -> dict[str, Any]:
    body = {"text": text, "model": model, "options": {"trace": True}}
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/api/v1/routing/preview", json=body) as r,
    ):
        assert r.status == 200, await r.text()
        doc: dict[str, Any] = await r.json()
    return doc
