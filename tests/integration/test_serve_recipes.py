"""Upstream's maintained recipes on a real `vllm-sr serve`: each config file as upstream ships it
(tests/fixtures/upstream/recipes), with only its backends pointed at a local stand-in, loads,
starts with the embedded d3-edge worker and routes a chat from its own probes through the
official openai SDK to the decision `/api/v1/eval` names for the same text. (agent and balance
still refuse Router Learning and the Responses API, which vllm-sr does not run: see
docs/router.md.)"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml

from tests.integration.test_serve import free_port
from tests.integration.test_supervisor_fake import REPO_ROOT
from tests.support.backends import StandInBackend
from tests.support.workers import short_socket_dir

pytestmark = pytest.mark.slow
RECIPES = Path(__file__).resolve().parents[1] / "fixtures" / "upstream" / "recipes"


def pointed_at(recipe: str, endpoint: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((RECIPES / recipe / "config.yaml").read_text())
    for model in doc["providers"]["models"]:
        for ref in model.get("backend_refs") or []:
            ref["endpoint"] = endpoint
    return doc


def first_probe(recipe: str) -> str:
    probes = yaml.safe_load((RECIPES / recipe / "probes.yaml").read_text())
    query: str = probes["decisions"][0]["variants"][0]["query"]
    return query


async def wait_ready(url: str, proc: asyncio.subprocess.Process, log: Path) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert proc.returncode is None, log.read_text()[-3000:]
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with aiohttp.ClientSession() as s, s.get(url + "/health") as r:
                if r.status == 200:
                    return
        await asyncio.sleep(0.2)
    raise AssertionError("not ready:\n" + log.read_text()[-3000:])


@pytest.mark.parametrize("recipe", ["feedback", "knowledge", "privacy"])
async def test_a_maintained_recipe_loads_unchanged_and_serves(tmp_path: Path, recipe: str) -> None:
    backend = await StandInBackend("llm").start()
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(pointed_at(recipe, backend.endpoint), sort_keys=False))
    port = free_port()
    run = short_socket_dir(prefix="vsr-recipe-") / "run"
    log = tmp_path / "serve.log"
    argv = [sys.executable, "-m", "vllm_sr.cli", "serve", "--config", str(config)]
    argv += ["--listen", f"127.0.0.1:{port}", "--runtime-dir", str(run)]
    argv += ["--control-socket", str(run / "c")]
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    env.pop("VLLM_SR_WORKER_ARGV", None)
    with open(log, "wb") as out:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=out, stderr=out, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(url, proc, log)
        text = first_probe(recipe)
        async with (
            aiohttp.ClientSession() as s,
            s.post(url + "/api/v1/eval", json={"text": text}) as r,
        ):
            assert r.status == 200, await r.text()
            doc = await r.json()
        assert doc["signal_errors"] == {}, doc["signal_errors"]
        decision = doc["decision_result"]["decision_name"]
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        raw = await client.chat.completions.with_raw_response.create(
            model="vllm-sr/auto",
            messages=[{"role": "user", "content": text}],
            extra_headers={"x-authz-user-id": "alice"},
        )
        assert raw.parse().choices[0].message.content == f"llm got: {text}"
        assert raw.headers.get("x-vsr-selected-decision", "") == decision
        assert raw.headers["x-vsr-selected-model"] in {
            m["name"] for m in yaml.safe_load(config.read_text())["providers"]["models"]
        }
        assert "x-vsr-routing-fallback" not in raw.headers
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 60)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        await backend.stop()
