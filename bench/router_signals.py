"""Routing overhead with every signal family on: the router's own cost per chat when its
decisions reference every family vllm-sr evaluates (keywords, embeddings, domains, context,
structure, conversation, language, metadata, authz, complexity, reask, preference, jailbreak,
kb, user_feedback, fact_check, pii, projections), against the same router's concrete-model
path (no signals) and a keyword-only routing.

The router (our Router-mode handlers in our HTTP server) runs in its own process; the chat
backend is an instant stand-in (tests/support/backends.py) in another; the deployment's
exchange is an instant in-process stand-in that answers each bundle with fixed vectors (384
dimensions, cached per text), so what is measured is the router's work (signals, the bundle's
JSON both ways, scoring, decisions, the proxy), not a model's forward. Printed per variant:
chats/s and p50 / p95 / p99 latency at c=1 and c=64, and the p50 added over the concrete-model
path, each over ``--rounds`` rounds that alternate the paths.

Every family runs twice, in two router processes measured in the same run: with the CPU-bound
signals on the router's event loop (``signal_processes: 0``), and spread over
``--signal-procs`` signal processes (default: what ``signal_processes: auto`` starts here, half
the CPU budget; issue 36 item 7). The router process's own CPU per chat
(its event loop; the signal processes are other processes) is read from /proc around the
spread c=64 run. ``--handoff`` first measures, in this process, the loop's CPU per chat of the
CPU-bound step run here against handed to one signal process, by text size (where the
dispatch's threshold should be). The last line:

    router-scale: loop_cpu_ms=X ratio=R spread_chats_s=N1 loop_chats_s=N2 cpus=C

X: the spread router's CPU per every-family chat at c=64; R: every-family chats/s at c=64
spread / on the loop. The lines before it give R and X for each round alone (on a shared VM
they move by a fifth or more between rounds, which is the noise on X and R), and the router's
main thread's context switches per chat at c=64: waits (it slept for I/O, and woke again) and
preemptions (another process took its core, and its caches). On a host whose few cores the
loop shares with the signal processes, the backend and the load generator, X moves with these
as much as with the loop's own code.

    python bench/router_signals.py [--requests-c1 300] [--requests-c64 3000] [--leave-out F,..]
        [--signal-procs N] [--min-chars N] [--handoff] [--rounds 3]

``--leave-out language`` drops a family's fragment (the language detector's models take half a
minute to load in each process: the smoke test in tests/bench leaves it out). Leaving out the
model-backed families (embedding, domain, complexity, reask, preference, jailbreak, kb,
user-feedback, fact-check) leaves the spread loop no deployment answer to read: what is left is
HTTP, the hand-off, the decision and the proxy.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import pickle
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import aiohttp
import numpy
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from bench.common import free_port  # noqa: E402
from bench.router_load import pct, proc_cpu, proc_switches, run_load  # noqa: E402
from bench.router_procs import Procs, wait_http  # noqa: E402

FRAGMENTS = REPO / "tests" / "fixtures" / "upstream" / "fragments" / "signal"
DIMS = 384
FAMILY_FRAGMENTS = [
    "keyword/regex", "context/long-context", "structure/request-shape",
    "conversation/agentic-shape", "language/multilingual", "metadata/routing-hints",
    "authz/rbac", "complexity/escalation", "reask/dissatisfaction", "preference/power-user",
    "jailbreak/patterns", "kb/privacy", "user-feedback/escalation",
    "fact-check/needs-verification", "pii/strict", "domain/mmlu", "embedding/support",
]  # fmt: skip
CHATS = [
    [{"role": "user", "content": "please debug this function, it crashes"}],
    [
        {"role": "user", "content": "why does my build fail"},
        {"role": "assistant", "content": "check the logs"},
        {"role": "user", "content": "why does my build fail, that answer was wrong"},
    ],
    [{"role": "user", "content": "charge my card 4111 1111 1111 1111 for the order"}],
    [{"role": "user", "content": "solve this integral of x squared step by step"}],
]
HEADERS = {"x-authz-user-id": "bench", "x-authz-user-groups": "staff"}


def fragment_families() -> list[str]:
    """The families ``--leave-out`` accepts: each fragment's directory."""
    return [rel.split("/")[0] for rel in FAMILY_FRAGMENTS]


