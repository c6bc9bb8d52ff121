"""Router mode on a real `vllm-sr serve` (real workers on a tiny BERT, two real stand-in LLM
backends, the official openai SDK as the client): auto routing by keyword and by embedding, a
concrete model, streaming, typed errors, one exchange on the decision deployment per routed
chat (the pools' accounting shows routing load apart from native), a signals-only reload that
keeps every worker, and Engine mode (-e) answering chat with a typed 404."""

from __future__ import annotations

import signal
from pathlib import Path

import aiohttp
import openai
import pytest

from tests.support.serving import one_deployment, serve, stand_ins, two_models

pytestmark = pytest.mark.slow


def config_text(artifact: Path, coder: str, general: str, billing_threshold: float) -> str:
    routing = f"""\
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
"""
    return two_models(coder, general, "big-general") + routing + one_deployment(artifact, 2)


async def test_router_mode_on_a_real_serve(tmp_path: Path, tiny_bert_dir: Path) -> None:
    config = tmp_path / "config.yaml"
    async with stand_ins("coder", "general") as (coder, general):
        config.write_text(config_text(tiny_bert_dir, coder.endpoint, general.endpoint, 0.99))
        async with serve(config) as svc:
            client = openai.AsyncOpenAI(base_url=svc.url + "/v1", api_key="unused")
            models = {m.id for m in (await client.models.list()).data}
            assert {"vllm-sr/auto", "auto", "general", "coder", "primary"} <= models

            before = (await svc.routing_exchanges())["primary"]
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
            assert (await svc.routing_exchanges())["primary"] == before + 1
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
            await svc.until(lambda inv: inv["service"]["generation"] >= 1, 60)
            inv = await svc.inventory()
            assert {r["id"]: r["pid"] for r in inv["deployments"][0]["replicas"]} == pids


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
