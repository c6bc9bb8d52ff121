"""Worker benchmark (`make bench-worker`): the raw in-process ceiling (same model, same thread
count, best batch size, no HTTP) against a real worker process over its Unix socket at
concurrency 1, 8, 32 and 64 with one-row requests, short (~13 tokens) and long (~100 tokens)
inputs. Prints rows/s, p50, p99 and the ratio to the ceiling, all measured in this one run,
plus where the time goes at the highest concurrency (the worker's Server-Timing)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from tests.support.workers import short_socket_dir, start_worker, stop_worker  # noqa: E402

ARTIFACT = "vllm-sr/d3-edge"
SHORT = [
    "How do I reset my password for the billing portal?",
    "What is the weather going to be like in Paris tomorrow?",
    "Can you recommend a good book about modern history?",
    "My package arrived damaged and I want a refund now.",
]
LONG_BASE = (
    "I ordered a laptop three weeks ago and it still has not arrived, even though the tracking "
    "page said it would be delivered last Tuesday. I contacted support twice, and both times "
    "they told me to wait another two business days. Now the tracking number shows no updates "
    "at all, and I am worried that the package was lost or stolen. Could you please check what "
    "happened, tell me whether a replacement can be shipped, and explain how I can get a full "
    "refund if it cannot be found"
)
LONG = [f"{LONG_BASE} (case {i})." for i in range(4)]
CONCURRENCY = (1, 8, 32, 64)
TARGETS = {"short": 0.85, "long": 0.9}
MIN_ROUNDS = 4
MAX_WINDOW_S = 60.0


def forward_rate(loaded: Any, texts: list[str], batch: int, seconds: float) -> float:
    rows = loaded.tokenizer.encode([texts[i % len(texts)] for i in range(batch)])
    loaded.runner.forward(rows)  # warm
    done = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or done < 3 * batch:
        loaded.runner.forward(rows)
        done += batch
    return done / (time.perf_counter() - start)


# Every size where the best may lie: on one CPU thread long rows go fastest at about 4 rows, short
# ones at 12-32 (bench/forward_sizes.py).
BATCH_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 64)


def best_batch(
    loaded: Any,
    texts: list[str],
    seconds: float,
    rounds: int = 1,
    sizes: tuple[int, ...] = BATCH_SIZES,
) -> int:
    """The batch size at which bare forwards (our runner, no HTTP, no queue) go fastest:
    each size runs ``seconds`` per round, the sizes taking turns, best mean rate wins (more
    rounds: a drift of the host falls on every size alike, not on one)."""
    scout: dict[int, float] = dict.fromkeys(sizes, 0.0)
    for _ in range(rounds):
        for b in sizes:
            scout[b] += forward_rate(loaded, texts, b, seconds)
    return max(scout, key=lambda b: scout[b])


class Conn:
    """A minimal keep-alive HTTP/1.1 client over the worker's Unix socket (the bench client
    must cost little CPU, since it shares the machine with the worker)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, uds: Path) -> Conn:
        reader, writer = await asyncio.open_unix_connection(str(uds))
        return cls(reader, writer)

    async def post(self, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        data = await self.reader.readexactly(int(headers["content-length"]))
        return status, headers, data

    def close(self) -> None:
        self.writer.close()


async def load_run(
    uds: Path, texts: list[str], concurrency: int, seconds: float
) -> dict[str, float]:
    bodies = [json.dumps({"input": t}).encode() for t in texts]
    conns = [await Conn.open(uds) for _ in range(concurrency)]
    latencies: list[float] = []
    timings: dict[str, list[float]] = {}
    stop_at = 0.0

    async def client(i: int, conn: Conn) -> None:
        n = i
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            status, headers, _ = await conn.post("/v1/embeddings", bodies[n % len(bodies)])
            latencies.append(time.perf_counter() - t0)
            if status != 200:
                raise RuntimeError(f"worker answered {status}")
            if n % 8 == 0:
                for part in headers.get("server-timing", "").split(","):
                    name, _, dur = part.strip().partition(";dur=")
                    timings.setdefault(name, []).append(float(dur))
            n += concurrency

    # Warm: one round on every connection. The measured window then spans at least
    # MIN_ROUNDS rounds, so that slow cells (long inputs at 64) are not one lucky batch.
    stop_at = time.perf_counter() + 0.5
    await asyncio.gather(*(client(i, c) for i, c in enumerate(conns)))
    window = min(MAX_WINDOW_S, max(seconds, MIN_ROUNDS * max(latencies)))
    latencies.clear()
    timings.clear()
    start = time.perf_counter()
    stop_at = start + window
    await asyncio.gather(*(client(i, c) for i, c in enumerate(conns)))
    elapsed = time.perf_counter() - start
    for c in conns:
        c.close()
    latencies.sort()
    result = {
        "window_s": window,
        "rows_s": len(latencies) / elapsed,
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
    }
    for name, values in timings.items():
        result[f"st_{name}"] = statistics.mean(values)
    return result


Cell = tuple[str, int, dict[str, float]]


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of the worker's forward thread and of all its other threads."""
    from vllm_sr.worker.engine import FORWARD_THREAD_NAME

    tick = os.sysconf("SC_CLK_TCK")
    out = {"forward": 0.0, "rest": 0.0}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / tick
        out["forward" if name == FORWARD_THREAD_NAME else "rest"] += cpu
    return out


def worker_run(handle: Any, texts: list[str], concurrency: int, seconds: float) -> dict[str, float]:
    """One load run, with the share of a core the worker's forward thread and its other
    threads (HTTP loop, tokenizer) got during it."""
    before = thread_cpu(handle.pid)
    started = time.perf_counter()
    result = asyncio.run(load_run(handle.uds, texts, concurrency, seconds))
    wall = time.perf_counter() - started
    after = thread_cpu(handle.pid)
    result["cpu_forward"] = (after["forward"] - before["forward"]) / wall
    result["cpu_rest"] = (after["rest"] - before["rest"]) / wall
    return result


def measure(
    threads: int,
    seconds: float,
    concurrency: tuple[int, ...] = CONCURRENCY,
    batch_sizes: tuple[int, ...] = BATCH_SIZES,
) -> tuple[dict[str, float], dict[str, int], list[Cell]]:
    """Each cell: the in-process ceiling at the best batch, measured right before the worker
    run (the worker idle meanwhile), so both see the same background load on a shared host."""
    import torch

    from vllm_sr.worker.artifacts import D3_EDGE, load, resolve

    torch.set_num_threads(threads)
    loaded = load(resolve(D3_EDGE), "cpu")
    inputs = {"short": SHORT, "long": LONG}
    sizes = {
        k: statistics.mean(len(r) for r in loaded.tokenizer.encode(v)) for k, v in inputs.items()
    }
    batches = {k: best_batch(loaded, v, seconds / 4, sizes=batch_sizes) for k, v in inputs.items()}
    handle = start_worker(
        ARTIFACT, short_socket_dir() / "bench.sock", extra_args=["--threads", str(threads)]
    )
    cells: list[Cell] = []
    try:
        for name, texts in inputs.items():
            for c in concurrency:
                ceiling = forward_rate(loaded, texts, batches[name], seconds / 2)
                result = worker_run(handle, texts, c, seconds)
                result["ceiling"] = ceiling
                cells.append((name, c, result))
    finally:
        stop_worker(handle)
    return sizes, batches, cells


def report(threads: int, seconds: float, measured: Any) -> None:
    from vllm_sr.worker import jsonio

    sizes, batches, cells = measured
    print(
        f"d3-edge worker on cpu, {threads} thread(s), {os.cpu_count()} CPUs, "
        f"{seconds:g} s per cell, JSON by {jsonio.BACKEND}, load average "
        f"{os.getloadavg()[0]:.1f}; ceiling = bare forwards at the best batch "
        f"(short ~{sizes['short']:.0f} tokens: {batches['short']}, "
        f"long ~{sizes['long']:.0f} tokens: {batches['long']})"
    )
    print()
    print(
        "| input | conc | ceiling rows/s | worker rows/s | ratio | p50 ms | p99 ms "
        "| queue ms | forward ms | other ms | fwd thread CPU | other threads CPU |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, c, r in cells:
        other = r.get("st_total", 0) - r.get("st_queue", 0) - r.get("st_forward", 0)
        print(
            f"| {name} | {c} | {r['ceiling']:.1f} | {r['rows_s']:.1f} | "
            f"{r['rows_s'] / r['ceiling']:.2f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
            f"{r.get('st_queue', 0):.1f} | {r.get('st_forward', 0):.1f} | {other:.2f} | "
            f"{r['cpu_forward']:.0%} | {r['cpu_rest']:.0%} |"
        )
    print()
    for name, target in TARGETS.items():
        r64 = next((r for n, c, r in cells if n == name and c == 64), None)
        if r64 is None:
            print(f"target {name} at 64: not measured (--concurrency)")
            continue
        ratio = r64["rows_s"] / r64["ceiling"]
        verdict = "met" if ratio >= target else "MISSED"
        print(f"target {name} at 64: >= {target} of the ceiling: {ratio:.2f} ({verdict})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=6.0, help="per worker measurement")
    parser.add_argument("--threads", type=int, default=None, help="worker threads (default)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    parser.add_argument(
        "--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES), help="the ceiling's"
    )
    args = parser.parse_args()
    from vllm_sr.worker.main import cpu_budget, default_threads

    threads = args.threads or default_threads(cpu_budget())
    cells = measure(threads, args.seconds, tuple(args.concurrency), tuple(args.batch_sizes))
    report(threads, args.seconds, cells)


if __name__ == "__main__":
    main()
