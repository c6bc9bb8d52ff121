"""The watch on config.yaml in a real `vllm-sr serve` (stand-in workers): a change applies
without a signal whether it is written in place, renamed over the file or swapped in by a
Kubernetes ConfigMap volume's ``..data`` link; a broken file keeps the running generation
serving and says why (event, inventory, /metrics, `vllm-sr status`) until a fix applies; a
half-written file is never loaded; a file the service writes itself (``ctl scale``) reloads
once. Every wait is for a condition with a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.test_serve import Served, free_port, wait_for_ready
from tests.integration.test_supervisor_fake import FAKE_MODULE, REPO_ROOT, wait_for
from tests.support.workers import short_socket_dir
from vllm_sr.control.client import ControlClient

pytestmark = pytest.mark.slow


def config_text(replicas: int, comment: str = "") -> str:
    items = "".join("          - device: cpu\n" for _ in range(replicas))
    return (
        f"# watched config{comment}\n"
        "global:\n"
        "  router:\n"
        "    enabled: false\n"
        "  model_catalog:\n"
        "    deployments:\n"
        "      primary:\n"
        "        provider: model_runtime\n"
        "        artifact: fake/artifact\n"
        "        replicas:\n"
        f"{items}"
        "    system:\n"
        "      decision_model:\n"
        "        deployment: primary\n"
    )


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@contextlib.asynccontextmanager
async def serve_file(
    tmp: Path, config: Path, replicas: int = 1, flags: list[str] | None = None
) -> AsyncIterator[Served]:
    """`vllm-sr serve --config CONFIG` (no deployment flags: the file is served as written),
    with the default watch settings and ``flags``."""
    port = free_port()
    log = tmp / "serve.log"
    run = short_socket_dir(prefix="vsr-watch-") / "run"
    argv = [sys.executable, "-m", "vllm_sr.cli", "serve", "--config", str(config)]
    argv += ["--listen", f"127.0.0.1:{port}", "--runtime-dir", str(run)]
    argv += ["--control-socket", str(run / "control.sock"), *(flags or [])]
    env = {
        **os.environ,
        "PYTHONPATH": REPO_ROOT,
        "VLLM_SR_WORKER_ARGV": f"{sys.executable} -m {FAKE_MODULE} worker",
    }
    with open(log, "wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=out, stderr=out, env=env, cwd=REPO_ROOT
        )
    served = Served(proc, f"http://127.0.0.1:{port}", config, log, run / "control.sock")
    try:
        await wait_for(
            lambda: "serving on" in served.text() or proc.returncode is not None,
            60,
            "serving and watching",
            served.text,
        )
        assert proc.returncode is None, served.text()
        await wait_for_ready(served, replicas, generation=0)
        yield served
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def config_view(served: Served) -> dict[str, Any]:
    return dict((await served.inventory())["service"]["config"])


async def events(served: Served, name: str) -> list[dict[str, Any]]:
    doc = await asyncio.to_thread(ControlClient(served.control).events, 0)
    return [e for e in doc["events"] if e["event"] == name]


async def wait_generation(served: Served, generation: int, timeout: float = 30) -> None:
    async def at() -> bool:
        return bool((await served.inventory())["service"]["generation"] == generation)

    await wait_async(at, timeout, f"generation {generation}", served)


async def wait_async(cond: Any, timeout: float, what: str, served: Served) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        with contextlib.suppress(aiohttp.ClientError):
            if await cond():
                return
        await asyncio.sleep(0.05)
    raise AssertionError(
        f"timed out after {timeout} s waiting for {what}:\n{served.text()[-3000:]}"
    )


async def stays_at(served: Served, generation: int, seconds: float) -> None:
    """The generation does not move for ``seconds``: waiting for it to move must time out."""
    with pytest.raises(AssertionError, match="timed out"):
        await wait_generation(served, generation + 1, timeout=seconds)
    assert (await served.inventory())["service"]["generation"] == generation


async def test_an_in_place_edit_scales_1_to_2_without_a_signal(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(config_text(1))
    async with serve_file(tmp_path, config) as served:
        view = await config_view(served)
        assert view["watch"] is True and view["in_sync"] is True
        assert view["served_hash"] == view["file_hash"] == sha(config_text(1))
        inode = config.stat().st_ino
        with open(config, "r+") as f:  # the same inode, rewritten
            f.truncate(0)
            f.write(config_text(2))
        assert config.stat().st_ino == inode
        await wait_for_ready(served, 2, generation=1)
        view = await config_view(served)
        assert view["served_hash"] == view["file_hash"] == sha(config_text(2))
        published = await events(served, "pool_published")
        assert [e["generation"] for e in published] == [0, 1]


async def test_a_rename_over_applies(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(config_text(1))
    async with serve_file(tmp_path, config) as served:
        tmp = tmp_path / ".config.yaml.swp"
        tmp.write_text(config_text(2))
        os.replace(tmp, config)  # an editor's save
        await wait_for_ready(served, 2, generation=1)
        assert (await config_view(served))["served_hash"] == sha(config_text(2))


def configmap_volume(directory: Path, text: str, stamp: str) -> None:
    """What the kubelet's atomic writer does: the files in a new timestamped directory, then
    ``..data`` swapped to it by one rename; ``config.yaml`` links through ``..data``."""
    version = directory / f"..{stamp}"
    version.mkdir()
    (version / "config.yaml").write_text(text)
    old = os.readlink(directory / "..data") if (directory / "..data").is_symlink() else None
    os.symlink(version.name, directory / "..data_tmp")
    os.replace(directory / "..data_tmp", directory / "..data")
    if not (directory / "config.yaml").is_symlink():
        os.symlink("..data/config.yaml", directory / "config.yaml")
    if old is not None:
        for f in (directory / old).iterdir():
            f.unlink()
        (directory / old).rmdir()


async def test_a_configmap_data_link_swap_applies(tmp_path: Path) -> None:
    volume = tmp_path / "configmap"
    volume.mkdir()
    configmap_volume(volume, config_text(1), "2026_12_05_08_00_00.1")
    config = volume / "config.yaml"
    async with serve_file(tmp_path, config) as served:
        configmap_volume(volume, config_text(2), "2026_12_05_08_01_00.2")
        await wait_for_ready(served, 2, generation=1)
        view = await config_view(served)
        assert view["in_sync"] is True and view["served_hash"] == sha(config_text(2))
        assert config.is_symlink()  # the service never wrote over the volume's link


async def test_a_broken_file_keeps_serving_says_why_and_a_fix_applies(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(config_text(1))
    async with serve_file(tmp_path, config) as served:
        broken = config_text(2).replace("device: cpu", "device: gpu0", 1)
        config.write_text(broken)
        await wait_async(lambda: _has_failure(served), 30, "reload_failed from the watch", served)
        failed = await events(served, "reload_failed")
        assert len(failed) == 1 and failed[0]["source"] == "watch"
        problem = failed[0]["problems"][0]
        line = broken.splitlines().index("          - device: gpu0") + 1
        assert problem.startswith(f"{config}:{line}: ") and "accepted" in problem
        # The running generation serves on.
        async with (
            aiohttp.ClientSession() as s,
            s.post(served.url + "/v1/embeddings", json={"input": "x"}) as r,
        ):
            assert r.status == 200
        view = await config_view(served)
        assert view["in_sync"] is False and view["file_hash"] == sha(broken)
        assert view["served_hash"] == sha(config_text(1))
        assert view["last_failure"]["problems"] == failed[0]["problems"]
        assert view["reload_failures"] == {"watch": 1}
        async with aiohttp.ClientSession() as s, s.get(served.url + "/metrics") as r:
            metrics = await r.text()
        assert 'vllm_sr_config_reload_failures_total{source="watch"} 1.0' in metrics
        assert "vllm_sr_config_in_sync 0.0" in metrics
        assert f'file="{sha(broken)}"' in metrics
        status = await status_text(served)
        assert "not the one being served" in status and f":{line}:" in status
        # The broken file is refused once, not on every look.
        await stays_at(served, 0, 3.0)
        assert len(await events(served, "reload_failed")) == 1
        config.write_text(config_text(2))  # the fix
        await wait_for_ready(served, 2, generation=1)
        view = await config_view(served)
        assert view["in_sync"] is True and view["last_failure"] is None


async def status_text(served: Served) -> str:
    """What `vllm-sr status` prints for the running service."""
    status = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "vllm_sr.cli", "status", "--socket", str(served.control)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": REPO_ROOT, "COLUMNS": "200"},
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    return status.stdout


async def _has_failure(served: Served) -> bool:
    return bool(await events(served, "reload_failed"))


async def test_a_partial_write_never_loads_the_half(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(config_text(1))
    full = config_text(3, comment=" (three replicas)")
    # Cut after the second replica: the half alone is a valid config (two replicas).
    lines = full.splitlines(keepends=True)
    second = [i for i, line in enumerate(lines) if "- device: cpu" in line][1]
    cut = len("".join(lines[: second + 1]))
    half = full[:cut]
    async with serve_file(tmp_path, config) as served:
        with open(config, "w") as f:
            f.write(half)
            f.flush()
            # The writer pauses a second (the half sits on disk); nothing loads meanwhile.
            await stays_at(served, 0, 1.0)
            f.write(full[cut:])
        await wait_for_ready(served, 3, generation=1)
        await stays_at(served, 1, 3.0)  # and only the whole file loaded, once
        assert not await events(served, "reload_failed")
        assert (await config_view(served))["served_hash"] == sha(full)


async def test_a_scale_through_the_control_api_reloads_once(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(config_text(1))
    async with serve_file(tmp_path, config) as served:
        out = await asyncio.to_thread(ControlClient(served.control).scale, "primary", 2)
        assert out["generation"] == 1
        # The service wrote the file itself: the watch sees the change and reloads nothing.
        await stays_at(served, 1, 4.0)
        view = await config_view(served)
        assert view["in_sync"] is True and view["file_hash"] == sha(config.read_text())


async def test_with_the_watch_off_an_edit_waits_for_a_reload_and_status_says_so(
    tmp_path: Path,
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(config_text(1))
    async with serve_file(tmp_path, config, flags=["--no-config-watch"]) as served:
        config.write_text(config_text(2))
        await stays_at(served, 0, 3.0)  # longer than the settle time: nothing applies
        view = await config_view(served)
        assert view["watch"] is False and view["in_sync"] is False
        assert view["file_hash"] == sha(config_text(2))
        status = await status_text(served)
        assert "not the one being served" in status and "ctl reload" in status
        await asyncio.to_thread(ControlClient(served.control).reload)
        await wait_for_ready(served, 2, generation=1)
        assert (await config_view(served))["in_sync"] is True