def every_family(leave_out: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Upstream's fragments of every family (but those left out), one decision per signal (all
    referenced), and a projection over them."""
    signals: dict[str, Any] = {}
    for rel in FAMILY_FRAGMENTS:
        if rel.split("/")[0] in leave_out:
            continue
        doc = yaml.safe_load((FRAGMENTS / f"{rel}.yaml").read_text())
        for family, items in doc["routing"]["signals"].items():
            signals.setdefault(family, []).extend(items)
    leaves: list[tuple[str, str]] = []
    kinds = {
        "keywords": "keyword", "embeddings": "embedding", "domains": "domain",
        "context": "context", "structure": "structure", "conversation": "conversation",
        "language": "language", "metadata": "metadata", "reasks": "reask",
        "preferences": "preference", "jailbreak": "jailbreak", "kb": "kb",
        "user_feedbacks": "user_feedback", "fact_check": "fact_check", "pii": "pii",
    }  # fmt: skip
    for family, items in signals.items():
        if family == "role_bindings":
            leaves += [("authz", b["role"]) for b in items]
        elif family == "complexity":
            leaves += [("complexity", f"{c['name']}:hard") for c in items]
        else:
            leaves += [(kinds[family], s["name"]) for s in items]
    projections = {
        "scores": [{"name": "risk", "method": "weighted_sum", "inputs": [
            {"type": "pii", "name": "restricted_pii", "weight": 1.0},
            {"type": "jailbreak", "name": "prompt_injection", "weight": 1.0},
            {"type": "complexity", "name": "needs_reasoning:hard", "weight": 0.5},
        ]}],
        "mappings": [{"name": "risk_band", "source": "risk", "method": "threshold_bands",
                      "outputs": [{"name": "risky", "gte": 1.0}, {"name": "calm", "lt": 1.0}]}],
    }  # fmt: skip
    leaves.append(("projection", "risky"))
    decisions = [
        {"name": f"d{i}", "priority": 1000 - i, "rules": {"type": kind, "name": name},
         "modelRefs": [{"model": "general"}]}
        for i, (kind, name) in enumerate(leaves)
    ]  # fmt: skip
    return {"signals": signals, "projections": projections, "decisions": decisions}


KEYWORDS_ONLY: dict[str, Any] = {
    "signals": {"keywords": [{"name": "code", "keywords": ["code", "debug", "function"]}]},
    "decisions": [
        {"name": "coding", "rules": {"type": "keyword", "name": "code"},
         "modelRefs": [{"model": "general"}]}
    ],
}  # fmt: skip


class InstantExchange:
    """A deployment that answers a bundle at once: fixed unit vectors per text. It stands for
    a worker in another process, so what it spends is not the router's: its answer to a bundle
    it has seen is kept (the router still builds every bundle and reads every answer)."""

    def __init__(self) -> None:
        self.cache: dict[str, str] = {}
        self.answers: dict[bytes, bytes] = {}

    def vector(self, text: str) -> str:
        got = self.cache.get(text)
        if got is None:
            rng = numpy.random.default_rng(zlib.crc32(text.encode()))
            v = rng.standard_normal(DIMS).astype(numpy.float32)
            got = self.cache[text] = base64.b64encode((v / numpy.linalg.norm(v)).tobytes()).decode()
        return got

    async def __call__(
        self, deployment: str, path: str, body: bytes, timeout_ms: float | None
    ) -> tuple[int, bytes]:
        got = self.answers.get(body)
        if got is not None:
            return 200, got
        results = []
        for task in json.loads(body)["tasks"]:
            data = [
                {"index": i, "embedding": self.vector(t)}
                for i, t in enumerate(task["embeddings"]["input"])
            ]
            results.append({"id": task["id"], "status": 200, "body": {"data": data}})
        answer = self.answers[body] = json.dumps({"results": results}).encode()
        return 200, answer


def router_process(
    variant: str,
    port: int,
    backend_port: int,
    leave_out: frozenset[str],
    signal_procs: int = 0,
    min_chars: int | None = None,
) -> None:
    from vllm_sr import heap
    from vllm_sr.config.routing import Routing
    from vllm_sr.config.routing_providers import Providers
    from vllm_sr.httpserver import HttpServer, Request, Response, StreamResponse, resolve
    from vllm_sr.router.backends import BackendSet
    from vllm_sr.router.chat import build_chat_router
    from vllm_sr.router.signal_dispatch import SignalDispatch
    from vllm_sr.supervisor.signal_procs import SignalProcesses

    async def main() -> None:
        endpoint = f"127.0.0.1:{backend_port}"
        providers = Providers.model_validate(
            {
                "defaults": {"default_model": "general"},
                "models": [{"name": "general", "backend_refs": [{"endpoint": endpoint}]}],
            }
        )
        doc = every_family(leave_out) if variant in ("all", "spread") else KEYWORDS_ONLY
        routing = Routing.model_validate(doc)
        backends = BackendSet(providers)
        await backends.start(health_checks=False)
        dispatch = None
        if variant == "spread":  # as serve's supervisor does, with its own count
            dispatch = SignalDispatch()
            dispatch.min_chars = dispatch.min_chars if min_chars is None else min_chars
            procs = SignalProcesses(signal_procs, dispatch, lambda name, **fields: None)
            procs.start(preload_language="language" not in leave_out)
            if not await procs.wait_ready(300):
                raise SystemExit(f"signal processes not ready: {procs.inventory()}")
        chat = build_chat_router(
            providers,
            routing,
            exchange=InstantExchange(),
            decision_deployment="primary",
            auto_model_names=["auto"],
            backends=backends,
            signal_dispatch=dispatch,
        )
        for router in [chat.router]:
            await router.warm()
        heap.settle()  # as the frontend does once a generation is warm (ChatMount._warm_up)
        routes = chat.routes()

        async def handle(request: Request) -> Response | StreamResponse:
            return await resolve(routes, request)(request)

        server = HttpServer(handle, max_body=1 << 22, read_timeout_s=30)
        await server.listen_tcp("127.0.0.1", port)
        print(f"router ({variant}) on {port}", flush=True)
        await asyncio.Event().wait()

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


def sender(session: aiohttp.ClientSession, url: str, model: str) -> Any:
    async def send(i: int) -> None:
        body = {"model": model, "messages": CHATS[i % len(CHATS)], "max_tokens": 16}
        async with session.post(f"{url}/v1/chat/completions", json=body, headers=HEADERS) as r:
            await r.read()
            if r.status != 200:
                raise SystemExit(f"bench: {url} answered {r.status}: {await r.text()}")

    return send


Rows = dict[tuple[int, str], dict[str, float]]  # (concurrency, path) -> figures
PerRound = dict[tuple[int, str], list[tuple[float, float]]]  # -> each round's (chats/s, CPU ms)
Switches = dict[tuple[int, str], tuple[float, float]]  # -> the loop's (waits, preemptions)/chat


async def measure(
    urls: dict[str, str], counts: dict[int, int], pids: dict[str, int], rounds: int
) -> tuple[Rows, PerRound, Switches]:
    """Each path at each concurrency, in ``rounds`` alternating rounds (so a machine's drift
    reaches every path alike): chats/s, p50/p95/p99 over all rounds, the p50 added over the
    concrete-model path, and the router process's CPU per chat; and each round's chats/s and
    CPU per chat (how far the machine moved during the run); and the router's main thread's
    context switches per chat (it waited; it was preempted)."""
    out: Rows = {}
    per_round: PerRound = {}
    switches: Switches = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        kw = urls["keywords"]
        paths = {
            "concrete model (no signals)": ("keywords", sender(session, kw, "general")),
            "keywords only": ("keywords", sender(session, kw, "auto")),
            "every family, on the loop": ("all", sender(session, urls["all"], "auto")),
            "every family, spread": ("spread", sender(session, urls["spread"], "auto")),
        }
        for _, send in paths.values():
            await run_load(send, 4, 40)  # warm every path
        for conc, total in counts.items():
            chats = max(1, total // rounds)
            lats: dict[str, list[float]] = {name: [] for name in paths}
            secs = dict.fromkeys(paths, 0.0)
            cpu = dict.fromkeys(paths, 0.0)
            switched = {name: [0, 0] for name in paths}
            for _ in range(rounds):
                for name, (variant, send) in paths.items():
                    cpu0, sw0 = proc_cpu(pids[variant]), proc_switches(pids[variant])
                    t0 = time.perf_counter()
                    lats[name] += await run_load(send, conc, chats)
                    took = time.perf_counter() - t0
                    cpu1, sw1 = proc_cpu(pids[variant]), proc_switches(pids[variant])
                    used = (cpu1 - cpu0) if cpu0 is not None and cpu1 else 0.0
                    secs[name] += took
                    cpu[name] += used
                    if sw0 is not None and sw1 is not None:
                        switched[name][0] += sw1[0] - sw0[0]
                        switched[name][1] += sw1[1] - sw0[1]
                    per_round.setdefault((conc, name), []).append(
                        (chats / took, used * 1000.0 / chats)
                    )
            base = 0.0
            for name, lat in lats.items():
                rate = len(lat) / secs[name]
                cpu_ms = cpu[name] * 1000.0 / len(lat)
                p50, p95, p99 = pct(lat, 0.5), pct(lat, 0.95), pct(lat, 0.99)
                base = p50 if name.startswith("concrete") else base
                out[(conc, name)] = {"rate": rate, "p50": p50, "p95": p95, "p99": p99,
                                     "added": p50 - base, "cpu_ms": cpu_ms}  # fmt: skip
                switches[(conc, name)] = (
                    switched[name][0] / len(lat),
                    switched[name][1] / len(lat),
                )
                print(
                    f"  c={conc:<3} {name:<28} {rate:8.0f} chats/s | p50 {p50:7.2f} ms "
                    f"p95 {p95:7.2f} ms p99 {p99:7.2f} ms | added p50 {p50 - base:+6.2f} ms | "
                    f"router CPU {cpu_ms:5.2f} ms/chat",
                    flush=True,
                )
    return out, per_round, switches


def summary(rows: Rows, per_round: PerRound, switches: Switches) -> None:
    loop, spread = "every family, on the loop", "every family, spread"
    for name in (loop, spread):
        row = rows[(64, name)]
        print(
            f"  c=64 {name}: p95 {row['p95']:.1f} ms, p99 {row['p99']:.1f} ms "
            f"(upstream's gate: p95 <= 100 ms, p99 <= 150 ms)"
        )
    a, b = rows[(1, loop)]["added"], rows[(1, spread)]["added"]
    print(
        f"  c=1 added p50: {a:.2f} ms on the loop, {b:.2f} ms spread "
        f"({(b - a) / a * 100.0 if a > 0 else 0.0:+.0f}%; the goal: at most +10%)"
    )
    pairs = zip(per_round[(64, spread)], per_round[(64, loop)], strict=True)
    print(
        "  c=64 by round (the paths alternate): ratio "
        + " ".join(f"{s[0] / n[0]:.2f}" for s, n in pairs)
        + ", spread router CPU ms/chat "
        + " ".join(f"{c:.2f}" for _, c in per_round[(64, spread)])
    )
    print(
        "  c=64 router loop context switches per chat (waits / preemptions): "
        + ", ".join(f"{name} {switches[(64, name)][0]:.2f} / {switches[(64, name)][1]:.2f}"
                    for name in (loop, spread))
    )  # fmt: skip
    x = rows[(64, spread)]["cpu_ms"]
    n1, n2 = rows[(64, spread)]["rate"], rows[(64, loop)]["rate"]
    print(
        f"router-scale: loop_cpu_ms={x:.2f} ratio={n1 / n2:.2f} spread_chats_s={n1:.0f} "
        f"loop_chats_s={n2:.0f} cpus={os.cpu_count()}"
    )


async def handoff(chats: int, leave_out: frozenset[str]) -> None:
    """This process's CPU per chat for the CPU-bound step run here, against handed to one
    signal process (the pickling, the socket, the wake-ups), by text size: with every family
    referenced, and with keywords only (the cheapest step)."""
    from vllm_sr.config.routing import Routing
    from vllm_sr.router.cpu_signals import CpuSignals, CpuSignalSpec, ViewFields, cpu_report
    from vllm_sr.router.questions import declared_keys
    from vllm_sr.router.request_view import RequestView
    from vllm_sr.router.signal_dispatch import SignalDispatch, SignalJob, Spec
    from vllm_sr.supervisor.signal_procs import SignalProcesses

    dispatch = SignalDispatch()
    procs = SignalProcesses(1, dispatch, lambda name, **fields: None)
    procs.start(preload_language="language" not in leave_out)
    sentence = "Could you please check this order for card 4111 1111 1111 1111 again? "
    try:
        if not await procs.wait_ready(300):
            raise SystemExit(f"signal process not ready: {procs.inventory()}")
        print("  hand-off: this process's CPU per chat (us): the step here / handed off")
        print("    config         chars   on the loop   handed off   (wall handed off)")
        for spec_id, (label, doc) in enumerate(
            (("every family", every_family(leave_out)), ("keywords only", KEYWORDS_ONLY)), 1
        ):
            routing = Routing.model_validate(doc)
            referenced = frozenset(declared_keys(routing))  # every one: all are used
            spec = CpuSignalSpec(routing.signals, referenced)
            local = CpuSignals.from_spec(spec)
            specs = (Spec("config", spec_id, pickle.dumps(spec)),)
            for size in (16, 64, 256, 1024, 4096, 16384):
                text = (sentence * (size // len(sentence) + 1))[:size]
                msg = {"messages": [{"role": "user", "content": text}]}
                view = RequestView.from_chat(msg, {})
                job = SignalJob(spec_id, ViewFields.of(view), specs=specs)
                for _ in range(3):
                    cpu_report(local, view)
                    await dispatch.run(job)
                t0 = time.process_time()
                for _ in range(chats):
                    cpu_report(local, view)
                here = (time.process_time() - t0) * 1e6 / chats
                t0, w0 = time.process_time(), time.perf_counter()
                for _ in range(chats):
                    await dispatch.run(job)
                there = (time.process_time() - t0) * 1e6 / chats
                wall = (time.perf_counter() - w0) * 1e6 / chats
                print(f"    {label:<13} {size:6d}   {here:11.0f}   {there:10.0f}   ({wall:.0f})")
    finally:
        await procs.stop()


async def per_family(chats: int, leave_out: frozenset[str]) -> None:
    """In this process: the mean milliseconds per chat of each family's step (the
    model-backed families share their deployment's one bundle, so they show its time)."""
    from vllm_sr.config.routing import Routing
    from vllm_sr.config.routing_providers import Providers
    from vllm_sr.router.backends import BackendSet
    from vllm_sr.router.request_view import RequestView
    from vllm_sr.router.route import Router

    providers = Providers.model_validate(
        {"defaults": {"default_model": "general"},
         "models": [{"name": "general", "backend_refs": [{"endpoint": "127.0.0.1:9"}]}]}
    )  # fmt: skip
    router = Router(
        providers,
        Routing.model_validate(every_family(leave_out)),
        exchange=InstantExchange(),
        backends=BackendSet(providers),
        decision_deployment="primary",
    )
    await router.warm()
    views = [RequestView.from_chat({"messages": c}, HEADERS) for c in CHATS]
    for view in views:
        await router.signals(view, router.plan)
    totals: dict[str, float] = {}
    t0 = time.perf_counter()
    for i in range(chats):
        run = await router.signals(views[i % len(views)], router.plan)
        for kind, ms in run.timings_ms.items():
            totals[kind] = totals.get(kind, 0.0) + ms
    whole = (time.perf_counter() - t0) * 1000.0 / chats
    steps: dict[float, list[str]] = {}
    for kind, ms in totals.items():
        steps.setdefault(round(ms / chats, 3), []).append(kind)
    print(f"  signals per chat, in process: {whole:.2f} ms; by step:")
    for ms, kinds in sorted(steps.items(), reverse=True):
        print(f"    {ms:7.3f} ms  {', '.join(sorted(kinds))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests-c1", type=int, default=300)
    parser.add_argument("--requests-c64", type=int, default=3000)
    parser.add_argument(
        "--leave-out", default="", help=f"comma list of {', '.join(fragment_families())}"
    )
    parser.add_argument(
        "--signal-procs", type=int, help="signal processes (spread; default: serve's auto count)"
    )
    parser.add_argument(
        "--min-chars", type=int, help="the dispatch's threshold (default: the router's own)"
    )
    parser.add_argument("--handoff", action="store_true", help="measure the hand-off first")
    parser.add_argument("--handoff-chats", type=int, default=20, help="chats per hand-off row")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per path")
    parser.add_argument(
        "--router-process", choices=("all", "keywords", "spread"), help=argparse.SUPPRESS
    )
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--backend-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    leave_out = frozenset(f for f in args.leave_out.split(",") if f)
    if args.signal_procs is None:
        from vllm_sr.supervisor.service import signal_process_count

        args.signal_procs = signal_process_count("auto")
    unknown = sorted(leave_out - set(fragment_families()))
    if unknown:
        parser.error(f"--leave-out: {unknown} unknown; accepted: {', '.join(fragment_families())}")
    if args.router_process:
        router_process(
            args.router_process,
            args.port,
            args.backend_port,
            leave_out,
            args.signal_procs,
            args.min_chars,
        )
        return
    if args.handoff:
        asyncio.run(handoff(args.handoff_chats, leave_out))
    with tempfile.TemporaryDirectory(prefix="vsr-bench-signals-") as tmp:
        procs = Procs(Path(tmp))
        try:
            backend_port = free_port()
            bproc, blog = procs.start(
                "backend",
                [sys.executable, "-m", "tests.support.backends", "--port", str(backend_port)],
            )
            wait_http(f"http://127.0.0.1:{backend_port}/v1/models", 60, bproc, blog)
            urls, pids = {}, {}
            for variant in ("keywords", "all", "spread"):
                port = free_port()
                argv = [
                    sys.executable,
                    __file__,
                    "--router-process",
                    variant,
                    "--port",
                    str(port),
                    "--backend-port",
                    str(backend_port),
                    "--leave-out",
                    args.leave_out,
                    "--signal-procs",
                    str(args.signal_procs),
                ]
                if args.min_chars is not None:
                    argv += ["--min-chars", str(args.min_chars)]
                rproc, rlog = procs.start(f"router-{variant}", argv)
                wait_http(f"http://127.0.0.1:{port}/v1/models", 300, rproc, rlog)
                urls[variant] = f"http://127.0.0.1:{port}"
                pids[variant] = rproc.pid
            print(
                f"router signals bench ({os.cpu_count()} CPUs; instant backend and exchange; "
                f"{args.signal_procs} signal processes, threshold "
                f"{'the default' if args.min_chars is None else args.min_chars} chars"
                + (f"; left out: {', '.join(sorted(leave_out))})" if leave_out else ")")
            )
            counts = {1: args.requests_c1, 64: args.requests_c64}
            rows, per_round, switches = asyncio.run(measure(urls, counts, pids, args.rounds))
            asyncio.run(per_family(args.requests_c1, leave_out))
            summary(rows, per_round, switches)
        finally:
            procs.stop_all()


if __name__ == "__main__":
    main()
