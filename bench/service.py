"""Service benchmark (`make bench-service`): the real `vllm-sr serve -dp 2` (d3-edge on CPU)
against the raw 2-core ceiling, interleaved (ceiling, service, ceiling, ...) so both see the same
background load, at concurrency 1, 8, 32 and 64 with one-row requests of distinct short (~13
tokens) and long (~106 tokens) texts.

The ceiling is two bare 1-thread forward loops run at once (two processes, same model, each at
its best batch size, no HTTP). For each cell it prints rows/s, p50, p99, the ratio to the
ceiling, and where the CPU went (from /proc): the frontend process, and each worker's forward
thread and its other threads. It also prints c=1 p50 against a bare batch-of-one forward and
c=64 p99 against the median forward of a full batch (issue 16's targets).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from bench.worker import LONG, SHORT, thread_cpu  # noqa: E402

CONCURRENCY = (1, 8, 32, 64)
TARGETS = {"short": 0.85, "long": 0.95}
INPUTS = {"short": SHORT, "long": LONG}
REQUEST_NUMBERS = itertools.count(1)


# ---------------------------------------------------------------------- the ceiling loops
def ceiling_loop(cpu: int | None) -> None:
    """A child: load d3-edge with one thread, then answer commands on stdin, one JSON line each:
    {"texts": "short", "seconds": S} -> {"rows_s", "batch", "batch1_ms", "full_ms"}."""
    import torch

    from bench.worker import best_batch, forward_rate
    from vllm_sr.worker.artifacts import D3_EDGE, load, resolve

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    loaded = load(resolve(D3_EDGE), "cpu")
    batches: dict[str, int] = {}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        texts = INPUTS[cmd["texts"]]
        if cmd["texts"] not in batches:
            batches[cmd["texts"]] = best_batch(loaded, texts, 0.5)
        batch = batches[cmd["texts"]]
        rate = forward_rate(loaded, texts, batch, cmd["seconds"])
        print(
            json.dumps({"rows_s": rate, "batch": batch, **_forward_ms(loaded, texts)}), flush=True
        )


def _forward_ms(loaded: Any, texts: list[str]) -> dict[str, float]:
    one = loaded.tokenizer.encode([texts[0]])
    full = loaded.tokenizer.encode([texts[i % len(texts)] for i in range(64)])
    times: dict[str, list[float]] = {"batch1_ms": [], "full_ms": []}
    for _ in range(5):
        for key, rows in (("batch1_ms", one), ("full_ms", full)):
            t0 = time.perf_counter()
            loaded.runner.forward(rows)
            times[key].append((time.perf_counter() - t0) * 1000)
    return {k: statistics.median(v) for k, v in times.items()}


class Ceiling:
    """Two ceiling processes, kept loaded and idle between cells."""

    def __init__(self) -> None:
        argv = [sys.executable, str(Path(__file__).resolve()), "--ceiling-loop"]
        # Placed like the service's two workers: one CPU each, one OpenMP/MKL thread.
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        cpus = sorted(os.sched_getaffinity(0))
        self.procs = [
            subprocess.Popen(
                [*argv, "--cpu", str(cpus[i % len(cpus)])],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for i in range(2)
        ]
        for p in self.procs:
            assert p.stdout is not None
            json.loads(p.stdout.readline())

    def run(self, texts: str, seconds: float) -> dict[str, float]:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(json.dumps({"texts": texts, "seconds": seconds}) + "\n")
            p.stdin.flush()
        answers = [json.loads(p.stdout.readline()) for p in self.procs if p.stdout]
        return {
            "rows_s": sum(a["rows_s"] for a in answers),
            "batch1_ms": statistics.mean(a["batch1_ms"] for a in answers),
            "full_ms": statistics.mean(a["full_ms"] for a in answers),
        }

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


# ---------------------------------------------------------------------- the service
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_service(tmp: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    run = Path(tempfile.mkdtemp(prefix="vsr-bench-", dir="/tmp"))
    argv = [sys.executable, "-m", "vllm_sr.cli", "serve", "vllm-sr/d3-edge", "-e"]
    argv += ["--platform", "cpu", "-dp", "2", "--config", str(tmp / "config.yaml")]
    argv += ["--listen", f"127.0.0.1:{port}", "--runtime-dir", str(run)]
    argv += ["--control-socket", str(run / "c")]
    log = open(tmp / "serve.log", "wb")  # noqa: SIM115 (lives as long as the service)
    proc = subprocess.Popen(argv, stdout=log, stderr=log, cwd=REPO)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            url = f"http://127.0.0.1:{port}/api/v1/inventory/model-runtime"
            with urllib.request.urlopen(url, timeout=2) as r:
                if json.load(r)["deployments"][0]["ready_replicas"] == 2:
                    return proc, port
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("bench: the service did not get ready; see " + str(tmp / "serve.log"))


def worker_pids(port: int) -> list[int]:
    url = f"http://127.0.0.1:{port}/api/v1/inventory/model-runtime"
    with urllib.request.urlopen(url, timeout=5) as r:
        return [int(x["pid"]) for x in json.load(r)["deployments"][0]["replicas"]]


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def post(self, body: bytes) -> int:
        self.writer.write(
            b"POST /v1/embeddings HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        await self.reader.readexactly(length)
        return status


async def load(port: int, texts: list[str], concurrency: int, seconds: float) -> dict[str, float]:
    conns = [Conn(*await asyncio.open_connection("127.0.0.1", port)) for _ in range(concurrency)]
    latencies: list[float] = []
    stop_at = 0.0

    async def client(conn: Conn) -> None:
        while time.perf_counter() < stop_at:
            # Distinct across the whole run: a text sent in an earlier cell would be answered
            # from the workers' result caches (two replicas keep them).
            n = next(REQUEST_NUMBERS)
            body = json.dumps({"input": f"{texts[n % len(texts)]} #{n}"}).encode()
            t0 = time.perf_counter()
            if await conn.post(body) != 200:
                raise RuntimeError("the service answered an error")
            latencies.append(time.perf_counter() - t0)

    stop_at = time.perf_counter() + 0.5  # warm every connection
    await asyncio.gather(*(client(c) for c in conns))
    latencies.clear()
    start = time.perf_counter()
    stop_at = start + seconds
    await asyncio.gather(*(client(c) for c in conns))
    elapsed = time.perf_counter() - start
    for c in conns:
        c.writer.close()
    latencies.sort()
    return {
        "rows_s": len(latencies) / elapsed,
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
    }


def service_cell(proc: Any, port: int, texts: list[str], c: int, seconds: float) -> dict[str, Any]:
    pids = worker_pids(port)
    before = (proc_cpu(proc.pid), [thread_cpu(p) for p in pids])
    t0 = time.perf_counter()
    result: dict[str, Any] = asyncio.run(load(port, texts, c, seconds))
    wall = time.perf_counter() - t0
    after = (proc_cpu(proc.pid), [thread_cpu(p) for p in pids])
    result["cpu_frontend"] = (after[0] - before[0]) / wall
    result["cpu_workers"] = [
        {k: (a[k] - b[k]) / wall for k in ("forward", "rest")}
        for a, b in zip(after[1], before[1], strict=True)
    ]
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=6.0, help="window per cell")
    p.add_argument("--ceiling-loop", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cpu", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.ceiling_loop:
        ceiling_loop(args.cpu)
        return
    tmp = Path(tempfile.mkdtemp(prefix="vsr-bench-service-"))
    proc, port = start_service(tmp)
    ceiling = Ceiling()
    rows: list[dict[str, Any]] = []
    try:
        print(f"{'input':<6}{'c':>4}{'ceiling':>9}{'service':>9}{'ratio':>7}{'p50 ms':>9}"
              f"{'p99 ms':>9}   cpu: frontend | w0 fwd+rest | w1 fwd+rest", flush=True)  # fmt: skip
        for name, texts in INPUTS.items():
            for c in CONCURRENCY:
                ceil = ceiling.run(name, args.seconds / 2)
                cell = service_cell(proc, port, texts, c, args.seconds)
                cell.update(input=name, c=c, ceiling=ceil)
                rows.append(cell)
                w = " | ".join(f"{x['forward']:.2f}+{x['rest']:.2f}" for x in cell["cpu_workers"])
                print(
                    f"{name:<6}{c:>4}{ceil['rows_s']:>9.1f}{cell['rows_s']:>9.1f}"
                    f"{cell['rows_s'] / ceil['rows_s']:>7.2f}{cell['p50_ms']:>9.1f}"
                    f"{cell['p99_ms']:>9.1f}   {cell['cpu_frontend']:.2f} | {w}",
                    flush=True,
                )
    finally:
        ceiling.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    summary(rows)
    out = tmp / "service.json"
    out.write_text(json.dumps(rows, indent=2))
    print(f"raw figures: {out}")


def summary(rows: list[dict[str, Any]]) -> None:
    print()
    for name, target in TARGETS.items():
        top = next(r for r in rows if r["input"] == name and r["c"] == 64)
        one = next(r for r in rows if r["input"] == name and r["c"] == 1)
        ratio = top["rows_s"] / top["ceiling"]["rows_s"]
        p99_x = top["p99_ms"] / top["ceiling"]["full_ms"]
        added = one["p50_ms"] - one["ceiling"]["batch1_ms"]
        print(
            f"{name}: c64 ratio {ratio:.2f} (target >= {target}); c64 p99 {top['p99_ms']:.0f} ms "
            f"= {p99_x:.2f} x a full batch's forward ({top['ceiling']['full_ms']:.0f} ms, "
            f"target <= 1.3); c1 p50 {one['p50_ms']:.1f} ms = batch-of-one forward "
            f"{one['ceiling']['batch1_ms']:.1f} ms + {added:.1f} ms (target <= 2 ms)"
        )


if __name__ == "__main__":
    main()
