"""Adaptive CPU threads, measured in one run (`make bench-threads`).

Real d3-edge workers over their Unix sockets, N one-row requests in flight, short (~13
tokens) and long (~106 tokens) inputs. Rows are served rows/s and client-side p99:

- off at the default count (half the CPUs) and off at every other allowed count (fixed);
- mode 1 from a fresh start (the cost of learning: exploration runs inside the window);
- mode 2 after learning (warm traffic until its report leaves "exploring"), then measured.

With --strict the whole set runs again with MKL_CBWR=AVX2,STRICT in the workers' environment
(MKL's reproducible mode, under which this x86 host's counts were bit-identical).

``--stand-in`` runs the stand-in worker (no model, no adaptive report: the smoke test's mode),
``--counts`` only some thread counts and ``--settle-s`` a shorter settling time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import stand_in_argv  # noqa: E402

ARTIFACT = "vllm-sr/d3-edge"
SHORT = "route this short request to the right small model"  # ~13 tokens
LONG = " ".join(["the router sends each long request to a small encoder on a shared host"] * 7)


@dataclass
class Result:
    label: str
    kind: str
    rows_s: float
    p50_ms: float
    p99_ms: float
    report: dict[str, Any] | None


def spawn(
    uds: Path, threads: int, env: dict[str, str], stand_in: bool = False
) -> subprocess.Popen[bytes]:
    full = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **env}
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), full.get("PYTHONPATH")) if p)
    worker = stand_in_argv() if stand_in else [sys.executable, "-m", "vllm_sr.cli", "worker"]
    argv = [*worker, ARTIFACT, "--uds", str(uds)]
    log = open(uds.with_suffix(".log"), "wb")  # noqa: SIM115 - the child keeps it
    return subprocess.Popen(
        [*argv, "--threads", str(threads)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=full,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


async def wait_ready(s: aiohttp.ClientSession, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited {proc.returncode}")
        try:
            async with s.get("http://w/health") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise TimeoutError("worker not ready")


async def load(s: aiohttp.ClientSession, text: str, seconds: float, inflight: int) -> list[float]:
    """``inflight`` closed-loop clients for ``seconds``; returns each request's latency."""
    lat: list[float] = []
    end = time.monotonic() + seconds

    async def client() -> None:
        while time.monotonic() < end:
            t = time.monotonic()
            async with s.post("http://w/v1/embeddings", json={"input": text}) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{r.status}: {await r.text()}")
            lat.append(time.monotonic() - t)

    await asyncio.gather(*(client() for _ in range(inflight)))
    return lat


def pct(sorted_lat: list[float], q: float) -> float:
    return sorted_lat[min(len(sorted_lat) - 1, int(q * len(sorted_lat)))] * 1000


async def report(s: aiohttp.ClientSession) -> dict[str, Any] | None:
    """The worker's adaptive-threads report (None: off, or a worker without /v1/models)."""
    async with s.get("http://w/v1/models") as r:
        if r.status != 200:
            return None
        doc = await r.json()
    value: dict[str, Any] | None = doc["data"][0].get("adaptive_threads")
    return value


async def measure(
    label: str, threads: int, env: dict[str, str], args: argparse.Namespace, learn_first: bool
) -> list[Result]:
    uds = Path(tempfile.mkdtemp(prefix="vsrb-", dir="/tmp")) / "w.sock"
    proc = spawn(uds, threads, env, args.stand_in)
    out: list[Result] = []
    try:
        conn = aiohttp.UnixConnector(path=str(uds), limit=0)
        async with aiohttp.ClientSession(connector=conn) as s:
            await wait_ready(s, proc)
            if learn_first:
                await learn(s, args)
            # Long requests wait seconds in the queue: a longer window and settling time.
            settle = args.settle_s
            runs = (
                ("short", SHORT, args.seconds, settle),
                ("long", LONG, 2 * args.seconds, 3 * settle),
            )
            for kind, text, secs, settle in runs:
                await load(s, text, settle, args.inflight)  # fills the queue, not measured
                start = time.monotonic()
                lat = sorted(await load(s, text, secs, args.inflight))
                took = time.monotonic() - start
                p50, p99 = pct(lat, 0.5), pct(lat, 0.99)
                out.append(Result(label, kind, len(lat) / took, p50, p99, await report(s)))
    finally:
        stop(proc)
    return out


