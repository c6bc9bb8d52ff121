"""The page's outlier example on a real `vllm-sr serve` (issue 30): refused while its model is
not installed, served once a Hugging Face model directory (a tiny BERT saved with
save_pretrained) is installed as ``Vela-2.0-4B`` under the artifacts directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.integration.test_supervisor_fake import REPO_ROOT
from tests.support.models import build_tiny_bert
from tests.support.serving import serve
from tests.unit.test_artifact_check import PAGE_OUTLIER_EXAMPLE

pytestmark = pytest.mark.slow


async def test_the_page_example_serves_once_its_model_is_installed(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    # No GPUs here: the page's two rocm replicas become two CPU workers.
    config.write_text(PAGE_OUTLIER_EXAMPLE.replace("rocm:0", "cpu").replace("rocm:1", "cpu"))
    root = tmp_path / "artifacts"
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    env.pop("VLLM_SR_WORKER_ARGV", None)
    serve_argv = [sys.executable, "-m", "vllm_sr.cli", "serve", "--config", str(config)]
    refused = subprocess.run(
        [*serve_argv, "--artifacts-dir", str(root), "--listen", "127.0.0.1:1"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 78, refused.stderr
    assert "deployment 'primary' cannot load here" in refused.stderr
    assert "serving on" not in refused.stderr  # refused before anything started

    build_tiny_bert(root / "Vela-2.0-4B")  # "copy a directory": an HF save_pretrained output
    validate = [sys.executable, "-m", "vllm_sr.cli", "config", "validate", "--config", str(config)]
    ok = subprocess.run(
        [*validate, "--artifacts-dir", str(root)], capture_output=True, text=True, env=env,
        timeout=120,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    async with serve(config, "--artifacts-dir", str(root)) as svc:
        dep = (await svc.inventory())["deployments"][0]
        assert dep["ready_replicas"] == 2
        async with aiohttp.ClientSession() as s:
            body = {"model": "primary", "input": ["hello", "a longer sentence to embed"]}
            async with s.post(svc.url + "/v1/embeddings", json=body) as r:
                assert r.status == 200, await r.text()
                doc = await r.json()
            assert len(doc["data"]) == 2 and len(doc["data"][0]["embedding"]) == 32
            async with s.get(svc.url + "/v1/models") as r:
                models = {m["id"] for m in (await r.json())["data"]}
        assert "primary" in models
