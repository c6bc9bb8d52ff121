"""Response-cache benchmark: what a cache hit saves. A router process (the Router-mode
handlers in our HTTP server, bench/router_cache.py --router-process) in front of a stand-in
OpenAI-compatible backend (tests/support/backends.py, its own process); the client here sends
chats with aiohttp and prints p50 / p99 of an exact hit, a semantic hit and a miss, at c=1 and
c=64.

- exact: a decision with ``response_cache`` mode exact; the hit repeats a warmed text, the
  miss sends a new text each time.
- semantic: a decision on an embedding signal with mode semantic (threshold 0.97); the routing
  embedding comes from tests/support's fake worker exchange (the worker's bundle code over a
  toy hashed bag-of-words encoder, in the router process: no model forward), and the cache
  reuses it. A hit sends a new exact text with the same words (different punctuation, so the
  exact key differs); a miss adds a new word.

The stand-in backend answers at once (``--backend-delay-ms`` adds a think time), so a miss
here is the router plus one backend round trip on loopback: real models make misses far
slower, hits stay the same.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.common import free_port  # noqa: E402

AUTO = "vllm-sr/auto"
BILLING = "I was charged twice for my order"
ROUTING: dict[str, Any] = {
    "signals": {
        "keywords": [{"name": "cacheme", "operator": "OR", "keywords": ["cacheme"]}],
        "embeddings": [
            {"name": "billing", "threshold": 0.5, "candidates": [BILLING, "refund my order"]}
        ],
    },
    "decisions": [
        {
            "name": "exact",
            "priority": 100,
            "rules": {"operator": "AND", "conditions": [{"type": "keyword", "name": "cacheme"}]},
            "modelRefs": [{"model": "general"}],
            "plugins": [
                {"type": "response_cache", "configuration": {"enabled": True, "mode": "exact"}}
            ],
        },
        {
            "name": "semantic",
            "priority": 50,
            "rules": {"operator": "AND", "conditions": [{"type": "embedding", "name": "billing"}]},
            "modelRefs": [{"model": "general"}],
            "plugins": [
                {
                    "type": "response_cache",
                    "configuration": {
                        "enabled": True,
                        "mode": "semantic",
                        "semantic": {"similarity_threshold": 0.97},
                    },
                }
            ],
        },
    ],
}


def router_process(port: int, backend_port: int) -> None:
    """Serve the router (in this process) until killed."""
    import uvloop

    from tests.support.router_app import serve_routes, start_router
    from vllm_sr.config.routing import Routing
    from vllm_sr.config.routing_providers import Providers

    async def serve() -> None:
        providers = Providers.model_validate(
            {
                "defaults": {"default_model": "general"},
                "models": [
                    {
                        "name": "general",
                        "backend_refs": [{"endpoint": f"127.0.0.1:{backend_port}"}],
                    }
                ],
            }
        )
        chat = await start_router(providers, Routing.model_validate(ROUTING))
        await serve_routes(chat.routes(), port=port, cancel_on_disconnect=False)
        print("ready", flush=True)
        await asyncio.Event().wait()

    uvloop.run(serve())


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), 0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"port {port} did not open within {timeout:g} s")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(url: str, concurrency: int, n: int) -> dict[str, tuple[float, float, int]]:
    counter = itertools.count()
    suffixes = ("!", "?", ".", ",")

    def text_for(kind: str) -> str:
        i = next(counter)
        if kind == "exact hit":
            return "cacheme the warmed question"
        if kind == "exact miss":
            return f"cacheme question number {i}"
        if kind == "semantic hit":  # same words, new punctuation: a new exact key
            marks = "".join(suffixes[int(d)] for d in oct(i)[2:] if int(d) < 4)
            return f"{BILLING}{marks}{'!' * (i % 7)}"
        return f"{BILLING} zz{i}"  # semantic miss: a new word

    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrency * 2),
        headers={"x-authz-user-id": "bench"},
    ) as session:

        async def one(text: str) -> tuple[float, bool]:
            body = {"model": AUTO, "messages": [{"role": "user", "content": text}]}
            started = time.perf_counter()
            async with session.post(f"{url}/v1/chat/completions", json=body) as r:
                await r.read()
                assert r.status == 200, r.status
                hit = r.headers.get("x-vsr-cache-hit") == "true"
            return time.perf_counter() - started, hit

        for warm in ("cacheme the warmed question", BILLING):
            await one(warm)
        out: dict[str, tuple[float, float, int]] = {}
        for kind in ("exact hit", "semantic hit", "exact miss", "semantic miss"):
            times: list[float] = []
            hits = 0
            queue = [text_for(kind) for _ in range(n)]

            async def worker(q: list[str] = queue, t: list[float] = times) -> int:
                got = 0
                while q:
                    took, hit = await one(q.pop())
                    t.append(took)
                    got += hit
                return got

            hits = sum(await asyncio.gather(*(worker() for _ in range(concurrency))))
            out[kind] = (pct(times, 0.5) * 1000, pct(times, 0.99) * 1000, hits)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--router-process", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--backend-port", type=int, default=0)
    parser.add_argument("--n1", type=int, default=200, help="chats per kind at c=1")
    parser.add_argument("--n64", type=int, default=1280, help="chats per kind at c=64")
    parser.add_argument(
        "--backend-delay-ms", type=float, default=0.0, help="the stand-in's think time per answer"
    )
    args = parser.parse_args()
    if args.router_process:
        router_process(args.port, args.backend_port)
        return
    backend_port, port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}"}
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.support.backends", "--port", str(backend_port),
                 "--delay-ms", str(args.backend_delay_ms)],
                cwd=REPO, env=env, stdout=(logs / "backend.log").open("wb"),
                stderr=subprocess.STDOUT,
            ),
            subprocess.Popen(
                [sys.executable, __file__, "--router-process", "--port", str(port),
                 "--backend-port", str(backend_port)],
                cwd=REPO, env=env, stdout=(logs / "router.log").open("wb"),
                stderr=subprocess.STDOUT,
            ),
        ]  # fmt: skip
        try:
            wait_port(backend_port, procs[0])
            wait_port(port, procs[1])
            url = f"http://127.0.0.1:{port}"
            print(f"{'kind':<14} {'c':>3} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'hits':>6}")
            for c, n in ((1, args.n1), (64, args.n64)):
                for kind, (p50, p99, hits) in asyncio.run(run(url, c, n)).items():
                    print(f"{kind:<14} {c:>3} {n:>5} {p50:>8.2f} {p99:>8.2f} {hits:>6}")
        finally:
            for p in procs:
                p.terminate()
                p.wait(10)


if __name__ == "__main__":
    main()
