"""Service benchmark (`make bench-service`): the real `vllm-sr serve -dp 2` (d3-edge on CPU,
engine_args.dtype at its default, auto) against the raw 2-core ceiling at the precision the
service resolved, interleaved (each cell's ceiling is the mean of the one measured
just before and the one just after its service window) so both see the same background load,
at concurrency 1, 8, 32 and 64 with one-row requests of distinct short (~17 tokens) and long
(~108 tokens) texts.

The ceiling is two bare 1-thread forward loops run at once (bench/ceiling.py: two processes,
same model, each at its best batch size, no HTTP, under autocast at the served dtype as a
worker runs it). It first prints the CPU model, its bf16 flags and what torch reports, and the
dtype the service resolved. When that is not float32 (a host with native bf16), the c=64 cells
also measure the float32 ceiling and a second service forced to float32 (`--dtype float32`),
so that the summary gives both ceilings, both services and their ratios; on a host without
native bf16 it says so and the float32 targets stand. For each cell it prints rows/s, p50,
p99, the ratio to the ceiling, and where the CPU went (from /proc): this process (the load
generator, on the same cores), the frontend process, and each worker's forward thread and its
other threads. It also prints c=1 p50 against a bare batch-of-one forward (back to back, the
target's basis; and with the two loops taking turns, as c=1 requests take turns between the
workers) and c=64 p99
against the median forward of a full batch (issue 16's targets). At c=1 it also reads each
answer's Server-Timing (the worker's marks, passed on by the frontend) and splits the p50:
outside the worker's handler, tokenizing, the forward, the rest of the handler.

A mixed cell (short and long texts alternating, c = 32 and 64) measures padding: padded tokens
per row in the workers' forwards (from their /metrics) against the real tokens per row sent;
its ceiling is the padding-free one, short and long rows forwarded apart at their best batch
sizes (1 / (0.5 / short ceiling + 0.5 / long ceiling)).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
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

from bench.ceiling import FIRST_NUMBER, INPUTS, Ceiling, average  # noqa: E402
from bench.worker import LONG, SHORT, thread_cpu  # noqa: E402
from vllm_sr import aio  # noqa: E402

CONCURRENCY = (1, 8, 32, 64)
MIXED_CONCURRENCY = (32, 64)
TARGETS = {"short": 0.85, "long": 0.95}  # c=64 rows/s against the float32 ceiling's
# On a host with native bf16 (issue 26): served at auto against the bf16 ceiling, and long c=64
# served at auto against the float32 service.
BF16_TARGETS = {"short": 0.75, "long": 0.9}
LONG_OVER_FLOAT32 = 1.8
P99_TARGET = 1.3  # c=64 p99 against a full batch's median forward
C1_TARGET_MS = 2.0  # c=1 p50 over a bare batch-of-one forward (back to back)
MIXED = [text for pair in zip(SHORT, LONG, strict=True) for text in pair]
REQUEST_NUMBERS = itertools.count(FIRST_NUMBER)
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16")


def host_lines() -> list[str]:
    """The CPU model, the flags that decide bf16, and what torch reports (the worker's own
    resolution of auto, vllm_sr/worker/precision.py)."""
    from vllm_sr.worker import precision

    flags: set[str] = set()
    for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    facts = precision.facts_for("cpu")
    have = " ".join(f if f in flags else f"-{f}" for f in CPU_FLAGS)
    return [
        f"host: {precision.cpu_model_name() or 'unknown CPU'}, {os.cpu_count()} CPUs; "
        f"flags: {have}",
        f"torch: {facts.detail}; native bf16: {'yes' if facts.bf16_native else 'no'}",
    ]


# ---------------------------------------------------------------------- the service
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_service(
    tmp: Path, run: Path, dtype: str | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """``vllm-sr serve -dp 2`` with its sockets under ``run`` (a short path: Unix socket paths
    are limited to 107 bytes); its config and log go to ``tmp``. ``dtype`` None: auto."""
    port = free_port()
    argv = [sys.executable, "-m", "vllm_sr.cli", "serve", "vllm-sr/d3-edge", "-e"]
    argv += ["--platform", "cpu", "-dp", "2", "--config", str(tmp / "config.yaml")]
    argv += ["--listen", f"127.0.0.1:{port}", "--runtime-dir", str(run)]
    argv += ["--control-socket", str(run / "c")]
    if dtype is not None:
        argv += ["--dtype", dtype]
    tmp.mkdir(parents=True, exist_ok=True)
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


def replicas(port: int) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/inventory/model-runtime"
    with urllib.request.urlopen(url, timeout=5) as r:
        found: list[dict[str, Any]] = json.load(r)["deployments"][0]["replicas"]
    return found


def worker_pids(port: int) -> list[int]:
    return [int(x["pid"]) for x in replicas(port)]


def served_dtype(port: int) -> str:
    """The dtype the service's workers resolved (they must agree, or one would not serve)."""
    dtypes = {str(x["dtype"]) for x in replicas(port)}
    if len(dtypes) != 1:
        raise SystemExit(f"bench: the workers resolved different dtypes: {sorted(dtypes)}")
    return dtypes.pop()


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


