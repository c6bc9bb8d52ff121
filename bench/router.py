"""Router benchmark: what routing adds to a chat. The same chat is sent straight to an
OpenAI-compatible backend (a stand-in from tests/support/backends.py, in its own process) and
through the router (``model: auto``), interleaved, at c=1 and c=32; printed as p50 / p99 of each
and the added milliseconds, for keyword-only decisions and for embedding + domain decisions
(those ask the d3-edge deployment one bundle per chat). At c=1 it also prints one bare
d3-edge embeddings request straight to the worker (one forward over HTTP), interleaved, to
read the second aim against.

Aims (issue 15): keyword-only adds under 1 ms p50; embedding + domain add no more than one
d3-edge forward + 3 ms at c=1.

Targets:
  --target service     (default) the real ``python -m vllm_sr.cli serve`` with a config that
                       has ``providers:`` and ``routing:`` (needs Router mode wired into serve)
  --target standalone  a d3-edge worker process and a router process (bench/router.py
                       --router-process) whose exchange posts bundles straight to the worker
                       over its Unix socket (no pool): the router's own cost, available before
                       the wiring.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TEXTS = [
    "please debug this function, it crashes",
    "I was charged twice for my order, can I get a refund?",
    "solve this integral of x squared",
    "what is a good name for a cat",
]
KEYWORD_ROUTING: dict[str, Any] = {
    "signals": {"keywords": [{"name": "code", "keywords": ["code", "debug", "function"]}]},
    "decisions": [
        {
            "name": "coding",
            "priority": 100,
            "rules": {"operator": "OR", "conditions": [{"type": "keyword", "name": "code"}]},
            "modelRefs": [{"model": "general"}],
        }
    ],
}
SEMANTIC_ROUTING: dict[str, Any] = {
    "signals": {
        "keywords": KEYWORD_ROUTING["signals"]["keywords"],
        "embeddings": [
            {
                "name": "billing",
                "threshold": 0.6,
                "candidates": ["refund my order", "I was charged twice", "billing problem"],
            }
        ],
        "domains": [
            {"name": "math", "description": "Mathematics", "examples": ["solve this integral"]},
            {"name": "other", "description": "General questions", "examples": ["tell me a story"]},
        ],
    },
    "decisions": [
        *KEYWORD_ROUTING["decisions"],
        {
            "name": "billing",
            "priority": 50,
            "rules": {"operator": "OR", "conditions": [{"type": "embedding", "name": "billing"}]},
            "modelRefs": [{"model": "general"}],
        },
        {
            "name": "maths",
            "priority": 10,
            "rules": {"operator": "OR", "conditions": [{"type": "domain", "name": "math"}]},
            "modelRefs": [{"model": "general"}],
        },
    ],
}
SCENARIOS = {"keyword-only": KEYWORD_ROUTING, "embedding+domain": SEMANTIC_ROUTING}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


# -- targets --------------------------------------------------------------------------------


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


def start_standalone(
    procs: Procs, routing: dict[str, Any], backend_port: int, worker_uds: Path
) -> str:
    port = free_port()
    spec = procs.tmp / "router.json"
    spec.write_text(json.dumps({"providers": providers(backend_port), "routing": routing}))
    argv = [sys.executable, str(REPO / "bench" / "router.py"), "--router-process", str(spec)]
    argv += ["--port", str(port), "--uds", str(worker_uds)]
    proc, log = procs.start("router", argv)
    wait_http(f"http://127.0.0.1:{port}/v1/models", 60, proc, log)
    return f"http://127.0.0.1:{port}"


def router_process(spec_path: str, port: int, uds: str) -> None:
    """The standalone target: ChatRouter in its own process, bundles straight to the worker."""
    from aiohttp import web

    from vllm_sr.config.routing import Providers, Routing
    from vllm_sr.router.chat import build_chat_router

    spec = json.loads(Path(spec_path).read_text())

    async def main() -> None:
        session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=uds))

        async def exchange(dep: str, path: str, body: bytes, timeout_ms: float | None) -> Any:
            async with session.post(f"http://worker{path}", data=body) as r:
                return r.status, await r.read()

        chat = build_chat_router(
            Providers.model_validate(spec["providers"]),
            Routing.model_validate(spec["routing"]),
            exchange=exchange,
            decision_deployment="primary",
            auto_model_names=["auto"],
        )
        await chat.backends.start()
        await chat.router.warm()
        app = web.Application()
        app.add_routes(chat.routes())
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    asyncio.run(main())


# -- load -----------------------------------------------------------------------------------


async def run_load(
    send: Callable[[int], Awaitable[None]], concurrency: int, total: int
) -> list[float]:
    latencies: list[float] = []
    counter = iter(range(total))

    async def lane() -> None:
        for i in counter:
            t0 = time.perf_counter()
            await send(i)
            latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return latencies


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] * 1000.0


def chat_sender(session: aiohttp.ClientSession, url: str, model: str) -> Any:
    async def send(i: int) -> None:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": TEXTS[i % len(TEXTS)]}],
            "max_tokens": 16,
        }
        async with session.post(f"{url}/v1/chat/completions", json=body) as r:
            await r.read()
            if r.status != 200:
                raise SystemExit(f"bench: {url} answered {r.status}")

    return send


async def measure(
    backend: str, router: str, rounds: int, counts: dict[int, int], uds: Path
) -> None:
    connector = aiohttp.TCPConnector(limit=0)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(uds))) as worker,
    ):
        direct = chat_sender(session, backend, "general")
        routed = chat_sender(session, router, "auto")
        forward = embed_sender(worker)
        await run_load(routed, 4, 40)  # warm every path
        await run_load(direct, 4, 40)
        await run_load(forward, 1, 20)
        for conc, total in counts.items():
            d_all: list[float] = []
            r_all: list[float] = []
            f_all: list[float] = []
            for _ in range(rounds):  # interleaved: all see the same background load
                d_all += await run_load(direct, conc, total)
                r_all += await run_load(routed, conc, total)
                if conc == 1:
                    f_all += await run_load(forward, 1, total)
            d50, d99 = pct(d_all, 0.5), pct(d_all, 0.99)
            r50, r99 = pct(r_all, 0.5), pct(r_all, 0.99)
            extra = f" | one d3-edge forward p50 {pct(f_all, 0.5):6.2f} ms" if f_all else ""
            print(
                f"  c={conc:<3} direct p50 {d50:7.2f} p99 {d99:7.2f} | routed p50 {r50:7.2f} "
                f"p99 {r99:7.2f} | added p50 {r50 - d50:+7.2f} ms p99 {r99 - d99:+7.2f} ms{extra}",
                flush=True,
            )


def embed_sender(worker: aiohttp.ClientSession) -> Any:
    """One d3-edge embeddings request (one text) straight to the worker: one forward."""

    async def send(i: int) -> None:
        body = {"input": [TEXTS[i % len(TEXTS)]]}
        async with worker.post("http://worker/v1/embeddings", json=body) as r:
            await r.read()

    return send


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=("service", "standalone"), default="service")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests-c1", type=int, default=100)
    parser.add_argument("--requests-c32", type=int, default=640)
    parser.add_argument("--router-process", metavar="SPEC", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--uds", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.router_process:
        router_process(args.router_process, args.port, args.uds)
        return
    tmp = Path(tempfile.mkdtemp(prefix="vsr-bench-router-"))
    procs = Procs(tmp)
    try:
        run(args, procs, tmp)
    finally:
        procs.stop_all()


def run(args: argparse.Namespace, procs: Procs, tmp: Path) -> None:
    backend_port = free_port()
    proc, log = procs.start(
        "backend", [sys.executable, "-m", "tests.support.backends", "--port", str(backend_port)]
    )
    backend = f"http://127.0.0.1:{backend_port}"
    wait_http(f"{backend}/v1/models", 30, proc, log)
    run_dir = Path(tempfile.mkdtemp(prefix="vsr-b-", dir="/tmp"))
    uds = run_dir / "w.sock" if args.target == "standalone" else run_dir / "workers/primary-0.sock"
    if args.target == "standalone":
        argv = [sys.executable, "-m", "vllm_sr.cli", "worker", "vllm-sr/d3-edge", "--uds", str(uds)]
        wproc, wlog = procs.start("worker", argv)
        deadline = time.monotonic() + 300
        while not uds.exists() and time.monotonic() < deadline and wproc.poll() is None:
            time.sleep(0.1)
        wait_unix_health(uds, wproc, wlog)
    counts = {1: args.requests_c1, 32: args.requests_c32}
    for name, routing in SCENARIOS.items():
        if args.target == "standalone":
            router = start_standalone(procs, routing, backend_port, uds)
        else:
            router = start_service(procs, routing, backend_port, run_dir)
        print(f"{name} ({args.target}):", flush=True)
        asyncio.run(measure(backend, router, args.rounds, counts, uds))
        procs.stop(procs.procs[-1])


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


if __name__ == "__main__":
    main()
