"""A chat routed by a config file that uses only upstream v0.4's names for its renamed fields
(``providers.defaults.model`` / ``reasoning_effort``, config/renames.py): the file read as
``vllm-sr`` reads it, the router built on it, real stand-in backends, the official openai SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import openai
import pytest

from tests.support.backends import StandInBackend
from tests.support.router_app import serve_routes, start_router
from vllm_sr.config.files import parse_config
from vllm_sr.config.renames import RENAMES
from vllm_sr.router.chat import ChatRouter

V04_CONFIG = """\
version: v0.3
providers:
  defaults:
    model: general            # v0.4's name (3d48f8c9: default_model)
    reasoning_effort: high    # v0.4's name (3d48f8c9: default_reasoning_effort)
  models:
    - name: general
      backend_refs: [{{endpoint: "{general}"}}]
    - name: coder
      backend_refs: [{{endpoint: "{coder}"}}]
routing:
  signals:
    keywords:
      - {{name: code, operator: OR, keywords: [code, debug]}}
  decisions:
    - name: coding
      priority: 100
      rules: {{operator: AND, conditions: [{{type: keyword, name: code}}]}}
      modelRefs: [{{model: coder}}]
global:
  router: {{enabled: true, auto_model_names: [vllm-sr/auto]}}
  model_catalog: {{deployments: {{}}}}
"""


@dataclass
class Stack:
    general: StandInBackend
    coder: StandInBackend
    chat: ChatRouter
    client: openai.AsyncOpenAI


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    general = await StandInBackend("general").start()
    coder = await StandInBackend("coder").start()
    text = V04_CONFIG.format(general=general.endpoint, coder=coder.endpoint)
    for r in RENAMES:  # the file says only the current names
        assert f"{r.old}:" not in text and f"{r.new}:" in text
    config = parse_config(text, "v04.yaml")
    assert config.providers is not None and config.routing is not None
    chat = await start_router(config.providers, config.routing)
    served = await serve_routes(chat.routes())
    try:
        yield Stack(general, coder, chat, served.client())
    finally:
        await served.close()
        await chat.backends.close()
        await general.stop()
        await coder.stop()


async def test_a_chat_is_routed_by_a_config_with_only_v04_names(stack: Stack) -> None:
    raw = await stack.client.chat.completions.with_raw_response.create(
        model="vllm-sr/auto",
        messages=[{"role": "user", "content": "please debug my code"}],
    )
    assert raw.headers["x-vsr-selected-decision"] == "coding"
    assert raw.headers["x-vsr-selected-model"] == "coder"
    assert raw.parse().choices[0].message.content == "coder got: please debug my code"
    assert len(stack.coder.received) == 1 and not stack.general.received

    # No decision matches: the chat goes to providers.defaults.model.
    raw = await stack.client.chat.completions.with_raw_response.create(
        model="vllm-sr/auto",
        messages=[{"role": "user", "content": "hello there"}],
    )
    assert raw.headers["x-vsr-selected-model"] == "general"
    assert raw.headers["x-vsr-selected-algorithm"] == "default"
    assert raw.parse().choices[0].message.content == "general got: hello there"
    assert len(stack.general.received) == 1