REQUEST_HEAD = (
    b"POST /v1/embeddings HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n"
)


class Conn(asyncio.Protocol):
    """One keep-alive connection of the load generator: it writes each request in one write
    and finds the answer's end from its head (status line, Content-Length) itself, so that
    the generator, on the same two cores, takes as little of them as a small C client would
    (asyncio's streams took about 0.4 ms of CPU per request at c=1, as much as the frontend)."""

    def __init__(self, timing: bool = False) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.end = -1  # where the answer ends in ``buf``, once its head is in
        self.status = 0
        self.timing = timing  # read the worker's Server-Timing marks (c=1 only: it costs CPU)
        self.marks: dict[str, float] = {}
        self.waiter: asyncio.Future[int] | None = None
        self.lost: Exception | None = None  # why the connection can take no more requests

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def post(self, body: bytes) -> asyncio.Future[int]:
        """The answer's status, once the whole answer has come."""
        assert self.transport is not None
        self.buf.clear()
        self.end = -1
        self.waiter = asyncio.get_running_loop().create_future()
        if self.lost is not None:
            self.waiter.set_exception(self.lost)
        else:
            self.transport.write(REQUEST_HEAD % len(body) + body)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():  # nobody asked: the stream is out of step
            self._fail(ConnectionError("bytes after an answer"))
            return
        self.buf += data
        if self.end < 0:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = bytes(self.buf[:head_end]).lower()
            at = head.find(b"\r\ncontent-length:")
            if at < 0:
                self._fail(ConnectionError("an answer without Content-Length"))
                return
            line_end = head.find(b"\r\n", at + 2)
            length = int(head[at + 17 : line_end if line_end >= 0 else None])
            self.status = int(head[9:12])
            self.end = head_end + 4 + length
            if self.timing:
                self.marks = server_timing(head)
        if len(self.buf) > self.end:
            self._fail(ConnectionError("bytes after the answer"))
        elif len(self.buf) == self.end and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(self.status)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionError("the service closed the connection"))

    def _fail(self, exc: Exception) -> None:
        """End the connection: the request in flight, and any later one, fail with ``exc``."""
        self.lost = self.lost or exc
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(self.lost)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


def server_timing(head: bytes) -> dict[str, float]:
    """The ``Server-Timing`` marks of an answer's (lower-cased) head, in milliseconds:
    ``parse;dur=0.021, tokenize;dur=0.140, ...`` -> {"parse": 0.021, "tokenize": 0.14, ...}."""
    at = head.find(b"\r\nserver-timing:")
    if at < 0:
        return {}
    line_end = head.find(b"\r\n", at + 2)
    marks = {}
    for part in head[at + 16 : line_end if line_end >= 0 else None].split(b","):
        name, _, dur = part.strip().partition(b";dur=")
        if dur:
            marks[name.decode()] = float(dur)
    return marks


