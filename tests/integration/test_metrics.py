"""The frontend's real /metrics (issue 14 item 7): each managed worker's own series labelled by
deployment and replica, a latency histogram per deployment and surface, ejections and
readmissions counted ("counts ejections and readmissions in its metrics"), retries, and the
whole exposition accepted by `promtool check metrics`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.test_supervisor_fake import fake_plan, start_service

pytestmark = pytest.mark.slow

WORKER_ARGV = [sys.executable, "-m", "vllm_sr.cli", "worker"]


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    want = set(labels.items())
    for (n, lab), v in samples(text).items():
        if n == name and want <= set(lab):
            return v
    return None


async def test_metrics_carry_worker_series_latency_ejections_and_pass_promtool(
    tiny_bert_dir: Path,
) -> None:
    plan = fake_plan(2, artifact=str(tiny_bert_dir), timeout_ms=30_000)
    svc = await start_service(lambda: plan, worker_argv=WORKER_ARGV)
    try:
        async with aiohttp.ClientSession() as s:
            for i in range(6):
                async with s.post(f"{svc.url}/v1/embeddings", json={"input": f"t{i}"}) as r:
                    assert r.status == 200
            pool = svc.sup.pools["primary"]
            pool.outliers.eject("primary-1", duration_ms=60_000)
            pool.outliers.readmit("primary-1")
            async with s.get(f"{svc.url}/metrics") as r:
                assert r.status == 200
                text = await r.text()
        # Both workers' own series, each labelled with its deployment and replica.
        for rid in ("primary-0", "primary-1"):
            rows = value(text, "vllm_sr_worker_rows_total", deployment="primary", replica=rid)
            assert rows is not None and rows >= 1, rid
        assert value(text, "vllm_sr_request_seconds_count", surface="embeddings") == 6
        assert value(text, "vllm_sr_replica_ejections_total", replica="primary-1") == 1
        assert value(text, "vllm_sr_replica_readmissions_total", replica="primary-1") == 1
        assert value(text, "vllm_sr_pool_retries_total", deployment="primary") == 0
        promtool = shutil.which("promtool")
        if promtool is None:
            pytest.skip("promtool is not installed (apt-get install prometheus)")
        check = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, text=True
        )
        assert check.returncode == 0, check.stdout + check.stderr
    finally:
        await svc.stop()


async def test_a_worker_that_does_not_answer_is_absent_not_an_error(tiny_bert_dir: Path) -> None:
    plan = fake_plan(2, artifact=str(tiny_bert_dir), timeout_ms=30_000)
    svc = await start_service(lambda: plan, worker_argv=WORKER_ARGV)
    pid = svc.sup.replicas["primary-1"].pid
    assert pid is not None
    try:
        os.kill(pid, signal.SIGSTOP)  # alive, silent
        async with aiohttp.ClientSession() as s, s.get(f"{svc.url}/metrics") as r:
            assert r.status == 200
            text = await r.text()
        assert value(text, "vllm_sr_worker_rows_total", replica="primary-1") is None
        assert any(
            lab and dict(lab).get("replica") == "primary-0"
            for (n, lab) in samples(text)
            if n.startswith("vllm_sr_worker_")
        )
    finally:
        os.kill(pid, signal.SIGCONT)
        await svc.stop()


async def test_several_replicas_use_worker_caches_and_one_uses_the_frontend_cache(
    tiny_bert_dir: Path,
) -> None:
    """The page: "Single-worker deployments retain the frontend result cache; multiple replicas
    use independent worker caches"."""
    for n in (2, 1):
        plan = fake_plan(n, artifact=str(tiny_bert_dir), timeout_ms=30_000)
        svc = await start_service(lambda p=plan: p, worker_argv=WORKER_ARGV)  # type: ignore[misc]
        try:
            async with aiohttp.ClientSession() as s:
                for _ in range(6):
                    async with s.post(f"{svc.url}/v1/embeddings", json={"input": "same"}) as r:
                        assert r.status == 200
                        frontend_hit = r.headers.get("X-Cache") == "hit"
                async with s.get(f"{svc.url}/metrics") as r:
                    text = await r.text()
            hits = sum(
                v
                for (name, _), v in samples(text).items()
                if name == "vllm_sr_worker_result_cache_hits_total"
            )
            if n == 2:
                assert hits >= 4 and not frontend_hit  # 6 asks, at most 2 first misses
            else:
                assert hits == 0 and frontend_hit
        finally:
            await svc.stop()
