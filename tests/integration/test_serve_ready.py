"""v0.4's ``/ready`` and ``/startup-status`` on a real ``vllm-sr serve``, with stand-in workers
(VLLM_SR_WORKER_ARGV) that answer ``/health`` 503 ``loading`` until the test lets each one finish
(``FAKE_READY_FILE``): ``/ready`` is 503 while any worker loads, even once ``/health`` is 200 on
the first ready replica, and 200 when the last has loaded; ``/startup-status`` shows each
worker's phase. The routing preview's path is served too (Engine mode answers it with its 404)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.integration.test_supervisor_fake import FAKE_MODULE, wait_for
from tests.support.serving import (
    REPO_ROOT,
    free_port,
    running,
    serve_argv,
    serve_env,
    stand_ins,
)
from tests.support.workers import short_socket_dir

pytestmark = pytest.mark.slow


@dataclass
class Served:
    url: str
    log: Path
    last: dict[str, tuple[int, Any]]

    async def get(self, path: str) -> tuple[int, Any]:
        async with aiohttp.ClientSession() as s, s.get(self.url + path) as r:
            got = (r.status, await r.json())
        self.last[path] = got
        return got

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.asynccontextmanager
async def serve_loading(tmp: Path, *flags: str, fake: bool) -> AsyncIterator[Served]:
    """``vllm-sr serve FLAGS --config tmp/config.yaml``, yielded once it listens (not once
    ready). ``fake``: stand-in workers that load until ``loaded-<replica id>`` exists in
    ``tmp``."""
    port = free_port()
    run = short_socket_dir(prefix="vsr-ready-") / "run"
    log = tmp / "serve.log"
    argv = serve_argv(
        tmp / "config.yaml",
        *flags,
        "--listen",
        f"127.0.0.1:{port}",
        run=run,
        control=run / "control.sock",
    )
    fakes = {}
    if fake:
        fakes["VLLM_SR_WORKER_ARGV"] = f"{sys.executable} -m {FAKE_MODULE} worker"
        fakes["FAKE_READY_FILE"] = str(tmp / "loaded-{replica}")
    async with running(argv, serve_env(fakes), log, cwd=REPO_ROOT) as proc:
        served = Served(f"http://127.0.0.1:{port}", log, {})
        await wait_for(
            lambda: "serving on" in served.text() or proc.returncode is not None,
            60,
            "listening",
            served.text,
        )
        assert proc.returncode is None, served.text()
        yield served


def engine_mode(artifact: str, replicas: int) -> tuple[str, ...]:
    return (artifact, "-e", "--platform", "cpu", "-dp", str(replicas))


async def until(served: Served, what: str, check: Any, timeout: float = 60) -> None:
    """Poll /startup-status (and /ready, /health) until ``check(status_doc)`` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        _, doc = await served.get("/startup-status")
        if check(doc):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}: {served.last}\n{served.text()[-2000:]}")


def phases(doc: dict[str, Any]) -> dict[str, str]:
    return {r["id"]: r["phase"] for d in doc["deployments"].values() for r in d["replicas"]}


async def test_ready_is_503_while_a_worker_loads_and_200_after(tmp_path: Path) -> None:
    async with serve_loading(tmp_path, *engine_mode("fake/artifact", 2), fake=True) as served:
        await until(
            served,
            "both workers loading",
            lambda d: list(phases(d).values()) == ["loading", "loading"],
        )
        status, brief = await served.get("/ready")
        assert status == 503
        assert brief["ready"] is False and brief["phase"] == "loading"
        _, doc = await served.get("/startup-status")
        (name,) = doc["deployments"]
        dep = doc["deployments"][name]
        assert dep["phase"] == "loading" and dep["desired_replicas"] == 2
        first, second = sorted(phases(doc))

        (tmp_path / f"loaded-{first}").touch()
        await until(served, f"{first} ready", lambda d: phases(d)[first] == "ready")
        status, _ = await served.get("/health")
        assert status == 200  # one replica serves: /health is satisfied ...
        status, brief = await served.get("/ready")
        assert status == 503 and brief["phase"] == "loading"  # ... /ready waits for the other
        _, doc = await served.get("/startup-status")
        assert doc["deployments"][name]["ready_replicas"] == 1
        assert phases(doc) == {first: "ready", second: "loading"}

        (tmp_path / f"loaded-{second}").touch()
        await until(served, "every worker ready", lambda d: d["ready"] is True)
        status, brief = await served.get("/ready")
        assert status == 200 and brief["ready"] is True and brief["phase"] == "ready"
        _, inventory = await served.get("/api/v1/inventory/model-runtime")
        assert brief["generation"] == inventory["service"]["generation"]
        _, doc = await served.get("/startup-status")
        assert doc["deployments"][name]["phase"] == "ready"
        assert set(phases(doc).values()) == {"ready"}

        async with (
            aiohttp.ClientSession() as s,
            s.post(served.url + "/api/v1/routing/preview", json={"text": "hi"}) as r,
        ):
            assert r.status == 404
            assert (await r.json())["error"]["code"] == "engine_mode"


