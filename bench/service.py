"""Service benchmark (`make bench-service`): the real `vllm-sr serve -dp 2` (d3-edge on CPU)
against the raw 2-core ceiling, interleaved (each cell's ceiling is the mean of the one measured
just before and the one just after its service window) so both see the same background load,
at concurrency 1, 8, 32 and 64 with one-row requests of distinct short (~17 tokens) and long
(~108 tokens) texts.

The ceiling is two bare 1-thread forward loops run at once (two processes, same model, each at
its best batch size, no HTTP), forwarding texts made like the service's (the same texts with
the same kind of " #NNNNN" suffix that keeps the service's texts distinct, so both forward the
same number of tokens per row). For each cell it prints rows/s, p50, p99, the ratio to the
ceiling, and where the CPU went (from /proc): this process (the load generator, on the same
cores), the frontend process, and each worker's forward thread and its other threads. It also
prints c=1 p50 against a bare batch-of-one forward (back to back, the target's basis; and with
the two loops taking turns, as c=1 requests take turns between the workers) and c=64 p99
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
import math
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

from bench.worker import LONG, SHORT, thread_cpu  # noqa: E402
from vllm_sr import aio  # noqa: E402

CONCURRENCY = (1, 8, 32, 64)
MIXED_CONCURRENCY = (32, 64)
TARGETS = {"short": 0.85, "long": 0.95}  # c=64 rows/s against the ceiling's
P99_TARGET = 1.3  # c=64 p99 against a full batch's median forward
C1_TARGET_MS = 2.0  # c=1 p50 over a bare batch-of-one forward (back to back)
INPUTS = {"short": SHORT, "long": LONG}
MIXED = [text for pair in zip(SHORT, LONG, strict=True) for text in pair]
# Five-digit request numbers from the start, so every text carries a suffix of one size (the
# ceiling's texts carry numbers of the same size).
FIRST_NUMBER = 10_000
REQUEST_NUMBERS = itertools.count(FIRST_NUMBER)


def numbered(texts: list[str], n: int) -> str:
    return f"{texts[n % len(texts)]} #{n}"


# ---------------------------------------------------------------------- the ceiling loops
def ceiling_loop(cpu: int | None) -> None:
    """A child: load d3-edge with one thread, then answer commands on stdin, one JSON line each:
    {"texts": "short", "seconds": S, "full": bool} -> {"rows_s", "batch", "row_tokens",
    "full_ms"} (``full_ms`` only when asked: a full batch of long rows takes seconds);
    {"batch1": "short"} -> {"batch1_ms"} (40 batch-of-one forwards back to back);
    {"one": "short", "n": N} -> {"ms"} (one batch-of-one forward of text N)."""
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
        if "batch1" in cmd:
            print(json.dumps({"batch1_ms": _batch1_ms(loaded, INPUTS[cmd["batch1"]])}), flush=True)
            continue
        if "one" in cmd:  # one batch-of-one forward, then idle until the next command
            rows = loaded.tokenizer.encode([numbered(INPUTS[cmd["one"]], cmd["n"])])
            print(json.dumps({"ms": _timed(loaded, rows)}), flush=True)
            continue
        texts = [numbered(INPUTS[cmd["texts"]], FIRST_NUMBER + i) for i in range(64)]
        if cmd["texts"] not in batches:
            batches[cmd["texts"]] = best_batch(loaded, texts, 0.25, rounds=3)
        batch = batches[cmd["texts"]]
        rate = forward_rate(loaded, texts, batch, cmd["seconds"])
        tokens = statistics.mean(map(len, loaded.tokenizer.encode(texts)))
        answer = {"rows_s": rate, "batch": batch, "row_tokens": tokens}
        full = _full_ms(loaded, texts) if cmd.get("full") else math.nan
        print(json.dumps({**answer, "full_ms": full}), flush=True)


def _full_ms(loaded: Any, texts: list[str]) -> float:
    """Median time of a bare forward of a full batch (64 rows)."""
    full = loaded.tokenizer.encode([numbered(texts, FIRST_NUMBER + i) for i in range(64)])
    return statistics.median(_timed(loaded, full) for _ in range(5))


def _batch1_ms(loaded: Any, texts: list[str]) -> float:
    """Median time of a bare batch-of-one forward, a distinct text each time (as at c=1)."""
    ones = [loaded.tokenizer.encode([numbered(texts, FIRST_NUMBER + i)]) for i in range(40)]
    return statistics.median(_timed(loaded, rows) for rows in ones)


def _timed(loaded: Any, rows: list[list[int]]) -> float:
    t0 = time.perf_counter()
    loaded.runner.forward(rows)
    return (time.perf_counter() - t0) * 1000


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

    def run(
        self, texts: str, seconds: float, *, batch1: bool = False, full: bool = False
    ) -> dict[str, float]:
        """Rows/s of both loops at once; ``batch1`` and ``full`` add the forward times the
        c=1 and c=64 targets compare with (only those cells ask: they cost seconds)."""
        for i in range(len(self.procs)):  # both loops start before either is read
            self._send(i, {"texts": texts, "seconds": seconds, "full": full})
        answers = [self._read(i) for i in range(len(self.procs))]
        one_ms = alternating_ms = math.nan
        if batch1:  # the batch-of-one forward alone (the other loop idle), as at c=1
            one_ms = self._ask(0, {"batch1": texts})["batch1_ms"]
            alternating_ms = self.alternating_batch1(texts)
        return {
            "rows_s": sum(a["rows_s"] for a in answers),
            "batch1_ms": one_ms,
            "alternating_ms": alternating_ms,
            "full_ms": statistics.mean(a["full_ms"] for a in answers),
            "row_tokens": answers[0]["row_tokens"],
            "batches": [a["batch"] for a in answers],
        }

    def _send(self, i: int, cmd: dict[str, Any]) -> None:
        stdin = self.procs[i].stdin
        assert stdin is not None
        stdin.write(json.dumps(cmd) + "\n")
        stdin.flush()

    def _read(self, i: int) -> dict[str, Any]:
        stdout = self.procs[i].stdout
        assert stdout is not None
        answer: dict[str, Any] = json.loads(stdout.readline())
        return answer

    def _ask(self, i: int, cmd: dict[str, Any]) -> dict[str, Any]:
        self._send(i, cmd)
        return self._read(i)

    def alternating_batch1(self, texts: str, forwards: int = 40) -> float:
        """Median batch-of-one forward when the two loops take turns, one forward at a time,
        as a c=1 load's requests take turns between the service's two workers (ties go to
        the least recently assigned one): each loop idles while the other forwards. Shown
        beside the back-to-back figure, which stays what the c=1 target is judged on."""
        times = [
            self._ask(i % 2, {"one": texts, "n": FIRST_NUMBER + i})["ms"] for i in range(forwards)
        ]
        return statistics.median(times)

    def mixed(self, seconds: float) -> dict[str, float]:
        """The padding-free ceiling of a half-short, half-long load: each kind forwarded apart
        at its best batch size."""
        short, long = self.run("short", seconds / 2), self.run("long", seconds / 2)
        return {
            "rows_s": 1 / (0.5 / short["rows_s"] + 0.5 / long["rows_s"]),
            "row_tokens": (short["row_tokens"] + long["row_tokens"]) / 2,
            "full_ms": math.nan,
            "batch1_ms": math.nan,
            "alternating_ms": math.nan,
        }

    def measure(self, name: str, seconds: float, c: int) -> dict[str, float]:
        if name == "mixed":
            return self.mixed(seconds)
        return self.run(name, seconds, batch1=c == 1, full=c == max(CONCURRENCY))

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


def average(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {k: (a[k] + b[k]) / 2 if isinstance(a[k], float) else a[k] for k in a}


# ---------------------------------------------------------------------- the service
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_service(tmp: Path, run: Path) -> tuple[subprocess.Popen[bytes], int]:
    """``vllm-sr serve -dp 2`` with its sockets under ``run`` (a short path: Unix socket paths
    are limited to 107 bytes); its log goes to ``tmp``."""
    port = free_port()
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
    p.add_argument("--ceiling-loop", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cpu", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.ceiling_loop:
        ceiling_loop(args.cpu)
        return
    tmp = Path(tempfile.mkdtemp(prefix="vsr-bench-service-"))
    run = Path(tempfile.mkdtemp(prefix="vsr-bench-", dir="/tmp"))
    proc, port = start_service(tmp, run)
    ceiling = Ceiling()
    rows: list[dict[str, Any]] = []
    try:
        print(f"{'input':<6}{'c':>4}{'ceiling':>9}{'service':>9}{'ratio':>7}{'p50 ms':>9}"
              f"{'p99 ms':>9}{'rows/fwd':>9}{'pad/row':>8}"
              f"   cpu: client | frontend | w0 fwd+rest | w1 fwd+rest", flush=True)  # fmt: skip
        cells = [(name, c) for name in INPUTS for c in CONCURRENCY]
        cells += [("mixed", c) for c in MIXED_CONCURRENCY]
        for name, c in cells:
            texts = MIXED if name == "mixed" else INPUTS[name]
            # The ceiling just before and just after the service's window, averaged.
            ceil = ceiling.measure(name, args.seconds / 2, c)
            cell = service_cell(proc, port, texts, c, args.seconds)
            ceil = average(ceil, ceiling.measure(name, args.seconds / 2, c))
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
    finally:
        ceiling.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        shutil.rmtree(run, ignore_errors=True)
    summary(rows)
    out = tmp / "service.json"
    out.write_text(json.dumps(rows, indent=2))
    print(f"raw figures: {out}")


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def summary(rows: list[dict[str, Any]]) -> None:
    print()
    met: list[bool] = []
    for name, target in TARGETS.items():
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
