"""A stand-in worker process for supervisor and frontend tests that are about processes,
sockets, signals and dispatch rather than the model: it speaks the worker HTTP API
(docs/internals.md) over a Unix socket, starts in milliseconds, and has knobs in its
environment. Run as ``python -m tests.integration.test_supervisor_fake ARTIFACT --uds PATH ...``.

Knobs: ``FAKE_EXIT_CODE`` (exit at once with that code, after a line on stderr),
``FAKE_READY_DELAY_S`` (503 ``loading`` that long), ``FAKE_READY_FILE`` (503 ``loading`` until
that file exists; ``{replica}`` in it is the replica id), ``FAKE_LIMITS`` (JSON for /health limits),
``VLLM_SR_FAULT_FORWARD_DELAY_MS`` and ``POST /debug/faults`` (delay every answer, with
``VLLM_SR_ENABLE_FAULTS=1``), ``FAKE_IGNORE_SIGTERM=1``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.workers import short_socket_dir
from vllm_sr.control.commands import Command
from vllm_sr.frontend.app import Frontend
from vllm_sr.plan import DeploymentPlan, ReplicaSpec, ServicePlan
from vllm_sr.pool.settings import PoolSettings
from vllm_sr.supervisor.managed import ProcessOptions
from vllm_sr.supervisor.supervisor import Supervisor

FAKE_MODULE = "tests.integration.test_supervisor_fake"


def spec_of(
    id: str,
    deployment: str,
    index: int,
    *,
    artifact: str = "fake/artifact",
    revision: str | None = None,
    device: str | None = "cpu",
    threads: int | None = 1,
    **kw: Any,
) -> ReplicaSpec:
    """Placement's ReplicaSpec with the fake worker's defaults, for plans built in tests."""
    return ReplicaSpec(id, deployment, index, artifact, revision, device, threads=threads, **kw)


def fake_worker_argv() -> list[str]:
    return [sys.executable, "-m", FAKE_MODULE, "worker"]


def test_spec_identity_ignores_env_and_id() -> None:
    a = spec_of("primary-0", "primary", 0, env={"A": "1"})
    b = spec_of("primary-1", "primary", 1)
    assert a.identity() == b.identity()
    assert spec_of("primary-0", "primary", 0, threads=2).identity() != a.identity()


# ---------------------------------------------------------------------- the fake worker


def _main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("command")
    p.add_argument("artifact")
    p.add_argument("--uds")
    p.add_argument("--port", type=int)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--replica-id", default="")
    p.add_argument("--served-model-name", action="append", default=[])
    p.add_argument("--revision", default=None)
    p.add_argument("--result-cache-bytes", type=int, default=0)
    args = p.parse_args(argv)
    code = os.environ.get("FAKE_EXIT_CODE")
    if code:
        print(f"fake worker {args.replica_id}: refusing artifact {args.artifact}", file=sys.stderr)
        return int(code)
    if os.environ.get("FAKE_IGNORE_SIGTERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    asyncio.run(_serve(args))
    return 0


async def _serve(args: argparse.Namespace) -> None:
    from aiohttp import web

    started = time.monotonic()
    ready_delay = float(os.environ.get("FAKE_READY_DELAY_S", "0"))
    ready_file = os.environ.get("FAKE_READY_FILE", "").replace("{replica}", args.replica_id or "")
    limits = json.loads(os.environ.get("FAKE_LIMITS", "null")) or {
        "max_num_seqs": args.max_num_seqs or 64,
        "max_num_batched_tokens": args.max_num_batched_tokens or 8192,
    }
    faults = {"forward_delay_ms": float(os.environ.get("VLLM_SR_FAULT_FORWARD_DELAY_MS", "0"))}
    enable_faults = os.environ.get("VLLM_SR_ENABLE_FAULTS") == "1"
    running: dict[int, float] = {}  # in-flight "forwards": id -> when it began
    cache = {"max_bytes": args.result_cache_bytes}  # its bound only: nothing is cached

    async def health(request: web.Request) -> web.Response:
        ready = time.monotonic() - started >= ready_delay
        ready = ready and (not ready_file or os.path.exists(ready_file))
        body = {
            "status": "ready" if ready else "loading",
            "reason": None,
            "api_version": 1,
            "model": args.artifact,
            "limits": limits,
            "threads": args.threads,
            "replica": args.replica_id,
            "pid": os.getpid(),
            "forward_running": bool(running),
            "forward_running_s": time.monotonic() - min(running.values()) if running else 0.0,
            "queue_rows": max(0, len(running) - 1),
            "result_cache_bytes": cache["max_bytes"],
        }
        return web.json_response(body, status=200 if ready else 503)

    async def surface(request: web.Request) -> web.Response:
        doc = await request.json()
        key = id(request)
        running[key] = time.monotonic()
        try:
            if faults["forward_delay_ms"] > 0:
                await asyncio.sleep(faults["forward_delay_ms"] / 1000.0)
        finally:
            running.pop(key, None)
        inputs = doc.get("input", "")
        rows = inputs if isinstance(inputs, list) else [inputs]
        data = [{"index": i, "embedding": [float(len(str(t))), 1.0]} for i, t in enumerate(rows)]
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "replica": args.replica_id,
                "pid": os.getpid(),
                "model_seen": doc.get("model"),
            }
        )

    async def set_faults(request: web.Request) -> web.Response:
        if not enable_faults:
            return web.json_response({"error": {"code": "not_found"}}, status=404)
        doc = await request.json()
        faults["forward_delay_ms"] = float(doc.get("forward_delay_ms", 0))
        return web.json_response({"ok": True, **faults})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/embeddings", surface)
    app.router.add_post("/v1/classify", surface)
    app.router.add_post("/v1/bundle", surface)

    async def set_result_cache(request: web.Request) -> web.Response:
        cache["max_bytes"] = int((await request.json())["max_bytes"])
        return web.json_response({"ok": True, "result_cache_bytes": cache["max_bytes"]})

    app.router.add_post("/debug/faults", set_faults)
    app.router.add_post("/admin/result-cache", set_result_cache)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
    await runner.setup()
    if args.port:
        await web.TCPSite(runner, "127.0.0.1", args.port).start()
    else:
        await web.UnixSite(runner, args.uds).start()
    parent = int(os.environ.get("VLLM_SR_PARENT_PID", "0") or 0)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if os.environ.get("FAKE_IGNORE_SIGTERM") != "1":
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    while not stop.is_set():
        if parent and os.getppid() != parent:
            break  # the supervisor is gone: no orphans
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)
    await runner.cleanup()


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))


# ---------------------------------------------------------------------- a service in-process

REPO_ROOT = str(Path(__file__).resolve().parents[2])


def fake_spec(deployment: str, index: int, **kw: Any) -> ReplicaSpec:
    env = {"PYTHONPATH": REPO_ROOT, **kw.pop("env", {})}
    return spec_of(f"{deployment}-{index}", deployment, index, env=env, **kw)


def fake_plan(replicas: int, *, deployment: str = "primary", **kw: Any) -> ServicePlan:
    settings = PoolSettings(timeout_ms=kw.pop("timeout_ms", 2000), **kw.pop("outlier", {}))
    specs = [fake_spec(deployment, i, **kw) for i in range(replicas)]
    dep = DeploymentPlan(deployment, "fake/artifact", specs, settings=settings)
    return ServicePlan({deployment: dep}, deployment, {"replicas": replicas})


@dataclass
class Service:
    sup: Supervisor
    frontend: Frontend
    url: str
    loop_task: asyncio.Task[None]

    async def stop(self) -> None:
        if not self.sup.stopping:
            self.sup.queue.put_nowait(Command("stop", source="test"))
        try:
            await asyncio.wait_for(self.loop_task, 30)
        finally:
            self.sup.shutdown.kill_all_now()
            await self.frontend.stop()


async def start_service(
    planner: Callable[[], ServicePlan],
    *,
    worker_argv: list[str] | None = None,
    wait_ready: bool = True,
    **options: Any,
) -> Service:
    drain = options.pop("drain_timeout_s", 10.0)
    notifier = options.pop("notifier", None)
    opts = ProcessOptions(
        worker_argv=worker_argv if worker_argv is not None else fake_worker_argv(),
        ready_timeout_s=options.pop("ready_timeout_s", 300.0),
        stop_grace_s=options.pop("stop_grace_s", 5.0),
        **options,
    )
    sup = Supervisor(
        planner,
        runtime_dir=str(short_socket_dir(prefix="vsr-")),
        options=opts,
        drain_timeout_s=drain,
        notifier=notifier,
    )
    await sup.start()
    frontend = Frontend(sup)
    address = await frontend.start("127.0.0.1", 0)
    service = Service(sup, frontend, f"http://{address}", asyncio.create_task(sup.run()))
    if wait_ready:
        await wait_for(lambda: all_ready(sup), 300, "every replica ready", sup.inventory)
    return service


async def wait_for(
    cond: Callable[[], Any], timeout: float, what: str, detail: Callable[[], Any] | None = None
) -> Any:
    """Poll ``cond`` until it is truthy; fail with ``what`` (and ``detail()``) at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        await asyncio.sleep(0.02)
    extra = f": {detail()}" if detail is not None else ""
    raise AssertionError(f"timed out after {timeout} s waiting for {what}{extra}")


def all_ready(sup: Supervisor) -> bool:
    deps = sup.inventory()["deployments"]
    return bool(deps) and all(d["ready_replicas"] == d["desired_replicas"] for d in deps)


def replica_doc(sup: Supervisor, rid: str) -> dict[str, Any]:
    for dep in sup.inventory()["deployments"]:
        for rep in dep["replicas"]:
            if rep["id"] == rid:
                return dict(rep)
    raise KeyError(rid)
