"""``global.services.router_replay`` on a real `vllm-sr serve`: records of routed chats (through
the official openai SDK, to a stand-in backend) kept in a real PostgreSQL, read back with
`vllm-sr ctl replay` and still there after the router restarts; and upstream's agent recipe's
replay block as written (host ``postgres``, which does not resolve here): the router starts,
the chat is served, the record is counted lost in /metrics and `ctl replay` says why."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml

from tests.integration.test_serve import free_port
from tests.support.backends import StandInBackend
from tests.support.postgres import HAVE_POSTGRES, SKIP_REASON, PgServer, postgres_server
from tests.support.serving import REPO_ROOT, served
from tests.support.workers import short_socket_dir

pytestmark = pytest.mark.slow
AGENT = Path(__file__).resolve().parents[1] / "fixtures/upstream/recipes/agent/config.yaml"


def config(port: int, endpoint: str, replay: dict[str, Any]) -> dict[str, Any]:
    kw = [{"name": n, "operator": "OR", "keywords": [n]} for n in ("replayme", "plain", "quiet")]
    return {
        "version": "v0.3",
        "listeners": [{"name": "http", "address": "127.0.0.1", "port": port}],
        "providers": {
            "defaults": {"default_model": "llm"},
            "models": [{"name": "llm", "backend_refs": [{"endpoint": endpoint}]}],
        },
        "routing": {
            "signals": {"keywords": kw},
            "decisions": [
                {
                    "name": name,
                    "priority": 10,
                    "rules": {"operator": "OR", "conditions": [{"type": "keyword", "name": name}]},
                    "modelRefs": [{"model": "llm"}],
                    "plugins": plugins,
                }
                for name, plugins in (
                    (
                        "replayme",
                        [{"type": "router_replay", "configuration": {"max_records": 10000}}],
                    ),
                    ("plain", []),  # no plugin: global enabled records it
                    ("quiet", [{"type": "router_replay", "configuration": {"enabled": False}}]),
                )
            ],
        },
        "global": {"services": {"router_replay": replay}},
    }


async def ask(url: str, text: str, session: str | None = None) -> Any:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    raw = await client.chat.completions.with_raw_response.create(
        model="vllm-sr/auto",
        messages=[{"role": "user", "content": text}],
        extra_headers={"x-session-id": session} if session else None,
    )
    assert raw.parse().choices[0].message.content == f"llm got: {text}"
    return raw


async def ctl_replay(control: Path, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    """`vllm-sr ctl replay --json` -> (exit code, records, stderr)."""
    return await ctl(control, "replay", *args)


async def ctl(control: Path, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    """`vllm-sr ctl ... --json` -> (exit code, JSON lines, stderr)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")]),
    }
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "vllm_sr.cli", "ctl", *args, "--json", "--socket", str(control)],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return proc.returncode, records, proc.stderr


@pytest.fixture
def pg() -> Any:
    if not HAVE_POSTGRES:
        pytest.skip(SKIP_REASON)
    pytest.importorskip("psycopg")
    with postgres_server() as server:
        yield server


async def test_records_go_to_postgres_and_survive_a_router_restart(
    tmp_path: Path, pg: PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POSTGRES_PASSWORD", "unused-with-trust-auth")
    backend = await StandInBackend("llm").start()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    replay = {
        "enabled": True,
        "store_backend": "postgres",
        "ttl_seconds": 2592000,
        "async_writes": False,
        "postgres": {**pg.settings, "password": "${POSTGRES_PASSWORD}", "ssl_mode": "disable",
                     "table_name": "router_replay_records"},
    }  # fmt: skip
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config(port, backend.endpoint, replay), sort_keys=False))
    control = short_socket_dir(prefix="vsr-rp-") / "c"
    try:
        async with served(path, url, log=tmp_path / "serve1.log", control=control):
            first = await ask(url, "replayme please", session="s-1")
            plain = await ask(url, "plain question", session="s-2")
            quiet = await ask(url, "quiet question")
            code, records, err = await ctl_replay(control)
            _, one, _ = await ctl_replay(control, "--session", "s-1")  # postgres's session_id
            rid = first.headers["x-vsr-replay-id"]
            refused, _, why = await ctl(control, "outcome", rid, "good_fit")
        assert code == 0, err
        assert [(r["id"], r["session_id"], r["turn_index"]) for r in one] == [(rid, "s-1", 0)]
        assert refused == 1 and "Router Learning, which is off" in why  # this config has none
        assert "x-vsr-replay-id" not in quiet.headers  # its plugin says enabled: false
        by_id = {r["id"]: r for r in records}
        rec = by_id[first.headers["x-vsr-replay-id"]]
        assert rec["decision"] == "replayme" and rec["response_status"] == 200
        assert rec["signals"] == {"keyword": ["replayme"]} and rec["model"] == "llm"
        assert "replayme please" in rec["request_body"]
        assert by_id[plain.headers["x-vsr-replay-id"]]["decision"] == "plain"
        assert len(records) == 2
        async with served(path, url, log=tmp_path / "serve2.log", control=control):
            code, again, err = await ctl_replay(control)
            later = await ask(url, "replayme again")
            _, after, _ = await ctl_replay(control)
        assert code == 0, err
        assert again == records  # read from postgres by a fresh router
        assert [r["id"] for r in after] == [*by_id, later.headers["x-vsr-replay-id"]]
        assert after[-1]["seq"] > records[-1]["seq"]
    finally:
        await backend.stop()


async def test_agent_recipes_replay_block_with_no_postgres_serves_and_counts_the_loss(
    tmp_path: Path,
) -> None:
    agent = yaml.safe_load(AGENT.read_text())
    replay = agent["global"]["services"]["router_replay"]  # host: postgres, as upstream ships it
    assert replay["postgres"]["host"] == "postgres" and replay["store_backend"] == "postgres"
    backend = await StandInBackend("llm").start()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config(port, backend.endpoint, replay), sort_keys=False))
    control = short_socket_dir(prefix="vsr-rp-") / "c"
    log = tmp_path / "serve.log"
    try:
        async with served(path, url, log=log, control=control):
            raw = await ask(url, "replayme with no database")
            assert raw.status_code == 200 and raw.headers["x-vsr-replay-id"]
            async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
                metrics = await r.text()
            code, records, err = await ctl_replay(control)
        assert (
            'vllm_sr_router_replay_lost_total{reason="store_down",store="postgres"} 1.0' in metrics
        )
        assert 'vllm_sr_router_replay_store_up{store="postgres"} 0.0' in metrics
        assert code != 0 and records == [] and "router_replay store postgres is down" in err
        assert "router_replay store postgres is down" in log.read_text()
    finally:
        await backend.stop()
