"""What a looper adds over the sum of its backend calls (bench/router.py ``--target looper``).

Two stand-in backends (tests/support/backends.py, each in its own process, answering after a
fixed think time, ``--think-ms``; their logprobs put every answer at the same confidence) and
a router process (the Router-mode handlers on our HTTP server, as bench/router.py's local
target) with two keyword decisions:

- ``loop``: the confidence looper (vllm_sr/router/looper) over ``small`` and ``big``
  (``small_to_large``, hybrid, threshold 0.72: no answer reaches it, so every chat makes two
  internal calls, small then big, and keeps big's answer);
- ``static``: ``big`` alone, one backend call.

Looper chats and static chats are sent interleaved (same background load), not streamed, at
c=1 and c=N. Two figures per chat, p50 and p99 printed with the raw sums:

- **in the router** (exact): the router process times its chat handler and each call to
  ``forward`` (the backend call with its retries and fallback: what a looper's internal call
  is) for every chat, and reports them; a looper's own cost is handler time minus the sum of
  its calls' times, against the same figure for a static chat (routing and the answer);
- **end to end** (as a client sees it): a looper chat's wall time minus ``iterations`` x the
  p50 wall time of the static chats of the same run (one static chat = one backend call
  through the router).

    python bench/router.py --target looper [-- --think-ms 50 --n1 100 --nc 320 --concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import free_port  # noqa: E402
from bench.router_load import pct  # noqa: E402
from bench.router_procs import Procs, wait_http  # noqa: E402

TIMINGS_PATH = "/bench/timings"
KINDS = ("loop", "static")


def routing() -> dict[str, Any]:
    keyword = [{"name": k, "operator": "OR", "keywords": [k]} for k in KINDS]

    def rule(name: str) -> dict[str, Any]:
        return {"operator": "AND", "conditions": [{"type": "keyword", "name": name}]}

    confidence = {"confidence_method": "hybrid", "threshold": 0.72}
    confidence["escalation_order"] = "small_to_large"
    return {
        "modelCards": [{"name": "big", "param_size": "70b"}, {"name": "small", "param_size": "8b"}],
        "signals": {"keywords": keyword},
        "decisions": [
            {
                "name": "loop",
                "priority": 20,
                "rules": rule("loop"),
                "modelRefs": [{"model": "big"}, {"model": "small"}],
                "algorithm": {"type": "confidence", "confidence": confidence},
            },
            {
                "name": "static",
                "priority": 10,
                "rules": rule("static"),
                "modelRefs": [{"model": "big"}],
            },
        ],
    }


def providers(ports: dict[str, int]) -> dict[str, Any]:
    return {
        "defaults": {"default_model": "big"},
        "models": [
            {"name": n, "backend_refs": [{"endpoint": f"127.0.0.1:{p}"}]} for n, p in ports.items()
        ],
    }


# -- the router process: the handlers, timed ----------------------------------------------------


def router_process(spec_path: str, port: int) -> None:
    """Router mode on our HTTP server, with its chat handler and ``forward`` timed per chat;
    ``GET /bench/timings``: the samples so far (and forgets them)."""
    from vllm_sr import aio, wire
    from vllm_sr.config.routing import Routing
    from vllm_sr.config.routing_providers import Providers
    from vllm_sr.httpserver import HttpServer, PathRoutes, Request, Response, StreamResponse
    from vllm_sr.httpserver import answer as answer_route
    from vllm_sr.router.chat import build_chat_router

    spec = json.loads(Path(spec_path).read_text())
    calls: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar(
        "calls", default=None
    )
    samples: list[dict[str, Any]] = []

    async def no_worker(dep: str, path: str, body: bytes, timeout_ms: float | None) -> Any:
        raise RuntimeError(f"bench: no worker here, yet the router asked {dep} {path}")

    async def main() -> None:
        chat = build_chat_router(
            Providers.model_validate(spec["providers"]),
            Routing.model_validate(spec["routing"]),
            exchange=no_worker,
            decision_deployment="primary",
            auto_model_names=["auto"],
            cache=False,
        )
        await chat.backends.start()
        # every body sent to a model goes through fallback.forward: the chat's own answer
        # (pipeline's backend stage) and each looper call (looper/dispatch); time both
        from vllm_sr.router import fallback, pipeline
        from vllm_sr.router.looper import dispatch

        forward = fallback.forward

        async def timed_forward(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await forward(*args, **kwargs)
            finally:
                got = calls.get()
                if got is not None:
                    got.append(time.perf_counter() - t0)

        pipeline.forward = timed_forward
        dispatch.forward = timed_forward
        routes: dict[str, dict[str, Any]] = dict(chat.routes())
        handle_chat = routes["/v1/chat/completions"]["POST"]

        async def timed_chat(request: Request) -> Response | StreamResponse:
            mine: list[float] = []
            calls.set(mine)
            t0 = time.perf_counter()
            answer = await handle_chat(request)
            took = time.perf_counter() - t0
            decision = answer.headers.get("x-vsr-selected-decision", "")
            samples.append({"decision": decision, "handler_s": took, "calls_s": mine})
            return answer

        async def timings(request: Request) -> Response:
            out = json.dumps(samples).encode()
            samples.clear()
            return Response(out)

        routes["/v1/chat/completions"] = {"POST": timed_chat}
        routes[TIMINGS_PATH] = {"GET": timings}
        paths = PathRoutes(routes)

        async def handle(request: Request) -> Response | StreamResponse:
            return await answer_route(paths, request)

        server = HttpServer(handle, max_body=wire.MAX_BODY_BYTES, read_timeout_s=30)
        await server.listen_tcp("127.0.0.1", port)
        print(f"ready: loop {aio.loop_name()}", flush=True)
        await asyncio.Event().wait()

    aio.run(main())


# -- the client --------------------------------------------------------------------------------


async def one(session: aiohttp.ClientSession, url: str, kind: str, i: int) -> dict[str, Any]:
    body = {"model": "auto", "messages": [{"role": "user", "content": f"{kind} question {i}"}]}
    t0 = time.perf_counter()
    async with session.post(f"{url}/v1/chat/completions", json=body) as r:
        await r.read()
        wall = time.perf_counter() - t0
        if r.status != 200:
            raise SystemExit(f"bench: a {kind} chat answered {r.status}: {await r.text()}")
        return {
            "kind": kind,
            "wall_s": wall,
            "decision": r.headers.get("x-vsr-selected-decision"),
            "iterations": int(r.headers.get("x-vsr-looper-iterations") or 1),
            "models": r.headers.get("x-vsr-looper-models-used", ""),
        }


async def run_level(url: str, concurrency: int, n: int) -> list[dict[str, Any]]:
    """``n`` chats, looper and static alternating, ``concurrency`` at a time."""
    jobs = [(KINDS[i % 2], i) for i in range(n)]
    out: list[dict[str, Any]] = []
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as session:
        await asyncio.gather(*(one(session, url, k, -1 - i) for i, k in enumerate(KINDS * 2)))

        async def worker() -> None:
            while jobs:
                kind, i = jobs.pop(0)
                out.append(await one(session, url, kind, i))

        async with session.get(f"{url}{TIMINGS_PATH}") as r:
            await r.read()  # the warm-up chats' timings dropped
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        async with session.get(f"{url}{TIMINGS_PATH}") as r:
            router = json.loads(await r.read())
    # The router's samples (one per chat) are kept apart, told apart by their decision.
    return [*out, *({"router": True, **t} for t in router)]


def ms(values: list[float], q: float) -> float:
    """The q-quantile of seconds, in ms (bench/router_load.pct)."""
    return pct(values, q) if values else float("nan")


def report(level: int, n: int, think_ms: float, rows: list[dict[str, Any]]) -> None:
    client = [r for r in rows if "router" not in r]
    router = [r for r in rows if "router" in r]
    loops = [r for r in client if r["kind"] == "loop"]
    statics = [r for r in client if r["kind"] == "static"]
    wrong = [r for r in client if r["decision"] != r["kind"]]
    if wrong:
        raise SystemExit(f"bench: {len(wrong)} chats routed elsewhere, e.g. {wrong[0]}")
    iterations = sorted({r["iterations"] for r in loops})
    static_p50 = pct([r["wall_s"] for r in statics], 0.5) / 1000  # s
    e2e_added = [r["wall_s"] - r["iterations"] * static_p50 for r in loops]
    rl = [r for r in router if r["decision"] == "loop"]
    rs = [r for r in router if r["decision"] == "static"]
    own_loop = [r["handler_s"] - sum(r["calls_s"]) for r in rl]
    own_static = [r["handler_s"] - sum(r["calls_s"]) for r in rs]
    sum_calls = [sum(r["calls_s"]) for r in rl]
    per_call = [c for r in rl for c in r["calls_s"]]
    models = sorted({r["models"] for r in loops})
    print(
        f"c={level:<3} n={n} ({len(loops)} looper, {len(statics)} static chats); looper "
        f"iterations {iterations}, models used {models}; think time {think_ms:g} ms per call"
    )
    print(
        f"  in the router  looper chat: handler p50 {ms([r['handler_s'] for r in rl], 0.5):8.2f}"
        f" p99 {ms([r['handler_s'] for r in rl], 0.99):8.2f} | sum of its calls p50 "
        f"{ms(sum_calls, 0.5):8.2f} p99 {ms(sum_calls, 0.99):8.2f} | one call p50 "
        f"{ms(per_call, 0.5):7.2f} p99 {ms(per_call, 0.99):7.2f} ms"
    )
    print(
        f"  in the router  static chat: handler p50 {ms([r['handler_s'] for r in rs], 0.5):8.2f}"
        f" p99 {ms([r['handler_s'] for r in rs], 0.99):8.2f} | its call p50 "
        f"{ms([sum(r['calls_s']) for r in rs], 0.5):8.2f} ms"
    )
    print(
        f"  looper adds (handler - sum of its calls) p50 {ms(own_loop, 0.5):6.3f} p99 "
        f"{ms(own_loop, 0.99):6.3f} ms; a static chat's own (handler - its call) p50 "
        f"{ms(own_static, 0.5):6.3f} p99 {ms(own_static, 0.99):6.3f} ms"
    )
    print(
        f"  end to end: looper wall p50 {ms([r['wall_s'] for r in loops], 0.5):8.2f} p99 "
        f"{ms([r['wall_s'] for r in loops], 0.99):8.2f}; static wall p50 {static_p50 * 1000:8.2f}"
        f" p99 {ms([r['wall_s'] for r in statics], 0.99):8.2f}; looper - iterations x static "
        f"p50: p50 {ms(e2e_added, 0.5):+7.2f} p99 {ms(e2e_added, 0.99):+7.2f} ms"
    )


def run(args: argparse.Namespace, procs: Procs, tmp: Path) -> None:
    ports = {"big": free_port(), "small": free_port()}
    for name, port in ports.items():
        argv = [sys.executable, "-m", "tests.support.backends", "--port", str(port)]
        argv += ["--name", name, "--delay-ms", str(args.think_ms)]
        proc, log = procs.start(f"backend-{name}", argv)
        wait_http(f"http://127.0.0.1:{port}/v1/models", 30, proc, log)
    spec = tmp / "router.json"
    spec.write_text(json.dumps({"providers": providers(ports), "routing": routing()}))
    port = free_port()
    argv = [sys.executable, str(REPO / "bench" / "router_looper.py"), "--router-process", str(spec)]
    proc, log = procs.start("router", [*argv, "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/v1/models", 60, proc, log)
    for level, n in ((1, args.n1), (args.concurrency, args.nc)):
        rows = asyncio.run(run_level(url, level, n))
        report(level, n, args.think_ms, rows)


def main(argv: list[str] | None = None, header: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--think-ms", type=float, default=50.0, help="each backend's think time")
    parser.add_argument("--n1", type=int, default=100, help="chats at c=1 (half looper)")
    parser.add_argument("--nc", type=int, default=640, help="chats at c=N (half looper)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--router-process", metavar="SPEC", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.router_process:
        router_process(args.router_process, args.port)
        return
    for line in header or []:
        print(line, flush=True)
    print(
        f"target looper: think {args.think_ms:g} ms; chats c=1 {args.n1}, "
        f"c={args.concurrency} {args.nc} (half looper, half static, interleaved)",
        flush=True,
    )
    tmp = Path(tempfile.mkdtemp(prefix="vsr-bench-looper-"))
    procs = Procs(tmp)
    try:
        run(args, procs, tmp)
    finally:
        procs.stop_all()


if __name__ == "__main__":
    main()
