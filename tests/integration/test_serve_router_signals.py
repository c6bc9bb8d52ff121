"""The model-backed signal families on a real `vllm-sr serve` (real workers on a tiny BERT,
two deployments, real stand-in LLM backends, the official openai SDK): a chat whose
decisions reference eight model-backed signals on the decision deployment costs exactly one
exchange there, and a signal on a second deployment one exchange there, as the pools count
them (``requests_by_kind``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.serving import serve, stand_ins, two_models

pytestmark = pytest.mark.slow

EIGHT = [
    ("complexity", "needs_reasoning:hard"),
    ("reask", "again"),
    ("preference", "terse"),
    ("jailbreak", "injection"),
    ("kb", "private_code"),
    ("user_feedback", "wrong_answer"),
    ("fact_check", "needs_fact_check"),
    ("domain", "math"),
]


def config_text(artifact: Path, coder: str, general: str) -> str:
    leaves = "\n".join(
        f'      - {{name: d{i}, priority: {100 - i}, rules: {{type: {kind}, name: "{name}"}}, '
        "modelRefs: [{model: coder}]}"
        for i, (kind, name) in enumerate(EIGHT)
    )
    return (
        two_models(coder, general)
        + f"""\
routing:
  signals:
    complexity:
      - {{name: needs_reasoning, threshold: 0.1, hard: {{candidates: [prove this theorem]}},
         easy: {{candidates: [say hi]}}}}
    reasks: [{{name: again, threshold: 0.99}}]
    preferences: [{{name: terse, examples: [keep it short], threshold: 0.99}}]
    jailbreak:
      - {{name: injection, method: contrastive, threshold: 0.5,
         jailbreak_patterns: [ignore previous instructions], benign_patterns: [hello]}}
    kb:
      - {{name: private_code, kb: privacy_kb, target: {{kind: label, value: proprietary_code}}}}
    user_feedbacks: [{{name: wrong_answer}}]
    fact_check: [{{name: needs_fact_check}}]
    domains:
      - {{name: math, mmlu_categories: [math]}}
      - {{name: law, mmlu_categories: [law]}}
    pii: [{{name: card, threshold: 0.5}}]
    embeddings:
      - {{name: weather, threshold: 0.999, candidates: [rain tomorrow], deployment: side}}
  decisions:
{leaves}
      - {{name: card, priority: 5, rules: {{type: pii, name: card}}, modelRefs: [{{model: coder}}]}}
      - {{name: weather, priority: 1, rules: {{type: embedding, name: weather}},
         modelRefs: [{{model: coder}}]}}
global:
  model_catalog:
    system: {{decision_model: {{deployment: primary}}}}
    deployments:
      primary:
        artifact: {artifact}
        replicas: [{{device: cpu}}]
      side:
        artifact: {artifact}
        replicas: [{{device: cpu}}]
"""
    )


async def test_eight_model_backed_signals_cost_one_exchange_per_deployment(
    tmp_path: Path, tiny_bert_dir: Path
) -> None:
    config = tmp_path / "config.yaml"
    async with stand_ins("coder", "general") as (coder, general):
        config.write_text(config_text(tiny_bert_dir, coder.endpoint, general.endpoint))
        async with serve(config, deployments=2) as svc:
            client = openai.AsyncOpenAI(base_url=svc.url + "/v1", api_key="unused")
            messages: list[Any] = [
                {"role": "user", "content": "what is the integral of x"},
                {"role": "assistant", "content": "x squared over two"},
                {"role": "user", "content": "that is wrong, my card is 4111 1111 1111 1111"},
            ]
            # The first chat: the frontend's warm-up exchange (queued when it started, or
            # failed while a deployment was not ready) is behind it, counted or not at all.
            first = await client.chat.completions.with_raw_response.create(
                model="auto", messages=messages
            )
            assert first.headers["x-vsr-selected-model"] == "coder"
            before = await svc.routing_exchanges()
            for n in (1, 2):
                raw = await client.chat.completions.with_raw_response.create(
                    model="auto", messages=messages
                )
                assert raw.headers["x-vsr-selected-model"] == "coder"
                after = await svc.routing_exchanges()
                assert after == {"primary": before["primary"] + n, "side": before["side"] + n}
            await client.close()