async def learn(s: aiohttp.ClientSession, args: argparse.Namespace) -> None:
    """Warm traffic, short and long in turn, until the report leaves 'exploring'."""
    deadline = time.monotonic() + args.learn_s
    while time.monotonic() < deadline:
        for text in (SHORT, LONG):
            await load(s, text, min(3.0, args.learn_s), args.inflight)
        rep = await report(s)
        if rep is None or rep["state"] != "exploring":
            return


def describe(rep: dict[str, Any] | None) -> str:
    if rep is None:
        return ""
    served = {b["bucket"]: b["serving"] for b in rep["buckets"]}
    text = f"{rep['state']}, {rep['shadow_passes']} shadow passes, serving {served}"
    if rep["retire_reason"]:
        text += f"; retired: {rep['retire_reason'][:90]}"
    elif rep["recommendation"]:
        text += f"; {rep['recommendation']}"
    return text


async def run_set(args: argparse.Namespace, env: dict[str, str], tag: str) -> list[Result]:
    budget = len(os.sched_getaffinity(0))
    default = min(16, max(1, budget // 2))
    counts = args.counts or sorted({default, *(2**i for i in range(8) if 2**i <= budget)})
    results: list[Result] = []
    for n in counts:
        name = f"{tag}off, {n} threads" + (" (default)" if n == default else "")
        results += await measure(name, n, env, args, learn_first=False)
    # Mode 2 serves learned counts only where a host record vouches for them: the mode-1 run
    # writes it (when it learns without a drift) into a directory of this run's own.
    records = tempfile.mkdtemp(prefix="vsr-threads-records-")
    env = {**env, "VLLM_SR_THREADS_RECORD_DIR": records}
    mode1 = {**env, "VLLM_SRUN_CPU_ADAPTIVE_THREADS": "1"}
    results += await measure(f"{tag}mode 1, fresh", default, mode1, args, learn_first=False)
    mode2 = {**env, "VLLM_SRUN_CPU_ADAPTIVE_THREADS": "2"}
    results += await measure(f"{tag}mode 2, learned", default, mode2, args, learn_first=True)
    return results


def table(results: list[Result]) -> str:
    lines = [f"{'configuration':<36} {'input':<6} {'rows/s':>8} {'p50 ms':>8} {'p99 ms':>8}"]
    base = {r.kind: r.rows_s for r in results if r.label.endswith("(default)")}
    for r in results:
        ratio = r.rows_s / base[r.kind] if base.get(r.kind) else float("nan")
        lines.append(
            f"{r.label:<36} {r.kind:<6} {r.rows_s:8.1f} {r.p50_ms:8.0f} {r.p99_ms:8.0f}"
            f"  x{ratio:.2f} of default"
        )
    notes = [f"  {r.label}: {describe(r.report)}" for r in results if r.kind == "long" and r.report]
    return "\n".join([*lines, "", *notes])


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=6.0, help="measured seconds (long: 2x)")
    ap.add_argument("--inflight", type=int, default=64, help="one-row requests in flight")
    ap.add_argument("--learn-s", type=float, default=90.0, help="mode 2's longest warm-up")
    ap.add_argument("--strict", action="store_true", help="also run with MKL_CBWR=AVX2,STRICT")
    ap.add_argument("--stand-in", action="store_true", help="the stand-in worker, no model")
    ap.add_argument(
        "--counts", type=int, nargs="+", help="fixed thread counts to run (default: each allowed)"
    )
    ap.add_argument("--settle-s", type=float, default=1.0, help="unmeasured load first (long: 3x)")
    args = ap.parse_args()
    results = await run_set(args, {}, "")
    print(table(results), flush=True)
    if args.strict:
        strict = await run_set(args, {"MKL_CBWR": "AVX2,STRICT"}, "strict ")
        print("\nMKL_CBWR=AVX2,STRICT\n" + table(strict))


if __name__ == "__main__":
    asyncio.run(main())
