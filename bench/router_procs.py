"""The processes bench/router.py starts and measures: the stand-in backend's and the router's
(its ``--router-process`` mode: the Router-mode handlers on our HTTP server, as the frontend
mounts them), a d3-edge worker's, or the whole service's."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import REPO, free_port

Exchange = Callable[[str, str, bytes, float | None], Awaitable[tuple[int, bytes]]]


def providers(backend_port: int) -> dict[str, Any]:
    return {
        "defaults": {"default_model": "general"},
        "models": [
            {"name": "general", "backend_refs": [{"endpoint": f"127.0.0.1:{backend_port}"}]}
        ],
    }


def wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"bench: {proc.args!r} exited:\n{log.read_text(errors='replace')}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"bench: {url} not up after {timeout} s:\n{log.read_text(errors='replace')}")


class Procs:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, argv: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.tmp / f"{name}.log"
        with open(log, "wb") as out:
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            proc = subprocess.Popen(argv, stdout=out, stderr=out, env=env, cwd=REPO)
        self.procs.append(proc)
        return proc, log

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                self.stop(proc)


def start_service(procs: Procs, routing: dict[str, Any], backend_port: int, run: Path) -> str:
    port = free_port()
    config = procs.tmp / "config.yaml"
    doc = {
        "providers": providers(backend_port),
        "routing": routing,
        "global": {"model_catalog": {"deployments": {"primary": {"device": "cpu"}}}},
    }
    config.write_text(json.dumps(doc, indent=2))  # JSON is YAML
    argv = [sys.executable, "-m", "vllm_sr.cli", "serve", "vllm-sr/d3-edge", "--platform", "cpu"]
    argv += ["--config", str(config), "--listen", f"127.0.0.1:{port}"]
    argv += ["--runtime-dir", str(run), "--control-socket", str(run / "c")]
    proc, log = procs.start("serve", argv)
    wait_http(f"http://127.0.0.1:{port}/health", 300, proc, log)
    return f"http://127.0.0.1:{port}"


def start_router(
    procs: Procs, routing: dict[str, Any], backend_port: int, worker_uds: Path | None
) -> tuple[str, str]:
    """-> (the router's URL, what its start-up said: the language detector's warm-up)."""
    port = free_port()
    spec = procs.tmp / "router.json"
    spec.write_text(json.dumps({"providers": providers(backend_port), "routing": routing}))
    argv = [sys.executable, str(REPO / "bench" / "router.py"), "--router-process", str(spec)]
    argv += ["--port", str(port)]
    if worker_uds is not None:
        argv += ["--uds", str(worker_uds)]
    proc, log = procs.start("router", argv)
    wait_http(f"http://127.0.0.1:{port}/v1/models", 120, proc, log)
    said = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("ready:")]
    return f"http://127.0.0.1:{port}", said[-1].removeprefix("ready:").strip() if said else ""


def uds_exchange(session: aiohttp.ClientSession) -> Exchange:
    """Bundles straight to the worker's Unix socket (no pool)."""

    async def exchange(dep: str, path: str, body: bytes, timeout_ms: float | None) -> Any:
        async with session.post(f"http://worker{path}", data=body) as r:
            return r.status, await r.read()

    return exchange


async def no_worker(dep: str, path: str, body: bytes, timeout_ms: float | None) -> Any:
    raise RuntimeError(f"bench: no worker in this target, yet the router asked {dep} {path}")


def router_process(spec_path: str, port: int, uds: str | None) -> None:
    """The local and standalone targets: the Router-mode handlers on our HTTP server in their
    own process, as the frontend mounts them (``resolve`` over ``ChatRouter.routes()``)."""
    from vllm_sr import aio, wire
    from vllm_sr.config.routing import Routing
    from vllm_sr.config.routing_providers import Providers
    from vllm_sr.errors import VllmSrError
    from vllm_sr.httpserver import HttpServer, Request, Response, StreamResponse, resolve
    from vllm_sr.router.chat import build_chat_router, error_response

    spec = json.loads(Path(spec_path).read_text())

    async def main() -> None:
        session = None
        exchange: Exchange = no_worker
        if uds is not None:
            session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=uds))
            exchange = uds_exchange(session)
        chat = build_chat_router(
            Providers.model_validate(spec["providers"]),
            Routing.model_validate(spec["routing"]),
            exchange=exchange,
            decision_deployment="primary",
            auto_model_names=["auto"],
        )
        await chat.backends.start()
        await chat.router.warm()
        t0 = time.perf_counter()
        chat.router.deterministic.warm()  # lingua loads its models on first use
        warm_s = time.perf_counter() - t0
        routes = chat.routes()

        async def handle(request: Request) -> Response | StreamResponse:
            try:
                return await resolve(routes, request)(request)
            except VllmSrError as exc:
                return error_response(exc)

        server = HttpServer(
            handle,
            max_body=wire.MAX_BODY_BYTES,
            read_timeout_s=wire.READ_TIMEOUT_S,
            cancel_on_disconnect=True,
        )
        await server.listen_tcp("127.0.0.1", port)
        languages = bool(chat.router.deterministic.language)
        print(
            f"ready: loop {aio.loop_name()}, language detector warm-up "
            + (f"{warm_s:.2f} s" if languages else "(no language rule)"),
            flush=True,
        )
        await asyncio.Event().wait()

    aio.run(main())


def wait_unix_health(uds: Path, proc: subprocess.Popen[bytes], log: Path) -> None:
    async def ready() -> bool:
        try:
            async with (
                aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(uds))) as s,
                s.get("http://worker/health") as r,
            ):
                return r.status == 200
        except (aiohttp.ClientError, OSError):
            return False

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"bench: the worker exited:\n{log.read_text(errors='replace')}")
        if asyncio.run(ready()):
            return
        time.sleep(0.2)
    raise SystemExit("bench: the worker never became ready")