def bodies(texts: list[str]) -> list[bytes]:
    """Each text's JSON body up to its request number: ``numbered(texts, n)``'s body is
    ``bodies(texts)[n % len(texts)] + b"%d\"}" % n`` (json.dumps of a dict per request cost
    more than the rest of the generator's work)."""
    return [json.dumps({"input": f"{t} #"}).encode()[:-2] for t in texts]


async def load(port: int, texts: list[str], concurrency: int, seconds: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    timing = concurrency == 1

    def conn() -> Conn:
        return Conn(timing)

    conns = [(await loop.create_connection(conn, "127.0.0.1", port))[1] for _ in range(concurrency)]
    heads = bodies(texts)
    latencies: list[float] = []
    marks: list[dict[str, float]] = []
    stop_at = 0.0

    async def client(conn: Conn) -> None:
        while time.perf_counter() < stop_at:
            # Distinct across the whole run: a text sent in an earlier cell would be answered
            # from the workers' result caches (two replicas keep them).
            n = next(REQUEST_NUMBERS)
            body = heads[n % len(heads)] + b'%d"}' % n
            t0 = time.perf_counter()
            if await conn.post(body) != 200:
                raise RuntimeError("the service answered an error")
            latencies.append(time.perf_counter() - t0)
            if timing:
                marks.append({**conn.marks, "client": latencies[-1] * 1000})

    stop_at = time.perf_counter() + 0.5  # warm every connection
    await asyncio.gather(*(client(c) for c in conns))
    latencies.clear()
    marks.clear()
    start = time.perf_counter()
    stop_at = start + seconds
    await asyncio.gather(*(client(c) for c in conns))
    elapsed = time.perf_counter() - start
    for c in conns:
        assert c.transport is not None
        c.transport.close()
    latencies.sort()
    return {
        "rows_s": len(latencies) / elapsed,
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        **({"split": c1_split(marks)} if timing else {}),
    }


def c1_split(marks: list[dict[str, float]]) -> dict[str, float]:
    """Medians over the requests of a c=1 cell, in ms: the time outside the worker's handler
    (load generator, frontend, the worker's server), and inside it tokenizing, the forward
    (from the first forward that took the request's rows to its answer), and the rest (parse,
    queue, the hand-offs between the loop and the forward thread, JSON)."""

    marks = [m for m in marks if "total" in m]
    if not marks:  # no Server-Timing came back
        return {}

    def median(f: Any) -> float:
        return statistics.median(f(m) for m in marks)

    return {
        "outside": median(lambda m: m["client"] - m["total"]),
        "tokenize": median(lambda m: m.get("tokenize", 0.0)),
        "forward": median(lambda m: m.get("forward", 0.0)),
        "handler_rest": median(
            lambda m: m["total"] - m.get("forward", 0.0) - m.get("tokenize", 0.0)
        ),
    }


def forward_totals(port: int) -> dict[str, float]:
    """Sums over both workers (from the frontend's merged /metrics): forwards, rows in them
    and padded tokens in them."""
    names = {
        "vllm_sr_worker_forward_rows_count": "forwards",
        "vllm_sr_worker_forward_rows_sum": "rows",
        "vllm_sr_worker_forward_padded_tokens_sum": "padded",
    }
    out = dict.fromkeys(names.values(), 0.0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in names:
                out[names[name]] += float(line.rsplit(" ", 1)[1])
    return out


def service_cell(proc: Any, port: int, texts: list[str], c: int, seconds: float) -> dict[str, Any]:
    pids = worker_pids(port)
    before = (proc_cpu(proc.pid), [thread_cpu(p) for p in pids])
    forwards_before = forward_totals(port)
    t0, client_before = time.perf_counter(), time.process_time()
    result: dict[str, Any] = aio.run(load(port, texts, c, seconds))
    wall = time.perf_counter() - t0
    result["cpu_client"] = (time.process_time() - client_before) / wall
    forwards = {k: v - forwards_before[k] for k, v in forward_totals(port).items()}
    result["rows_per_forward"] = forwards["rows"] / max(forwards["forwards"], 1)
    result["padded_per_row"] = forwards["padded"] / max(forwards["rows"], 1)
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
    args = p.parse_args()
    for line in host_lines():
        print(line, flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="vsr-bench-service-"))
    runs = [Path(tempfile.mkdtemp(prefix="vsr-bench-", dir="/tmp")) for _ in range(2)]
    services = [start_service(tmp / "auto", runs[0])]
    ceilings: dict[str, Ceiling] = {}
    rows: list[dict[str, Any]] = []
    try:
        dtype = served_dtype(services[0][1])
        if dtype != "float32":  # the float32 side, measured at c=64 for the ratios
            services.append(start_service(tmp / "float32", runs[1], "float32"))
        for d in dict.fromkeys((dtype, "float32")):
            ceilings[d] = Ceiling(d)
        print(
            f"service at auto resolved {dtype}; ceiling loops at {dtype}"
            + ("" if dtype == "float32" else "; at c=64 also the float32 ceiling and service"),
            flush=True,
        )
        run_cells(args.seconds, services, ceilings[dtype], ceilings.get("float32"), rows)
    finally:
        for ceiling in ceilings.values():
            ceiling.close()
        for proc, _ in services:
            proc.send_signal(signal.SIGTERM)
        for proc, _ in services:
            proc.wait(60)
        for run in runs:
            shutil.rmtree(run, ignore_errors=True)
    summary(rows, dtype)
    out = tmp / "service.json"
    out.write_text(json.dumps(rows, indent=2))
    print(f"raw figures: {out}")


def run_cells(
    seconds: float,
    services: list[tuple[Any, int]],
    ceiling: Ceiling,
    float32_ceiling: Ceiling | None,
    rows: list[dict[str, Any]],
) -> None:
    (proc, port), top = services[0], max(CONCURRENCY)
    print(f"{'input':<6}{'c':>4}{'ceiling':>9}{'service':>9}{'ratio':>7}{'p50 ms':>9}"
          f"{'p99 ms':>9}{'rows/fwd':>9}{'pad/row':>8}"
          f"   cpu: client | frontend | w0 fwd+rest | w1 fwd+rest", flush=True)  # fmt: skip
    cells = [(name, c) for name in INPUTS for c in CONCURRENCY]
    cells += [("mixed", c) for c in MIXED_CONCURRENCY]
    for name, c in cells:
        texts = MIXED if name == "mixed" else INPUTS[name]
        # The ceiling just before and just after the service's window, averaged.
        ceil = ceiling.measure(name, seconds / 2, c, top)
        cell = service_cell(proc, port, texts, c, seconds)
        ceil = average(ceil, ceiling.measure(name, seconds / 2, c, top))
        cell.update(input=name, c=c, ceiling=ceil)
        rows.append(cell)
        w = " | ".join(f"{x['forward']:.2f}+{x['rest']:.2f}" for x in cell["cpu_workers"])
        print(
            f"{name:<6}{c:>4}{ceil['rows_s']:>9.1f}{cell['rows_s']:>9.1f}"
            f"{cell['rows_s'] / ceil['rows_s']:>7.2f}{cell['p50_ms']:>9.1f}"
            f"{cell['p99_ms']:>9.1f}{cell['rows_per_forward']:>9.1f}"
            f"{cell['padded_per_row']:>8.1f}   {cell['cpu_client']:.2f} | "
            f"{cell['cpu_frontend']:.2f} | {w}",
            flush=True,
        )
        if c == top and name != "mixed" and len(services) > 1 and float32_ceiling is not None:
            # The float32 side in the same window: its ceiling (no full-batch timing) and the
            # service forced to float32.
            f32_ceil = float32_ceiling.measure(name, seconds / 2, 0, top)
            f32 = service_cell(*services[1], texts, c, seconds)
            cell["float32"] = {"ceiling": f32_ceil, "service": f32}
            print(
                f"  float32 side: ceiling {f32_ceil['rows_s']:.1f}, service {f32['rows_s']:.1f} "
                f"(ratio {f32['rows_s'] / f32_ceil['rows_s']:.2f}); served at auto over the "
                f"float32 service {cell['rows_s'] / f32['rows_s']:.2f} x, ceilings "
                f"{ceil['rows_s'] / f32_ceil['rows_s']:.2f} x",
                flush=True,
            )


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def summary(rows: list[dict[str, Any]], dtype: str) -> None:
    print()
    met: list[bool] = []
    targets = TARGETS if dtype == "float32" else BF16_TARGETS
    if dtype == "float32":
        print("no native bf16 on this host: the service served float32; the float32 targets stand")
    for name, target in targets.items():
        top = next(r for r in rows if r["input"] == name and r["c"] == 64)
        one = next(r for r in rows if r["input"] == name and r["c"] == 1)
        ratio = top["rows_s"] / top["ceiling"]["rows_s"]
        p99_x = top["p99_ms"] / top["ceiling"]["full_ms"]
        added = one["p50_ms"] - one["ceiling"]["batch1_ms"]
        alternating = one["ceiling"]["alternating_ms"]
        c1_met = added <= C1_TARGET_MS
        met += [ratio >= target, p99_x <= P99_TARGET, c1_met]
        print(
            f"{name}: c64 ratio {ratio:.3f} ({verdict(ratio >= target)}: >= {target}; the "
            f"ceiling's loops at {'/'.join(map(str, top['ceiling']['batches']))} rows); "
            f"c64 p99 {top['p99_ms']:.0f} ms = {p99_x:.2f} x a full batch's forward "
            f"({top['ceiling']['full_ms']:.0f} ms; {verdict(p99_x <= P99_TARGET)}: <= "
            f"{P99_TARGET}); c1 p50 {one['p50_ms']:.2f} ms = batch-of-one forward "
            f"{one['ceiling']['batch1_ms']:.2f} ms + {added:.2f} ms ({verdict(c1_met)}: <= "
            f"{C1_TARGET_MS} ms; with the two loops taking turns, as c=1 requests do between "
            f"the workers, the bare forward took {alternating:.2f} ms: "
            f"+ {one['p50_ms'] - alternating:.2f} ms)"
        )
        f32 = top.get("float32")
        if f32 is not None:
            over = top["rows_s"] / f32["service"]["rows_s"]
            line = (
                f"  c64 ceilings: {dtype} {top['ceiling']['rows_s']:.1f}, float32 "
                f"{f32['ceiling']['rows_s']:.1f} rows/s; services: auto ({dtype}) "
                f"{top['rows_s']:.1f}, float32 {f32['service']['rows_s']:.1f} rows/s = "
                f"{over:.2f} x"
            )
            if name == "long":
                met.append(over >= LONG_OVER_FLOAT32)
                line += f" ({verdict(over >= LONG_OVER_FLOAT32)}: >= {LONG_OVER_FLOAT32} x)"
            print(line)
        split = one["split"]
        if not split:
            print("  c1 split: no Server-Timing came back")
            continue
        print(
            f"  c1 split (medians, ms): outside the worker's handler {split['outside']:.2f}; "
            f"in it, tokenizing {split['tokenize']:.2f}, the forward {split['forward']:.2f} "
            f"(bare: {one['ceiling']['batch1_ms']:.2f} back to back, {alternating:.2f} taking "
            f"turns), the rest {split['handler_rest']:.2f}"
        )
    print(f"targets met in this run: {sum(met)} of {len(met)}")
    for top in (r for r in rows if r["input"] == "mixed"):
        real = top["ceiling"]["row_tokens"]
        print(
            f"mixed c{top['c']}: {top['padded_per_row']:.1f} padded tokens per row for {real:.1f} "
            f"real (padding {top['padded_per_row'] / real:.2f} x), "
            f"{top['rows_per_forward']:.1f} rows per forward; "
            f"ratio to the padding-free ceiling {top['rows_s'] / top['ceiling']['rows_s']:.2f}"
        )


if __name__ == "__main__":
    main()
