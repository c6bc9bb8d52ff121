"""Router benchmark: what routing adds to a chat, measured two ways in one run (the processes
in bench/router_procs.py, the measuring in bench/router_load.py).

- End to end: the same chat sent straight to an OpenAI-compatible stand-in backend
  (tests/support/backends.py, in its own process) and through the router (``model: auto``),
  interleaved so both see the same background load, at c=1 and c=32; printed as p50 / p99 of
  each, the added milliseconds and the routed/direct ratio. On a 2-core machine running the
  client, the router and the backend, HTTP and scheduling noise is of the order of the figure.
- In process: ``Router.route(RequestView.from_chat(body, headers))`` alone, per chat, over a
  few thousand chats in this process (no HTTP), with the time per deterministic family
  (upstream's eval metrics) to say where it goes.

Profiles (bench/router_profiles.py): ``keyword-only``; ``deterministic`` (keywords, context,
structure, conversation, language, metadata, authz, from upstream's own signal fragments, one
decision per family, identity headers on every chat); ``embedding+domain`` (one bundle per chat
to a d3-edge worker; with ``embedding+domain`` the c=1 line also has one bare d3-edge embeddings
request straight to the worker, interleaved, to read the second aim against).

``--target looper`` reports what a looper adds over the sum of its backend calls instead
(bench/router_looper.py): a confidence-looper decision (two internal calls) against a static
one, stand-in backends with a fixed think time, at c=1 and c=32; in the router (handler time
minus the sum of its internal calls' times) and end to end (looper wall time minus iterations x
a static chat's p50), p50/p99 with the raw figures (its options after ``--``, e.g.
``--target looper -- --think-ms 20``).

``--target cache`` reports the response cache's effect instead: bench/router_cache.py's p50 and
p99 of an exact hit and a semantic hit against misses, at c=1 and c=64 (its options after
``--``, e.g. ``--target cache -- --backend-delay-ms 50``).

Aims: keyword-only and deterministic add under 1 ms p50 (issues 15 and 24); embedding + domain
add no more than one d3-edge forward + 3 ms at c=1 (issue 15).

Targets:
  --target local       (default) a router process (bench/router.py --router-process: the
                       Router-mode handlers, ``ChatRouter.routes()``, on vllm_sr.httpserver as
                       the frontend mounts them) with no worker: the keyword-only and
                       deterministic profiles. A few minutes, most of it the
                       language detector's warm-up (once per process: 20 s to a minute).
  --target standalone  the same router process, its bundles posted straight to a d3-edge worker
                       process over its Unix socket (no pool): every profile.
  --target service     the real ``python -m vllm_sr.cli serve`` with ``providers:`` and
                       ``routing:`` in its config: every profile (pool, admission, metrics).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from bench.common import free_port  # noqa: E402
from bench.router_load import AIM_MS, in_process, measure, pct, print_in_process  # noqa: E402
from bench.router_procs import (  # noqa: E402
    Procs,
    router_process,
    start_router,
    start_service,
    wait_http,
    wait_unix_health,
)
from bench.router_profiles import PROFILES  # noqa: E402

Summary = list[tuple[str, dict[str, Any], dict[int, tuple[float, float]]]]  # name, in proc, e2e


# -- the machine ----------------------------------------------------------------------------

CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "fma", "sha_ni")


def machine(args: argparse.Namespace) -> list[str]:
    """The CPU and the settings the figures depend on."""
    return [
        *host(),
        f"target {args.target}; rounds {args.rounds}; requests per round c=1 {args.requests_c1}, "
        f"c={args.concurrency} {args.requests_cn}; in-process chats {args.in_process}",
    ]


def host() -> list[str]:
    """The CPU, its flags, the load and the Python the figures depend on."""
    model, flags = platform.processor() or "?", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    try:
        gov = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").read_text().strip()
    except OSError:
        gov = "n/a (no cpufreq: a VM?)"
    try:
        import importlib.metadata

        lingua = importlib.metadata.version("lingua-language-detector")
    except importlib.metadata.PackageNotFoundError:
        lingua = "not installed"
    from vllm_sr.aio import loop_name

    return [
        f"cpu: {model}; {os.cpu_count()} logical CPUs ({len(os.sched_getaffinity(0))} usable), "
        f"governor {gov}",
        f"cpu flags: {' '.join(f for f in CPU_FLAGS if f in flags) or '(none of interest)'}",
        f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
        "(the machine is shared: the end-to-end figures move with it)",
        f"python {platform.python_version()} ({platform.python_implementation()}), router loop "
        f"{loop_name()}, client loop asyncio, lingua-language-detector {lingua}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--target", choices=("local", "standalone", "service", "cache", "looper"), default="local"
    )
    parser.add_argument(
        "--profiles", default=None, help="comma-separated (default: all the target runs)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests-c1", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests-cn", type=int, default=640)
    parser.add_argument("--in-process", type=int, default=4000, help="chats routed in process")
    parser.add_argument("--router-process", metavar="SPEC", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--uds", help=argparse.SUPPRESS)
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.target == "cache":  # the response cache's own bench, its options passed on
        rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
        cache = [sys.executable, str(REPO / "bench" / "router_cache.py"), *rest]
        raise SystemExit(subprocess.run(cache, check=False).returncode)
    if args.target == "looper":  # bench/router_looper.py, its options passed on
        from bench import router_looper

        router_looper.main(args.rest[1:] if args.rest[:1] == ["--"] else args.rest, host())
        return
    if args.rest:
        parser.error(f"unrecognized arguments: {' '.join(args.rest)}")
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
    for line in machine(args):
        print(line, flush=True)
    has_worker = args.target != "local"
    names = args.profiles.split(",") if args.profiles else list(PROFILES)
    unknown = [n for n in names if n not in PROFILES]
    if unknown:
        raise SystemExit(f"bench: --profiles: {unknown} unknown; accepted: {', '.join(PROFILES)}")
    profiles = [PROFILES[n] for n in names]
    skipped = [p.name for p in profiles if p.needs_worker and not has_worker]
    if skipped:
        print(f"skipped (need a d3-edge worker: --target standalone or service): {skipped}")
    profiles = [p for p in profiles if has_worker or not p.needs_worker]
    backend_port = free_port()
    proc, log = procs.start(
        "backend", [sys.executable, "-m", "tests.support.backends", "--port", str(backend_port)]
    )
    backend = f"http://127.0.0.1:{backend_port}"
    wait_http(f"{backend}/v1/models", 30, proc, log)
    run_dir = Path(tempfile.mkdtemp(prefix="vsr-b-", dir="/tmp"))
    uds: Path | None = None
    if args.target == "standalone":
        uds = run_dir / "w.sock"
        argv = [sys.executable, "-m", "vllm_sr.cli", "worker", "vllm-sr/d3-edge", "--uds", str(uds)]
        wproc, wlog = procs.start("worker", argv)
        deadline = time.monotonic() + 300
        while not uds.exists() and time.monotonic() < deadline and wproc.poll() is None:
            time.sleep(0.1)
        wait_unix_health(uds, wproc, wlog)
    elif args.target == "service":
        uds = run_dir / "workers/primary-0.sock"
    counts = {1: args.requests_c1, args.concurrency: args.requests_cn}
    summary: Summary = []
    for profile in profiles:
        if args.target == "service":
            t0 = time.perf_counter()
            router = start_service(procs, profile.routing, backend_port, run_dir)
            said = (
                f"serve up in {time.perf_counter() - t0:.1f} s (serve does not warm the language "
                "detector: the first chats pay it)"
            )
        else:
            router, said = start_router(procs, profile.routing, backend_port, uds)
        router_pid = procs.procs[-1].pid  # service: frontend + supervisor (workers are children)
        print(f"{profile.name} ({args.target}): router {said}", flush=True)
        res = asyncio.run(in_process(profile, backend_port, uds, args.in_process))
        if res["warm_s"] is not None:
            print(f"  in process: language detector warm-up {res['warm_s']:.2f} s (before timing)")
        print_in_process(res)
        added, res["forward_p50"] = asyncio.run(
            measure(profile, backend, router, args.rounds, counts, uds, router_pid)
        )
        summary.append((profile.name, res, added))
        procs.stop(procs.procs[-1])
    print_summary(summary)


def meets(ms: float) -> str:
    return "meets" if ms < AIM_MS else "MISSES"


def print_summary(summary: Summary) -> None:
    print(
        f"summary: routing overhead per chat, ms (aims: p50 < {AIM_MS:g} ms; embedding+domain: "
        "one d3-edge forward + 3 ms at c=1)"
    )
    for name, res, added in summary:
        p50, p99 = pct(res["samples"], 0.5), pct(res["samples"], 0.99)
        e2e = " | ".join(
            f"end to end c={c} p50 {a50:+6.2f} p99 {a99:+6.2f}" for c, (a50, a99) in added.items()
        )
        c50 = pct(res["cpu"], 0.5)
        verdict = f"wall {meets(p50)}, CPU {meets(c50)} the aim"
        if res.get("forward_p50") is not None and 1 in added:
            # The second aim: the routed chat's extra at c=1 against one forward + 3 ms.
            budget = res["forward_p50"] + 3.0
            verdict = (
                f"end to end c=1 added p50 {added[1][0]:.2f} ms vs one forward + 3 = "
                f"{budget:.2f} ms: {'meets' if added[1][0] <= budget else 'MISSES'} the aim"
            )
        print(
            f"  {name:<17} in process wall p50 {p50:6.3f} p99 {p99:6.3f}, CPU p50 {c50:6.3f} "
            f"({verdict}) | {e2e}"
        )


if __name__ == "__main__":
    main()
