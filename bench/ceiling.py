"""The ceiling of `make bench-service`: two bare 1-thread forward loops run at once (two
processes, same model, each at its best batch size, no HTTP), at a given precision (float32, or
bfloat16 / float16 under autocast, exactly as a worker serving that dtype runs its forward).

Each loop is this file run as a child (``--cpu N --dtype D``), kept loaded and idle between
cells and driven by one JSON command per line on stdin (``ceiling_loop``). The texts are made
like the service's (the same texts with the same kind of " #NNNNN" suffix that keeps the
service's texts distinct), so both forward the same number of tokens per row.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from bench.worker import LONG, SHORT  # noqa: E402

INPUTS = {"short": SHORT, "long": LONG}
# Five-digit request numbers from the start, so every text carries a suffix of one size (the
# ceiling's texts carry numbers of the same size).
FIRST_NUMBER = 10_000


def numbered(texts: list[str], n: int) -> str:
    return f"{texts[n % len(texts)]} #{n}"


def ceiling_loop(
    cpu: int | None, dtype: str = "float32", sizes: tuple[int, ...] | None = None
) -> None:
    """A child: load d3-edge with one thread, forwarding at ``dtype``, then answer commands
    on stdin, one JSON line each:
    {"texts": "short", "seconds": S, "full": N} -> {"rows_s", "batch", "row_tokens",
    "full_ms"} (``full_ms``, a batch of N rows, only when N > 0: 64 long rows take seconds);
    {"batch1": "short"} -> {"batch1_ms"} (40 batch-of-one forwards back to back);
    {"one": "short", "n": N} -> {"ms"} (one batch-of-one forward of text N)."""
    import torch

    from bench.worker import BATCH_SIZES, best_batch, forward_rate
    from vllm_sr.worker.artifacts import D3_EDGE, load, resolve

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    loaded = load(resolve(D3_EDGE), "cpu", dtype=dtype)
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
            batches[cmd["texts"]] = best_batch(
                loaded, texts, 0.25, rounds=3, sizes=sizes or BATCH_SIZES
            )
        batch = batches[cmd["texts"]]
        rate = forward_rate(loaded, texts, batch, cmd["seconds"])
        tokens = statistics.mean(map(len, loaded.tokenizer.encode(texts)))
        answer = {"rows_s": rate, "batch": batch, "row_tokens": tokens}
        full = _full_ms(loaded, texts, cmd["full"]) if cmd.get("full") else math.nan
        print(json.dumps({**answer, "full_ms": full}), flush=True)


def _full_ms(loaded: Any, texts: list[str], rows: int) -> float:
    """Median time of a bare forward of a full batch (``rows``: the top concurrency, 64)."""
    full = loaded.tokenizer.encode([numbered(texts, FIRST_NUMBER + i) for i in range(rows)])
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
    """Two ceiling processes at one precision, kept loaded and idle between cells."""

    def __init__(self, dtype: str = "float32", sizes: tuple[int, ...] | None = None) -> None:
        self.dtype = dtype
        argv = [sys.executable, str(Path(__file__).resolve()), "--dtype", dtype]
        if sizes:  # the batch sizes the loops try (default: bench/worker.py's)
            argv += ["--batch-sizes", *map(str, sizes)]
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
        self, texts: str, seconds: float, *, batch1: bool = False, full: int = 0
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

    def measure(self, name: str, seconds: float, c: int, top: int) -> dict[str, float]:
        """The ceiling of one cell (``top``: the highest concurrency, whose cell also times a
        full batch's forward)."""
        if name == "mixed":
            return self.mixed(seconds)
        return self.run(name, seconds, batch1=c == 1, full=top if c == top else 0)

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


def average(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {k: (a[k] + b[k]) / 2 if isinstance(a[k], float) else a[k] for k in a}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cpu", type=int, default=None, help="the CPU this loop runs on")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--batch-sizes", type=int, nargs="+", default=None)
    args = p.parse_args()
    ceiling_loop(args.cpu, args.dtype, tuple(args.batch_sizes) if args.batch_sizes else None)


if __name__ == "__main__":
    main()
