"""Signal processes on a real `vllm-sr serve` (real workers on a tiny BERT, real stand-in LLM
backends): concurrent chats hand their CPU-bound signals to the signal process; a signal
process killed with chats in flight costs those chats their signals (routed to the default
model, counted), never a 5xx; the supervisor restarts it with its events, and the inventory
and /metrics say so."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.serving import Served, one_deployment, serve, stand_ins, two_models

pytestmark = pytest.mark.slow


def config_text(artifact: Path, coder: str, general: str) -> str:
    routing = """\
routing:
  signals:
    keywords:
      - {name: code, operator: OR, keywords: [code, function, debug]}
    pii:
      - {name: card, threshold: 0.5}
  decisions:
    - name: coding
      priority: 100
      rules: {type: keyword, name: code}
      modelRefs: [{model: coder}]
    - name: private
      priority: 50
      rules: {type: pii, name: card}
      modelRefs: [{model: general}]
"""
    return two_models(coder, general) + routing + one_deployment(artifact)


async def chat(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    body = {"model": "auto", "messages": [{"role": "user", "content": "debug this function"}]}
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        await r.read()
        return r.status, r.headers.get("x-vsr-selected-model", "")


async def signal_procs(svc: Served) -> list[dict[str, Any]]:
    return list((await svc.inventory()).get("signal_processes") or [])


async def until(svc: Served, check: Any, timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """The signal processes, once the first one passes ``check``."""

    def procs_if(inventory: dict[str, Any]) -> list[dict[str, Any]] | None:
        procs = list(inventory.get("signal_processes") or [])
        return procs if procs and check(procs[0]) else None

    return await svc.until(procs_if, timeout_s)


async def test_a_killed_signal_process_costs_its_chats_their_signals_never_a_5xx(
    tmp_path: Path, tiny_bert_dir: Path
) -> None:
    config = tmp_path / "config.yaml"
    async with stand_ins("coder", "general") as (coder, general):
        config.write_text(config_text(tiny_bert_dir, coder.endpoint, general.endpoint))
        async with serve(config, "--signal-processes", "1") as svc, aiohttp.ClientSession() as s:
            (proc,) = await until(svc, lambda p: p["state"] == "ready")
            answers = await asyncio.gather(*(chat(s, svc.url) for _ in range(16)))
            assert answers == [(200, "coder")] * 16
            inv = await svc.inventory()
            assert inv["router"]["signal_dispatch"]["handed_off"] > 0  # pii: heavy
            assert (await signal_procs(svc))[0]["jobs"] > 0

            os.kill(proc["pid"], signal.SIGSTOP)  # its jobs wait in its socket ...
            sent = asyncio.gather(*(chat(s, svc.url) for _ in range(8)))
            await until(svc, lambda p: p["inflight"] > 0)
            os.kill(proc["pid"], signal.SIGKILL)  # ... and it dies with them in flight
            answers = await sent
            assert {status for status, _ in answers} == {200}
            assert (200, "general") in answers  # the handed-off chats lost their signals
            async with s.get(svc.url + "/metrics") as r:
                metrics = await r.text()
            assert (
                'vllm_sr_router_unknown_signals_total{family="keyword",reason="unavailable"}'
                in metrics
            )

            (after,) = await until(svc, lambda p: p["state"] == "ready" and p["restarts"] == 1)
            assert after["pid"] != proc["pid"] and after["restart_reason"] == "killed by signal 9"
            answers = await asyncio.gather(*(chat(s, svc.url) for _ in range(4)))
            assert answers == [(200, "coder")] * 4  # routed again by the new process
        log = svc.log.read_text()
        assert "signal_process_exited" in log and "killed by signal 9" in log
