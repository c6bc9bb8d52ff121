"""The GPU check of engine_args.dtype (issue 26), prepared for a host with a CUDA or ROCm GPU:
one real worker on ``cuda:0`` at ``auto``, then one at ``float32``; for each, the dtype it
resolved and why (its /v1/models), and rows/s of 64-row requests (short and long texts, one
request in flight, a fixed number of rounds); then the cosine between the two workers' answers
per row (worst and median). Paste its output in docs/worker.md ("GPU check").

    python bench/gpu_dtype.py [--device cuda:0] [--rounds 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy  # noqa: E402

from bench.common import free_port  # noqa: E402
from bench.worker import LONG, SHORT  # noqa: E402
from tests.support.workers import short_socket_dir, start_worker, stop_worker  # noqa: E402

ROWS = 64


def _call(port: int, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def texts(kind: list[str], n: int = ROWS) -> list[str]:
    return [f"{kind[i % len(kind)]} #{10_000 + i}" for i in range(n)]


def measure(device: str, dtype: str, rounds: int) -> dict[str, Any]:
    port = free_port()
    handle = start_worker(
        "vllm-sr/d3-edge",
        short_socket_dir() / f"gpu-{dtype}.sock",
        port=port,
        extra_args=["--device", device, "--dtype", dtype],
    )
    try:
        card = _call(port, "/v1/models")["data"][0]
        out: dict[str, Any] = {"precision": card["precision"], "embeddings": {}}
        for name, kind in (("short", SHORT), ("long", LONG)):
            body = {"input": texts(kind)}
            answer = _call(port, "/v1/embeddings", body)  # warm, and the answers kept
            out["embeddings"][name] = numpy.asarray([d["embedding"] for d in answer["data"]])
            t0 = time.perf_counter()
            for _ in range(rounds):
                _call(port, "/v1/embeddings", body)
            out[f"{name}_rows_s"] = rounds * ROWS / (time.perf_counter() - t0)
        return out
    finally:
        stop_worker(handle)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--rounds", type=int, default=30)
    args = p.parse_args()
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU visible"
    print(f"torch {torch.__version__}, {gpu}, hip={torch.version.hip}, device {args.device}")
    runs = {d: measure(args.device, d, args.rounds) for d in ("auto", "float32")}
    for d, r in runs.items():
        print(
            f"{d:>8}: served {r['precision']['dtype']} ({r['precision']['reason']}); "
            f"short {r['short_rows_s']:.0f} rows/s, long {r['long_rows_s']:.0f} rows/s"
        )
    for name in ("short", "long"):
        a, b = runs["auto"]["embeddings"][name], runs["float32"]["embeddings"][name]
        cos = numpy.sum(a * b, axis=1)
        print(
            f"{name}: cosine auto vs float32: worst {cos.min():.6f}, median "
            f"{statistics.median(cos):.6f}; worst element {numpy.abs(a - b).max():.2e}; "
            f"speed {runs['auto'][f'{name}_rows_s'] / runs['float32'][f'{name}_rows_s']:.2f} x"
        )


if __name__ == "__main__":
    main()