PHASE_ORDER = ("starting", "loading", "warming", "ready")


async def test_a_real_worker_goes_through_its_phases(tmp_path: Path, tiny_bert_dir: Path) -> None:
    """The real worker (a tiny BERT): /ready is 503 from the moment the service listens until
    the worker has loaded and warmed, then 200; the phases seen come in their order."""
    async with serve_loading(tmp_path, *engine_mode(str(tiny_bert_dir), 1), fake=False) as served:
        seen: list[str] = []
        ready_codes: list[int] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 180
        while not seen or seen[-1] != "ready":
            assert loop.time() < deadline, f"{seen}\n{served.text()[-2000:]}"
            status, brief = await served.get("/ready")
            ready_codes.append(status)
            _, doc = await served.get("/startup-status")
            (phase,) = phases(doc).values() or ("starting",)
            if not seen or seen[-1] != phase:
                seen.append(phase)
            assert (status == 200) == (brief["phase"] == "ready"), brief
            await asyncio.sleep(0.02)
        assert ready_codes[0] == 503, seen  # it listens long before torch has loaded
        assert seen == sorted(seen, key=PHASE_ORDER.index), seen  # never back
        assert "loading" in seen or "warming" in seen, seen
        status, brief = await served.get("/ready")
        assert status == 200 and brief["ready"] is True


async def test_router_mode_preview_on_a_real_serve(tmp_path: Path, tiny_bert_dir: Path) -> None:
    """Router mode on real workers: a preview sent while /ready is 503 answers at once (a
    model signal still loading is only listed in signal_errors); once /ready is 200 the same
    preview has every signal evaluated; the envelope is strict through the real frontend."""
    from tests.integration.test_serve_router import config_text

    body = {"text": "I was charged twice, debug this function", "options": {"trace": True}}
    async with stand_ins("coder", "general") as (coder, general):
        doc = yaml.safe_load(config_text(tiny_bert_dir, coder.endpoint, general.endpoint, 0.99))
        # thresholds alone decide (upstream's default soft matching at 0.5 would match billing)
        semantic = {"embedding_config": {"enable_soft_matching": False, "top_k": 0}}
        doc["global"]["model_catalog"]["embeddings"] = {"semantic": semantic}
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(doc))
        async with serve_loading(tmp_path, fake=False) as served:

            async def preview(payload: dict[str, Any]) -> tuple[int, Any]:
                async with (
                    aiohttp.ClientSession() as s,
                    s.post(served.url + "/api/v1/routing/preview", json=payload) as r,
                ):
                    return r.status, await r.json()

            status, _ = await served.get("/ready")
            if status == 503:
                status, doc = await preview(body)
                assert status == 200, doc
                assert set(doc["signal_errors"]) <= {"embedding:billing"}, doc["signal_errors"]
            await until(served, "Router mode ready", lambda d: d["ready"] is True, 180)
            assert (await served.get("/ready"))[0] == 200
            _, doc = await served.get("/startup-status")
            assert doc["deployments"]["primary"]["phase"] == "ready"
            assert doc["deployments"]["primary"]["ready_replicas"] == 2

            status, doc = await preview(body)
            assert status == 200, doc
            assert doc["signal_errors"] == {}
            assert doc["decision_result"]["decision_name"] == "coding"
            assert doc["selected_model"] == "coder"
            assert {t["decision_name"] for t in doc["eval_trace"]} == {"coding", "billing"}
            assert "billing" in doc["decision_result"]["unmatched_signals"]["embeddings"]
            status, doc = await preview({**body, "temperature": 0})
            assert status == 400
            assert doc["error"]["message"].startswith("field temperature: unknown field")
            assert coder.received == [] and general.received == []
