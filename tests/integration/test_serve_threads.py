"""The adaptive-thread learner's state on a real `vllm-sr serve` (real worker, tiny BERT):
the supervisor reads each worker's /health, so `vllm-sr ctl threads` and the inventory show
what the learner does (issue 12: nothing filled this outside the control fake)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.serving import REPO_ROOT, serve

pytestmark = pytest.mark.slow


def adaptive_threads(inventory: dict[str, Any]) -> Any:
    """The first replica's adaptive-thread report (None until the supervisor has one)."""
    return inventory["deployments"][0]["replicas"][0]["adaptive_threads"]


async def test_the_learner_reaches_ctl_threads_and_the_inventory(
    tmp_path: Path, tiny_bert_dir: Path
) -> None:
    env = {
        "VLLM_SRUN_CPU_ADAPTIVE_THREADS": "1",
        "VLLM_SR_THREADS_RECORD_DIR": str(tmp_path / "records"),  # not the runner's home
    }
    flags = (str(tiny_bert_dir), "-e", "--platform", "cpu")
    async with serve(tmp_path / "config.yaml", *flags, env=env) as svc:
        async with aiohttp.ClientSession() as s:
            for i in range(20):
                body = {"input": [f"row {i} {'word ' * (i % 7)}" for _ in range(3)]}
                async with s.post(svc.url + "/v1/embeddings", json=body) as r:
                    assert r.status == 200

        report = await svc.until(adaptive_threads, 30)
        assert report["mode"] == 1 and report["state"] in ("exploring", "learned", "retired")

        ctl = [sys.executable, "-m", "vllm_sr.cli", "ctl", "threads", "--socket", str(svc.control)]
        run_env = {**os.environ, "PYTHONPATH": REPO_ROOT}
        out = subprocess.run(
            [*ctl, "--json"], capture_output=True, text=True, env=run_env, timeout=60, check=True
        )
        ((rid, doc),) = json.loads(out.stdout).items()
        assert rid.endswith("-0") and doc["mode"] == 1 and doc["configured"] >= 1
        text = subprocess.run(
            ctl, capture_output=True, text=True, env=run_env, timeout=60, check=True
        ).stdout
        assert "mode 1" in text and "adaptive threads off" not in text, text


async def test_a_recorded_drift_retires_a_restarted_worker_in_ctl_threads(
    tmp_path: Path, tiny_bert_dir: Path
) -> None:
    """Issue 30: this host's record says a count drifted, so a mode-1 worker (as after a
    restart) reports "retired (recorded drift)" at once, with the file to remove to relearn."""
    from vllm_sr.worker.threads_record import HostRecords, host_facts

    records = HostRecords(tmp_path / "records", host_facts())
    records.drifted([1, 2], "2 threads drifted from the answer at 1 on bucket 5-8")
    env = {
        "VLLM_SRUN_CPU_ADAPTIVE_THREADS": "1",
        "VLLM_SR_THREADS_RECORD_DIR": str(records.directory),
    }
    # The record is kept per served dtype: pin float32, the dtype host_facts() names.
    flags = (str(tiny_bert_dir), "-e", "--platform", "cpu", "--dtype", "float32")
    async with serve(tmp_path / "config.yaml", *flags, env=env) as svc:
        report = await svc.until(adaptive_threads, 30)
        assert report["state"] == "retired" and report["recorded_drift"] is True
        assert report["shadow_passes"] == 0
        ctl = [sys.executable, "-m", "vllm_sr.cli", "ctl", "threads", "--socket", str(svc.control)]
        run_env = {**os.environ, "PYTHONPATH": REPO_ROOT}
        text = subprocess.run(
            ctl, capture_output=True, text=True, env=run_env, timeout=60, check=True
        ).stdout
        assert "state retired (recorded drift)" in text, text
        assert f"host record: {records.path}" in text and "remove that file to relearn" in text
