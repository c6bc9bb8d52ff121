"""Signals fail one by one on a real `vllm-sr serve` (a real worker on a tiny BERT, real
stand-in LLM backends): with the decision deployment's one replica saturated (more routed chats
in flight than it admits, so the pool refuses some bundles with 429), a keyword decision still
routes every code chat to its model; the chats whose bundle was refused name the embedding
signal unknown (``x-vsr-unknown-signals``) and ``/metrics`` counts them by family and reason.
Before issue 36 those chats went to ``default_model`` with ``x-vsr-routing-fallback``."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.serving import Served, one_deployment, serve, stand_ins, two_models

pytestmark = pytest.mark.slow

IN_FLIGHT = 96  # three times the pool's 32 in flight per replica
ROUNDS_DEADLINE_S = 120.0


def config_text(artifact: Path, coder: str, general: str) -> str:
    routing = """\
routing:
  strategy: priority
  signals:
    keywords:
      - {name: code, operator: OR, keywords: [code, function, debug]}
    embeddings:
      - name: billing
        threshold: 0.99
        candidates: [I want a refund for my order, I was charged twice]
  decisions:
    - name: coding
      priority: 100
      rules: {type: keyword, name: code}
      modelRefs: [{model: coder}]
    - name: billing
      priority: 50
      rules: {type: embedding, name: billing}
      modelRefs: [{model: general}]
"""
    return two_models(coder, general) + routing + one_deployment(artifact)


async def chat(session: aiohttp.ClientSession, url: str, text: str) -> tuple[str, dict[str, str]]:
    body = {"model": "auto", "messages": [{"role": "user", "content": text}]}
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        doc = await r.json()
        return doc["choices"][0]["message"]["content"], dict(r.headers)


async def unknown_counts(svc: Served) -> dict[tuple[str, str], float]:
    async with aiohttp.ClientSession() as s, s.get(svc.url + "/metrics") as r:
        text = await r.text()
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name == "vllm_sr_router_unknown_signals":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[(sample.labels["family"], sample.labels["reason"])] = sample.value
    return out


async def test_a_saturated_replica_leaves_keyword_decisions_routing(
    tmp_path: Path, tiny_bert_dir: Path
) -> None:
    config = tmp_path / "config.yaml"
    async with stand_ins("coder", "general") as (coder, general):
        config.write_text(config_text(tiny_bert_dir, coder.endpoint, general.endpoint))
        async with serve(config) as svc:
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as session:
                # one chat alone: nothing is refused, nothing is unknown
                content, headers = await chat(session, svc.url, "please debug this code")
                assert headers["x-vsr-selected-model"] == "coder"
                assert "x-vsr-unknown-signals" not in headers
                answered = unknown = 0
                deadline = time.monotonic() + ROUNDS_DEADLINE_S
                while unknown == 0 and time.monotonic() < deadline:
                    texts = [f"debug this code, version {answered + i}" for i in range(IN_FLIGHT)]
                    answers = await asyncio.gather(*(chat(session, svc.url, t) for t in texts))
                    for text, (content, headers) in zip(texts, answers, strict=True):
                        # every code chat went to the keyword decision's model
                        assert content == f"coder got: {text}"
                        assert headers["x-vsr-selected-decision"] == "coding"
                        assert "x-vsr-routing-fallback" not in headers, headers
                        if "x-vsr-unknown-signals" in headers:
                            assert headers["x-vsr-unknown-signals"] == "embedding:billing"
                            unknown += 1
                    answered += IN_FLIGHT
                assert unknown > 0, f"{answered} chats in flight never saturated the replica"
                counts = await unknown_counts(svc)
                assert counts.get(("embedding", "overloaded"), 0) > 0, counts
                assert sum(counts.values()) == unknown, counts
                assert general.received == []  # nothing went to the default model
