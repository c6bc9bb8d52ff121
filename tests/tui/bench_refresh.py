"""How fast vllm-sr-top refreshes 64 replicas, and how long the UI loop can stall meanwhile.

    .venv/bin/python -m tests.tui.bench_refresh [--replicas 64] [--polls 40]

The real control server with the fake backend runs on a thread of its own (as a service would
run in its own process); the app runs headless at 160x48. Prints the time of one refresh (fetch
over the socket + render) against the 1 s interval, and the event loop's stalls while the app
refreshes back to back (the longest a key press can wait, painting included).
Not a test: the figures depend on the machine."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from vllm_sr_top.widgets import ReplicaTable

from tests.tui.harness import LiveControl, ServerThread, load, make_app, make_backend
from vllm_sr.clock import FakeClock


async def _bench(server: ServerThread, socket: Path, clock: FakeClock, polls: int) -> None:
    backend = server.live.backend
    app = make_app(socket, clock)
    async with app.run_test(size=(160, 48)) as pilot:
        while app.polls < 1:
            await pilot.pause(0.01)
        times = []
        for seed in range(polls):
            server.call(lambda s=seed: load(backend, seed=s))  # type: ignore[misc]
            start = time.perf_counter()
            await app.poll_once()  # fetch over the socket, decode, update every changed cell
            times.append(time.perf_counter() - start)
            await pilot.pause(0.05)  # let the frame paint, as the interval would
        p50, worst = statistics.median(times), max(times)
        rows = app.deployments.query(ReplicaTable).first().row_count
        print(f"refresh of {rows} replicas, every row changed (fetch + decode + table update):")
        print(f"  median {p50 * 1000:.1f} ms, max {worst * 1000:.1f} ms")
        print(f"  ratio median/interval(1 s) = {p50:.3f}; max/interval = {worst:.3f}")

        # The event loop's stalls while refreshing back to back: a key waits at most this long
        # before the app can handle it (no I/O blocks the loop; only rendering takes it).
        app.interval = 0.0
        app.refresh_now()
        lags = []
        start_polls = app.polls
        end = time.perf_counter() + 3.0
        while time.perf_counter() < end:
            before = time.perf_counter()
            await asyncio.sleep(0.005)
            lags.append(time.perf_counter() - before - 0.005)
        lags.sort()
        refreshes = app.polls - start_polls
        print(f"loop stalls while refreshing back to back ({refreshes} refreshes in 3 s):")
        print(
            f"  p50 {statistics.median(lags) * 1000:.1f} ms, "
            f"p99 {lags[int(len(lags) * 0.99)] * 1000:.1f} ms, max {lags[-1] * 1000:.1f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--polls", type=int, default=40)
    args = parser.parse_args()
    clock = FakeClock()
    backend = make_backend(clock, {"primary": []})
    backend.reset({"primary": [f"cuda:{i % 8}" for i in range(args.replicas)]}, first_pid=1000)
    socket = Path(tempfile.mkdtemp(prefix="vsr-bench-", dir="/tmp")) / "control.sock"
    with ServerThread(LiveControl(backend, socket)) as server:
        asyncio.run(_bench(server, socket, clock, args.polls))


if __name__ == "__main__":
    main()
