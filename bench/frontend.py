"""Frontend benchmark (`make bench-frontend`): requests through `vllm-sr serve`'s frontend
against the same requests sent straight to the worker's Unix socket, with d3-edge on CPU, for 1
and 2 replicas, concurrency 1/8/32/64, short (~13 tokens) and long (~106 tokens) one-row inputs.
Prints rows/s, p50, p99 and the frontend/straight ratios measured in this run, and the
frontend's added p50 at concurrency 1.

Targets (issue 4): added p50 <= 1 ms at concurrency 1; >= 0.9 of straight-to-worker throughput
at concurrency 64 with one replica.

The load generator is a minimal keep-alive HTTP/1.1 client on asyncio streams, so that the
client's own cost is small and the same on both paths.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import free_port, stand_in_serve_env  # noqa: E402

SHORT = "The quick brown fox jumps over the lazy dog by the river."
LONG = (
    "Semantic routing sends each request to the model best suited to answer it, using small "
    "encoder models to classify intent, detect sensitive content and pick a destination. "
    "Because every request passes through these classifiers, their latency and throughput "
    "bound the router's own, so the workers that run them are placed and scaled with care: "
    "one copy of the weights per worker, rows of concurrent requests sharing forwards, and a "
    "pool that sends each request to the worker with the fewest outstanding bytes of work, "
    "while timing out and ejecting replicas whose forwards hang."
)


@dataclass
class Target:
    name: str
    host: str | None = None
    port: int | None = None
    uds: str | None = None

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.uds is not None:
            return await asyncio.open_unix_connection(self.uds)
        assert self.host is not None and self.port is not None
        return await asyncio.open_connection(self.host, self.port)


def request_bytes(text: str, model: str) -> bytes:
    body = json.dumps({"model": model, "input": text}).encode()
    head = (
        f"POST /v1/embeddings HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


async def one_exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes
) -> int:
    writer.write(payload)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    await reader.readexactly(length)
    return status


@dataclass
class Cell:
    latencies: list[float] = field(default_factory=list)
    elapsed: float = 0.0
    errors: int = 0
    refused: int = 0

    def add(self, other: Cell) -> None:
        self.latencies += other.latencies
        self.elapsed += other.elapsed
        self.errors += other.errors
        self.refused += other.refused

    def summary(self) -> tuple[float, float, float, int, int]:
        """-> (rows/s, p50 ms, p99 ms, errors, refused with 429)."""
        if not self.latencies:
            return 0.0, float("nan"), float("nan"), self.errors, self.refused
        ordered = sorted(self.latencies)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        rate = len(ordered) / self.elapsed
        return rate, statistics.median(ordered) * 1e3, p99 * 1e3, self.errors, self.refused


SERIAL = [0]


def next_payload(text: str) -> bytes:
    # Every request's input is distinct (a serial number appended) on both paths, so the
    # one-worker frontend cache never answers and the comparison measures forwarding.
    SERIAL[0] += 1
    return request_bytes(f"{text} {SERIAL[0]}", "primary")


async def run_cell(targets: list[Target], text: str, concurrency: int, duration_s: float) -> Cell:
    """``concurrency`` closed loops spread over ``targets`` round robin for ``duration_s``."""
    cell = Cell()
    stop_at = time.perf_counter() + duration_s

    async def loop(i: int) -> None:
        reader, writer = await targets[i % len(targets)].connect()
        try:
            while time.perf_counter() < stop_at:
                payload = next_payload(text)
                t0 = time.perf_counter()
                status = await one_exchange(reader, writer, payload)
                if status == 200:
                    cell.latencies.append(time.perf_counter() - t0)
                elif status == 429:
                    cell.refused += 1
                    # A polite client honours Retry-After (1 s): the frontend admits 32 per
                    # worker and queues nothing, so at c=64 on one worker half the loops wait.
                    await asyncio.sleep(1.0)
                else:
                    cell.errors += 1
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(loop(i) for i in range(concurrency)))
    cell.elapsed = time.perf_counter() - start
    return cell


async def ab_cell(
    a: list[Target], b: list[Target], text: str, c: int, duration_s: float
) -> tuple[Cell, Cell]:
    """Straight and frontend measured in alternation so that a neighbour's load on this shared
    machine falls on both alike: one request each in turn at concurrency 1, else rounds."""
    ca, cb = Cell(), Cell()
    if c == 1:
        conns = [await a[0].connect(), await b[0].connect()]
        stop_at = time.perf_counter() + 2 * duration_s
        while time.perf_counter() < stop_at:
            for conn, cell in zip(conns, (ca, cb), strict=True):
                payload = next_payload(text)
                t0 = time.perf_counter()
                status = await one_exchange(*conn, payload)
                dt = time.perf_counter() - t0
                cell.elapsed += dt
                if status == 200:
                    cell.latencies.append(dt)
                else:
                    cell.errors += 1
        for _, writer in conns:
            writer.close()
        return ca, cb
    rounds = 4
    for _ in range(rounds):
        ca.add(await run_cell(a, text, c, duration_s / rounds))
        cb.add(await run_cell(b, text, c, duration_s / rounds))
    return ca, cb


def start_serve(
    replicas: int, workdir: Path, stand_in: bool = False
) -> tuple[subprocess.Popen[bytes], int, Path]:
    port = free_port()
    run = Path(tempfile.mkdtemp(prefix="vsr-bench-", dir="/tmp"))
    artifact = "stand-in/noop" if stand_in else "vllm-sr/d3-edge"
    argv = [sys.executable, "-m", "vllm_sr.cli", "serve", artifact, "-e"]
    argv += ["--platform", "cpu", "-dp", str(replicas), "--config", str(workdir / "config.yaml")]
    argv += ["--listen", f"127.0.0.1:{port}", "--runtime-dir", str(run)]
    argv += ["--control-socket", str(run / "control.sock")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if stand_in:
        # The tests' stand-in worker answers at once: what is left is the frontend's own cost.
        env.update(stand_in_serve_env())
    name = "stand-in" if stand_in else f"serve-{replicas}"
    log = open(workdir / f"{name}.log", "wb")  # noqa: SIM115 (kept for the process)
    proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env, cwd=REPO)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"serve exited {proc.returncode}; see {workdir}/serve-{replicas}.log")
        try:
            url = f"http://127.0.0.1:{port}/api/v1/inventory/model-runtime"
            with urllib.request.urlopen(url, timeout=2) as r:
                dep = json.load(r)["deployments"][0]
            if dep["ready_replicas"] == replicas:
                return proc, port, run
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    sys.exit("serve did not get ready in 600 s")


def stop_serve(proc: subprocess.Popen[bytes], run: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    shutil.rmtree(run, ignore_errors=True)


async def bench_layout(
    replicas: int, port: int, run: Path, concurrencies: list[int], duration_s: float
) -> list[dict[str, object]]:
    frontend = [Target("frontend", host="127.0.0.1", port=port)]
    workers = [
        Target(f"worker-{i}", uds=str(run / "workers" / f"primary-{i}.sock"))
        for i in range(replicas)
    ]
    rows: list[dict[str, object]] = []
    for label, text in (("short", SHORT), ("long", LONG)):
        await run_cell(workers, text, 4, 1.0)  # warm up
        for c in concurrencies:
            straight, via = await ab_cell(workers, frontend, text, c, duration_s)
            rows.append(
                {
                    "replicas": replicas,
                    "input": label,
                    "c": c,
                    "straight": straight.summary(),
                    "frontend": via.summary(),
                }
            )
            print_row(rows[-1])
    return rows


def print_row(r: dict[str, object]) -> None:
    s = r["straight"]
    f = r["frontend"]
    assert isinstance(s, tuple) and isinstance(f, tuple)
    ratio = f[0] / s[0] if s[0] else float("nan")
    print(
        f"| {r['replicas']} | {r['input']:5} | {r['c']:>2} | {s[0]:7.1f} | {s[1]:7.2f} | "
        f"{s[2]:7.2f} | {f[0]:7.1f} | {f[1]:7.2f} | {f[2]:7.2f} | {ratio:5.2f} | "
        f"{f[1] - s[1]:+6.2f} | {s[3] + f[3]} | {f[4]} |",
        flush=True,
    )


async def main_async(args: argparse.Namespace) -> None:
    print(
        "| replicas | input | c | straight rows/s | p50 ms | p99 ms | frontend rows/s | p50 ms |"
        " p99 ms | ratio | added p50 ms | errors | 429s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    workdir = Path(tempfile.mkdtemp(prefix="vsr-bench-cfg-"))
    all_rows: list[dict[str, object]] = []
    for replicas in args.replicas:
        proc, port, run = start_serve(replicas, workdir)
        try:
            all_rows += await bench_layout(replicas, port, run, args.concurrency, args.duration)
        finally:
            stop_serve(proc, run)
    proc, port, run = start_serve(1, workdir, stand_in=True)
    try:
        worker = [Target("stand-in", uds=str(run / "workers" / "primary-0.sock"))]
        frontend = [Target("frontend", host="127.0.0.1", port=port)]
        straight, via = await ab_cell(worker, frontend, SHORT, 1, args.duration)
        s_, f_ = straight.summary(), via.summary()
        print(
            f"frontend's own added p50 at c=1 against a worker that answers at once: "
            f"{f_[1] - s_[1]:+.3f} ms (straight {s_[1]:.3f} ms, via frontend {f_[1]:.3f} ms)"
        )
    finally:
        stop_serve(proc, run)
    for r in all_rows:
        s, f = r["straight"], r["frontend"]
        assert isinstance(s, tuple) and isinstance(f, tuple)
        if r["replicas"] == 1 and r["c"] == 1:
            print(f"added p50 at c=1, {r['input']}: {f[1] - s[1]:+.2f} ms (target <= 1 ms)")
        if r["replicas"] == 1 and r["c"] == 64:
            ratio = f[0] / s[0] if s[0] else float("nan")
            print(f"throughput ratio at c=64, 1 replica, {r['input']}: {ratio:.2f} (target >= 0.9)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, nargs="*", default=[1, 2])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--duration", type=float, default=4.0, help="seconds per cell")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
