"""Forward sizes (`make bench-forward-sizes`): what one bare forward of d3-edge costs per row
and per padded token at batch sizes 1 to 64, short (~17-token) and long (~108-token) rows,
on one CPU with one thread (as a `-dp 2` worker on two cores runs). The size where a token is
cheapest is where the engine's CPU forward target (``CPU_FORWARD_TOKENS_PER_THREAD``) comes
from; run it on another machine to check that target there."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from bench.worker import LONG, SHORT  # noqa: E402

ROWS = (1, 2, 4, 8, 12, 16, 24, 32, 64)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=3.0, help="time per size, all rounds")
    p.add_argument("--rounds", type=int, default=6, help="turns each size takes")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    import torch

    from vllm_sr.worker.artifacts import D3_EDGE, load, resolve
    from vllm_sr.worker.forming import CPU_FORWARD_TOKENS_PER_THREAD

    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: args.threads]))
    torch.set_num_threads(args.threads)
    loaded = load(resolve(D3_EDGE), "cpu")
    print(f"{'input':<6}{'rows':>5}{'tokens':>8}{'forward ms':>12}{'rows/s':>9}{'us/token':>10}")
    for name, texts in (("short", SHORT), ("long", LONG)):
        batches = {
            rows: loaded.tokenizer.encode(
                [f"{texts[i % len(texts)]} #{10000 + i}" for i in range(rows)]
            )
            for rows in ROWS
        }
        times: dict[int, list[float]] = {rows: [] for rows in ROWS}
        # Sizes take turns, round after round, so a drift in the machine's speed (other
        # tenants) falls on every size alike; each size's figure is the median of its rounds.
        for _ in range(args.rounds):
            for rows, batch in batches.items():
                loaded.runner.forward(batch)  # warm
                stop = time.perf_counter() + args.seconds / args.rounds
                while True:
                    t0 = time.perf_counter()
                    loaded.runner.forward(batch)
                    times[rows].append(time.perf_counter() - t0)
                    if time.perf_counter() >= stop:
                        break
        best: tuple[float, int] | None = None
        for rows, batch in batches.items():
            padded = rows * max(map(len, batch))
            median = statistics.median(times[rows])
            per_token = median / padded
            best = min(best or (per_token, padded), (per_token, padded))
            print(
                f"{name:<6}{rows:>5}{padded:>8}{median * 1000:>12.2f}{rows / median:>9.1f}"
                f"{per_token * 1e6:>10.1f}",
                flush=True,
            )
        assert best is not None
        print(f"{name}: a token is cheapest at {best[1]} padded tokens ({best[0] * 1e6:.1f} us)")
    print(f"the engine's CPU target: {CPU_FORWARD_TOKENS_PER_THREAD} padded tokens per thread")


if __name__ == "__main__":
    main()
