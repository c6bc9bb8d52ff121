"""Router mode on a real `vllm-sr serve` (real workers on a tiny BERT, two real stand-in LLM
backends, the official openai SDK as the client): auto routing by keyword and by embedding, a
concrete model, streaming, typed errors, one exchange on the decision deployment per routed
chat (the pools' accounting shows routing load apart from native), a signals-only reload that
keeps every worker, and Engine mode (-e) answering chat with a typed 404."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tests.integration.test_serve import free_port
from tests.integration.test_supervisor_fake import REPO_ROOT
from tests.support.backends import StandInBackend
from tests.support.workers import short_socket_dir

pytestmark = pytest.mark.slow


def config_text(artifact: Path, coder: str, general: str, billing_threshold: float) -> str:
    return f"""\
providers:
  defaults: {{default_model: general}}
  models:
    - name: general
      provider_model_id: big-general
      backend_refs: [{{endpoint: "{general}"}}]
    - name: coder
      backend_refs: [{{endpoint: "{coder}"}}]
routing:
  strategy: priority
  signals:
    keywords:
      - {{name: code, operator: OR, method: regex, keywords: [code, function, debug]}}
    embeddings:
      - name: billing
        threshold: {billing_threshold}
        candidates: [I want a refund for my order, I was charged twice]
  decisions:
    - name: coding
      priority: 100
      rules: {{operator: AND, conditions: [{{type: keyword, name: code}}]}}
      modelRefs: [{{model: coder}}]
    - name: billing
      priority: 50
      rules: {{operator: OR, conditions: [{{type: embedding, name: billing}}]}}
      modelRefs: [{{model: general}}]
global:
  model_catalog:
    deployments:
      primary:
        artifact: {artifact}
        replicas: [{{device: cpu}}, {{device: cpu}}]
"""


class Served:
    def __init__(
        self, proc: asyncio.subprocess.Process, url: str, log: Path, control: Path
    ) -> None:
        self.proc, self.url, self.log, self.control = proc, url, log, control

    async def inventory(self) -> dict[str, Any]:
        url = self.url + "/api/v1/inventory/model-runtime"
        async with aiohttp.ClientSession() as s, s.get(url) as r:
            return dict(await r.json())

    async def routing_exchanges(self) -> int:
        inv = await self.inventory()
        return sum(
            r["requests_by_kind"].get("routing", 0) for r in inv["deployments"][0]["replicas"]
        )


@contextlib.asynccontextmanager
async def serve(
    config: Path, *flags: str, env: dict[str, str] | None = None
) -> AsyncIterator[Served]:
    """A real `vllm-sr serve` with the real worker, until every replica is ready."""
    port = free_port()
    run = short_socket_dir(prefix="vsr-router-") / "run"
    log = config.with_suffix(".log")
    argv = [sys.executable, "-m", "vllm_sr.cli", "serve", *flags, "--config", str(config)]
    argv += ["--listen", f"127.0.0.1:{port}", "--runtime-dir", str(run)]
    argv += ["--control-socket", str(run / "c")]
    full_env = {**os.environ, "PYTHONPATH": REPO_ROOT, **(env or {})}
    full_env.pop("VLLM_SR_WORKER_ARGV", None)
    with open(log, "wb") as out:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=out, stderr=out, env=full_env)
    served = Served(proc, f"http://127.0.0.1:{port}", log, run / "c")
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, KeyError, IndexError):
                dep = (await served.inventory())["deployments"][0]
                if dep["ready_replicas"] == len(dep["replicas"]) > 0:
                    break
            assert proc.returncode is None, log.read_text()
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("not ready:\n" + log.read_text()[-3000:])
        yield served
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 60)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def test_router_mode_on_a_real_serve(tmp_path: Path, tiny_bert_dir: Path) -> None:
    coder, general = await StandInBackend("coder").start(), await StandInBackend("general").start()
    config = tmp_path / "config.yaml"
    config.write_text(config_text(tiny_bert_dir, coder.endpoint, general.endpoint, 0.99))
    try:
        async with serve(config) as svc:
            client = openai.AsyncOpenAI(base_url=svc.url + "/v1", api_key="unused")
            models = {m.id for m in (await client.models.list()).data}
            assert {"vllm-sr/auto", "auto", "general", "coder", "primary"} <= models

            before = await svc.routing_exchanges()
            raw = await client.chat.completions.with_raw_response.create(
                model="auto", messages=[{"role": "user", "content": "please debug this function"}]
            )
            answer = raw.parse()
            assert raw.headers["x-vsr-selected-decision"] == "coding"
            assert raw.headers["x-vsr-selected-model"] == "coder"
            assert answer.choices[0].message.content == "coder got: please debug this function"
            assert coder.received[-1].body["model"] == "coder"
            # An embedding signal is referenced: the chat cost exactly one exchange on the
            # decision deployment, counted apart from native requests.
            assert await svc.routing_exchanges() == before + 1
            async with aiohttp.ClientSession() as s, s.get(svc.url + "/metrics") as r:
                metrics = await r.text()
            assert 'vllm_sr_router_decisions_total{decision="coding",model="coder"} 1.0' in metrics
            assert 'vllm_sr_router_signal_matches_total{signal="keyword:code"}' in metrics

            stream = await client.chat.completions.create(
                model="auto", messages=[{"role": "user", "content": "hello there"}], stream=True
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream])
            assert text == "general got: hello there"  # no decision: the default model
            assert general.received[-1].body["model"] == "big-general"  # provider_model_id

            direct = await client.chat.completions.create(
                model="coder", messages=[{"role": "user", "content": "no routing"}]
            )
            assert direct.choices[0].message.content == "coder got: no routing"
            with pytest.raises(openai.BadRequestError) as nf:
                await client.chat.completions.create(
                    model="nope", messages=[{"role": "user", "content": "x"}]
                )
            assert "auto" in str(nf.value) and "coder" in str(nf.value)

            inv = await svc.inventory()
            assert {b["model"] for b in inv["router"]["backends"]} == {"general", "coder"}
            pids = {r["id"]: r["pid"] for r in inv["deployments"][0]["replicas"]}

            # A signals-only change is a reload that keeps every worker.
            config.write_text(config_text(tiny_bert_dir, coder.endpoint, general.endpoint, 0.98))
            svc.proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 60
            while (await svc.inventory())["service"]["generation"] < 1:
                assert time.monotonic() < deadline, svc.log.read_text()[-2000:]
                await asyncio.sleep(0.1)
            inv = await svc.inventory()
            assert {r["id"]: r["pid"] for r in inv["deployments"][0]["replicas"]} == pids
    finally:
        await coder.stop()
        await general.stop()


async def test_engine_mode_answers_chat_with_a_typed_404(
    tmp_path: Path, tiny_bert_dir: Path
) -> None:
    config = tmp_path / "config.yaml"
    flags = (str(tiny_bert_dir), "-e", "--platform", "cpu")
    async with serve(config, *flags) as svc, aiohttp.ClientSession() as s:
        body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
        async with s.post(svc.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 404
            assert (await r.json())["error"]["code"] == "engine_mode"
        async with s.post(svc.url + "/v1/responses", json={"model": "auto", "input": "hi"}) as r:
            error = (await r.json())["error"]
            assert r.status == 404 and error["code"] == "engine_mode"
            assert error["message"].startswith("/v1/responses is not served")
        async with s.post(svc.url + "/v1/embeddings", json={"input": "still"}) as r:
            assert r.status == 200
    assert "enabled: false" in config.read_text()
