"""A pod on this machine: `vllm-sr serve` started the way the rendered StatefulSet starts it
(its command, its environment, the ConfigMap's config.yaml and vllm-sr.toml), with what a pod
has (KUBERNETES_SERVICE_HOST, *_VISIBLE_DEVICES, fake rocm-smi / nvidia-smi printing captured
fixtures). It answers the rendered probes, logs JSON lines on stdout, `vllm-sr status` works
through the control socket inside the "pod", and SIGTERM drains. The ordinal placement runs
through `config apply --dry-run` and `config show` with the fixture's six MI100s."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.test_serve import free_port
from tests.integration.test_supervisor_fake import FAKE_MODULE, REPO_ROOT
from tests.support.gpu_fixtures import FIXTURES, MISSING_REASON, fake_tool
from vllm_sr.kube.manifests import RenderOptions, render

pytestmark = pytest.mark.slow

CONFIG = """\
global:
  router:
    enabled: false
  model_catalog:
    deployments:
      primary:
        artifact: fake/artifact
        replicas:
          - device: cpu
          - device: cpu
"""
MI100_6 = "rocm-smi_telegraf-flags_mi100-6gpu_rocm5.7.1.json"
H100_1 = "nvidia-smi_query-gpu-allfields_csv_h100-80gb-hbm3-1gpu_drv590.48.01.csv"


def _pod(objs: list[dict[str, Any]]) -> tuple[dict[str, str], dict[str, Any], int]:
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap"]
    (sts,) = [o for o in objs if o["kind"] == "StatefulSet"]
    spec = sts["spec"]["template"]["spec"]
    return cm["data"], spec["containers"][0], spec["terminationGracePeriodSeconds"]


def _pod_env(container: dict[str, Any], bin_dir: Path, home: Path) -> dict[str, str]:
    env = {e["name"]: e["value"] for e in container["env"]}
    env.update(HOME=str(home), HF_HOME=str(home / "hf"))  # the pod's emptyDirs, here
    return {
        **os.environ,
        **env,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
        "HOSTNAME": "vllm-sr-0",
        "PYTHONPATH": str(REPO_ROOT),
        "VLLM_SR_WORKER_ARGV": f"{sys.executable} -m {FAKE_MODULE} worker",
        # Every answer takes a while, so a request is still in flight when SIGTERM comes.
        "VLLM_SR_FAULT_FORWARD_DELAY_MS": "1500",
    }


async def _get(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(2)) as r:
        return r.status, await r.json()


async def _wait_status(url: str, want: int, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            status, body = await _get(url)
            if status == want:
                return body
            last = (status, body)
        await asyncio.sleep(0.05)
    raise AssertionError(f"{url} did not answer {want} within {timeout} s: {last}")


async def test_serve_in_a_simulated_pod_answers_probes_and_drains(tmp_path: Path) -> None:
    data, container, grace_s = _pod(render(CONFIG, "config.yaml", RenderOptions()))
    etc, run, bin_dir = tmp_path / "etc", tmp_path / "run", tmp_path / "bin"
    for d in (etc, run, bin_dir):
        d.mkdir()
    for name, text in data.items():
        (etc / name).write_text(text)
    if FIXTURES.is_dir():  # what a pod's PATH may hold; a CPU config never runs them
        fake_tool(bin_dir, "rocm-smi", FIXTURES / MI100_6)
        fake_tool(bin_dir, "nvidia-smi", FIXTURES / H100_1)
    port = free_port()
    cmd = container["command"]
    assert cmd[:2] == ["vllm-sr", "serve"]
    argv = [sys.executable, "-m", "vllm_sr.cli", *cmd[1:]]
    argv[argv.index("/etc/vllm-sr/config.yaml")] = str(etc / "config.yaml")
    # The ConfigMap's host settings, with this machine's address and directories.
    argv += ["--service-config", str(etc / "vllm-sr.toml"), "--listen", f"127.0.0.1:{port}"]
    argv += ["--runtime-dir", str(run), "--control-socket", str(run / "control.sock")]
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    env = _pod_env(container, bin_dir, tmp_path)
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=o, stderr=e, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        probes = [container[k]["httpGet"]["path"] for k in ("startupProbe", "livenessProbe")]
        health = await _wait_status(base + probes[0], 200, 60)
        assert health["ready"] is True  # ready once every deployment has a ready replica
        deadline = time.monotonic() + 60
        while health["deployments"] != {"primary": 2}:  # the second worker follows
            assert time.monotonic() < deadline, health
            await asyncio.sleep(0.05)
            health = await _wait_status(base + probes[0], 200, 5)
        assert container["readinessProbe"]["httpGet"]["path"] == probes[0]
        await _wait_status(base + probes[1], 200, 5)

        # kubectl exec POD -- vllm-sr status: the control socket inside the pod.
        status = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "vllm_sr.cli", "status", "--json"],
            capture_output=True,
            text=True,
            env={**env, "VLLM_SR_CONTROL_SOCKET": str(run / "control.sock")},
            timeout=30,
        )
        assert status.returncode == 0, status.stderr
        assert "primary-1" in status.stdout

        # SIGTERM (after preStop) with a request in flight: it completes, /health says
        # stopping, and the process exits 0 well inside the grace period.
        async with aiohttp.ClientSession() as s:
            call = asyncio.create_task(
                s.post(base + "/v1/embeddings", json={"model": "primary", "input": "x"})
            )
            await _wait_inflight(base)
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            await _wait_status(base + probes[0], 503, 5)
            resp = await call
            assert resp.status == 200
        code = await asyncio.wait_for(proc.wait(), grace_s)
        assert code == 0 and time.monotonic() - started < grace_s
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    lines = [json.loads(line) for line in out.read_text().splitlines() if line.startswith("{")]
    events = {d.get("event") for d in lines}
    assert {"replica_ready", "service_stopping"} <= events, out.read_text()[-2000:]
    assert all({"time", "level", "logger", "message"} <= set(d) for d in lines)


async def _wait_inflight(base: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        _, inv = await _get(base + "/api/v1/inventory/model-runtime")
        if sum(r["inflight"] for r in inv["deployments"][0]["replicas"]) >= 1:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("no request in flight within 10 s")


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vllm_sr.cli", *args],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(REPO_ROOT)},
        cwd=REPO_ROOT,
        timeout=60,
    )


@pytest.mark.skipif(not FIXTURES.is_dir(), reason=MISSING_REASON)
def test_pod_places_ordinals_on_its_allocated_gpus(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    gpu = CONFIG.replace("fake/artifact", "vllm-sr/d3-edge").replace(
        "device: cpu", "device: rocm:0", 1
    )
    cfg.write_text(gpu.replace("device: cpu", "device: rocm:1", 1))
    # The rendered pod asks for exactly the two GPUs the ordinals name.
    _, container, _ = _pod(render(cfg.read_text(), "config.yaml", RenderOptions()))
    assert container["resources"]["limits"]["amd.com/gpu"] == "2"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_tool(bin_dir, "rocm-smi", FIXTURES / MI100_6)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "ROCR_VISIBLE_DEVICES": "3,5",
    }
    dry = _cli(["config", "apply", "--config", str(cfg), "--dry-run", "--json"], env)
    assert dry.returncode == 0, dry.stderr
    reps = {r["id"]: r for r in json.loads(dry.stdout)["replicas"]}
    assert reps["primary-0"]["env"]["ROCR_VISIBLE_DEVICES"] == "3"
    assert reps["primary-1"]["env"]["ROCR_VISIBLE_DEVICES"] == "5"
    shown = _cli(["config", "show", "--config", str(cfg)], env)
    assert shown.returncode == 0, shown.stderr
    assert "ordinal 0 of ROCR_VISIBLE_DEVICES=3,5 = host rocm:3" in shown.stdout
    assert "ordinal 1 of ROCR_VISIBLE_DEVICES=3,5 = host rocm:5" in shown.stdout
    # Host IDs inside the pod are refused: by the flags, and by the renderer.
    ids = _cli(
        ["config", "apply", "--config", str(cfg), "--dry-run", "--platform", "rocm",
         "-dp", "2", "--device-ids", "3,5"],
        env,
    )  # fmt: skip
    assert ids.returncode != 0 and "ordinal" in ids.stderr, ids.stderr
    cfg.write_text(cfg.read_text().replace("rocm:0", "rocm:3").replace("rocm:1", "rocm:5"))
    refused = _cli(["render", "kubernetes", "--config", str(cfg)], env)
    assert refused.returncode == 78
    assert "replica primary-0: device rocm:3 cannot be an allocation ordinal" in refused.stderr
