"""Per-request CPU of a worker (issue 26): where a one-row request's CPU goes at each dtype,
and how much of it is the forward. Run it on a shared host: it measures CPU time, not wall time.

One real ``vllm-sr worker`` process per dtype (d3-edge, ``--dtype bfloat16`` and ``--dtype
float32``; with ``--tree DIR`` one more per dtype from that source tree, for a before/after) is
driven over its Unix socket by a small keep-alive client with one-row requests, short (~13
tokens) and long (~100 tokens), at concurrency 1 and 8. Each cell is measured ``--rounds``
times, the workers and cells taking turns within a round so that a drift of the host's load falls
on all of them alike; the figures are medians over rounds. Per request it prints:

- the worker process's CPU divided by the requests: each thread's time on a CPU from
  /proc/PID/task/TID/schedstat (nanoseconds; /proc's stat counts whole clock ticks, 10 ms,
  charged to whichever thread runs at the tick, too coarse to split a ~1 ms request between
  threads), and the same from psutil (user + system) as a check;
- of that, the forward thread's (``vsr-forward``: the forward, pooling, handing the jobs back)
  and the other threads' (the event loop: HTTP, JSON, tokenizing, finishing);
- the handler's Server-Timing parts (wall time, medians): parse, tokenize, post (finishing and
  JSON out); the other threads' CPU less these is the HTTP server, the event loop and the
  hand-off to and from the forward thread (approximately: the parts are wall time).

``--profile N`` then runs N requests of each kind through an in-process worker (the real
server, handler and engine, d3-edge at bfloat16, client threads outside the profile) under
cProfile, the event-loop thread and the forward thread apart, and prints for each the functions
that cost most per request (own time; wall time, so a call that waits for the GIL or a cold
cache shows it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import pstats
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import psutil  # noqa: E402

from bench.service import host_lines  # noqa: E402
from bench.worker import LONG, SHORT, Conn  # noqa: E402
from tests.support.workers import (  # noqa: E402
    WorkerHandle,
    short_socket_dir,
    start_worker,
    stop_worker,
)

ARTIFACT = "vllm-sr/d3-edge"
INPUTS = {"short": SHORT, "long": LONG}
PARTS = ("parse", "tokenize", "post")
WARM_REQUESTS = 20


def texts_for(kind: str, n: int) -> list[str]:
    """Distinct texts (a worker result cache, when on, never answers; forwards never repeat)."""
    base = INPUTS[kind]
    return [f"{base[i % len(base)]} #{i}" for i in range(n)]


def server_timing(header: str) -> dict[str, float]:
    out = {}
    for part in header.split(","):
        name, _, dur = part.strip().partition(";dur=")
        if dur:
            out[name] = float(dur) * 1000.0  # ms -> us
    return out


async def drive(uds: Path, bodies: list[bytes], concurrency: int, seconds: float) -> Any:
    """Requests at ``concurrency`` for ``seconds`` (after a warm-up); -> (requests, the
    Server-Timing parts of each)."""
    conns = [await Conn.open(uds) for _ in range(concurrency)]
    parts: list[dict[str, float]] = []
    stop_at = 0.0
    counter = iter(range(10**9))

    async def client(conn: Conn, keep: bool) -> None:
        while time.perf_counter() < stop_at:
            body = bodies[next(counter) % len(bodies)]
            status, headers, _ = await conn.post("/v1/embeddings", body)
            if status != 200:
                raise RuntimeError(f"worker answered {status}")
            if keep:
                parts.append(server_timing(headers.get("server-timing", "")))

    stop_at = time.perf_counter() + 0.2
    await asyncio.gather(*(client(c, False) for c in conns))
    stop_at = time.perf_counter() + seconds
    await asyncio.gather(*(client(c, True) for c in conns))
    for c in conns:
        c.close()
    return parts


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of the worker's forward thread and of its other threads, from each
    thread's schedstat (run time in nanoseconds)."""
    from vllm_sr.worker.engine import FORWARD_THREAD_NAME

    out = {"forward": 0.0, "rest": 0.0}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            ran = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        out["forward" if name == FORWARD_THREAD_NAME else "rest"] += ran / 1e9
    return out


def cell(handle: WorkerHandle, kind: str, concurrency: int, seconds: float) -> dict[str, float]:
    """One measured window: per-request CPU (us) of the worker and its parts."""
    bodies = [json.dumps({"input": t}).encode() for t in texts_for(kind, 4096)]
    proc = psutil.Process(handle.pid)
    before_t = thread_cpu(handle.pid)
    before = proc.cpu_times()
    parts = asyncio.run(drive(handle.uds, bodies, concurrency, seconds))
    after = proc.cpu_times()
    after_t = thread_cpu(handle.pid)
    n = len(parts)
    cpu = (after.user + after.system) - (before.user + before.system)
    result = {
        "requests": n,
        "rps": n / seconds,
        "cpu_us": (after_t["forward"] + after_t["rest"] - before_t["forward"] - before_t["rest"])
        / n
        * 1e6,
        "psutil_us": cpu / n * 1e6,
        "forward_us": (after_t["forward"] - before_t["forward"]) / n * 1e6,
        "other_us": (after_t["rest"] - before_t["rest"]) / n * 1e6,
    }
    for name in PARTS:
        result[name] = statistics.median(p.get(name, 0.0) for p in parts)
    return result


def run_workers(args: argparse.Namespace) -> None:
    trees = [("this", str(REPO))] + [(f"tree{i}", t) for i, t in enumerate(args.tree, 1)]
    workers: dict[tuple[str, str], WorkerHandle] = {}
    # `python -m` puts the working directory first on a worker's path: from a neutral one,
    # PYTHONPATH alone says which tree a worker runs.
    os.chdir(tempfile.gettempdir())
    try:
        for label, tree in trees:
            for dtype in args.dtypes:
                env = {"PYTHONPATH": os.pathsep.join([tree, str(REPO)])}
                workers[label, dtype] = start_worker(
                    ARTIFACT,
                    short_socket_dir() / "w.sock",
                    env=env,
                    extra_args=["--dtype", dtype, "--threads", "1"],
                )
        for label, tree in trees:
            print(f"{label}: {tree}")
        print()
        runs: dict[tuple[str, str, str, int], list[dict[str, float]]] = {}
        for _ in range(args.rounds):
            for kind in INPUTS:
                for c in args.concurrency:
                    for key, handle in workers.items():
                        runs.setdefault((*key, kind, c), []).append(
                            cell(handle, kind, c, args.seconds)
                        )
        report(runs)
    finally:
        for handle in workers.values():
            stop_worker(handle)


def report(runs: dict[tuple[str, str, str, int], list[dict[str, float]]]) -> None:
    print("CPU per request, us (medians over rounds); parts: the handler's Server-Timing, wall us")
    head = (
        f"{'tree':6} {'dtype':9} {'input':6} {'c':>2} {'req/s':>7} {'cpu':>7} {'forward':>8} "
        f"{'share':>6} {'other':>6} {'parse':>6} {'token':>6} {'post':>6} {'rest':>6} {'psutil':>7}"
    )
    print(head)
    for (label, dtype, kind, c), cells in runs.items():
        m = {k: statistics.median(x[k] for x in cells) for k in cells[0]}
        rest = m["other_us"] - m["parse"] - m["tokenize"] - m["post"]
        print(
            f"{label:6} {dtype:9} {kind:6} {c:>2} {m['rps']:>7.1f} {m['cpu_us']:>7.0f} "
            f"{m['forward_us']:>8.0f} {m['forward_us'] / m['cpu_us']:>6.2f} "
            f"{m['other_us']:>6.0f} {m['parse']:>6.0f} {m['tokenize']:>6.0f} "
            f"{m['post']:>6.0f} {rest:>6.0f} {m['psutil_us']:>7.0f}"
        )


# ---------------------------------------------------------------------- in-process profile
def post_blocking(sock: socket.socket, body: bytes) -> None:
    sock.sendall(
        b"POST /v1/embeddings HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += sock.recv(65536)
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(rest) < length:
        rest += sock.recv(65536)
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head.decode(errors="replace"))


async def profile_in_process(n: int, dtype: str, top: int, concurrency: int = 1) -> None:
    from vllm_sr.worker.api import build_server
    from vllm_sr.worker.options import WorkerOptions, build_state
    from vllm_sr.worker.startup import load_and_check

    uds = str(Path(tempfile.mkdtemp(prefix="vsr-p", dir="/tmp")) / "w.sock")
    opts = WorkerOptions(ARTIFACT, uds=uds, dtype=dtype, threads=1)
    state = build_state(opts, os.environ)
    loop = asyncio.get_running_loop()
    server = build_server(state)
    await server.listen_unix(uds)
    await loop.run_in_executor(None, load_and_check, opts, state, loop)
    state.set_status("ready", None)
    assert state.engine is not None
    engine = state.engine
    run_batch = engine.run_batch
    on_forward: list[cProfile.Profile] = []  # the forward thread's profiler while measuring

    def profiled_batch(batch: Any) -> None:
        if not on_forward:
            return run_batch(batch)
        on_forward[0].enable()  # cProfile follows the thread that enables it: the forward's
        try:
            return run_batch(batch)
        finally:
            on_forward[0].disable()

    engine.run_batch = profiled_batch  # type: ignore[method-assign]
    try:
        for kind in INPUTS:
            bodies = [json.dumps({"input": t}).encode() for t in texts_for(kind, n + WARM_REQUESTS)]
            done = asyncio.Event()
            warm = threading.Barrier(concurrency + 1)
            left = [concurrency]

            def client(
                mine: list[bytes], done: asyncio.Event = done, warm: threading.Barrier = warm
            ) -> None:
                with socket.socket(socket.AF_UNIX) as sock:
                    sock.connect(uds)
                    for body in mine[:WARM_REQUESTS]:
                        post_blocking(sock, body)
                    warm.wait()
                    for body in mine[WARM_REQUESTS:]:
                        post_blocking(sock, body)
                loop.call_soon_threadsafe(finished, done)

            def finished(done: asyncio.Event, left: list[int] = left) -> None:
                left[0] -= 1
                if left[0] == 0:
                    done.set()

            share = n // concurrency
            threads = [
                threading.Thread(
                    target=client,
                    args=(bodies[:WARM_REQUESTS] + bodies[WARM_REQUESTS + i * share :][:share],),
                    daemon=True,
                )
                for i in range(concurrency)
            ]
            for thread in threads:
                thread.start()
            await loop.run_in_executor(None, warm.wait)
            profiler = cProfile.Profile()
            on_forward[:] = [cProfile.Profile()]
            process_before = time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID)
            loop_before = time.thread_time()
            profiler.enable()
            await done.wait()
            profiler.disable()
            while engine.busy:  # the last forward's bookkeeping, after its answers went out
                await asyncio.sleep(0.001)
            forward_stats = pstats.Stats(on_forward.pop())
            loop_cpu = time.thread_time() - loop_before
            process_cpu = time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID) - process_before
            for thread in threads:
                thread.join()
            n = share * concurrency
            print(
                f"\nin-process {kind}, {dtype}, {n} requests at c={concurrency}: event-loop "
                f"thread {loop_cpu / n * 1e6:.0f} us/request under cProfile (the process: "
                f"{process_cpu / n * 1e6:.0f} us, client threads and forward included)"
            )
            print(per_request(pstats.Stats(profiler), n, top))
            print(f"the forward thread (run_batch), {kind}:")
            print(per_request(forward_stats, n, top))
    finally:
        server.stop_accepting()
        with contextlib.suppress(Exception):
            await server.close(1.0)
        engine.stop(1.0)


def per_request(stats: pstats.Stats, n: int, top: int) -> str:
    """The ``top`` functions by own time, with calls and times per request (us), paths
    shortened to the repository or the package."""
    rows = []
    for (path, line, func), (_, calls, own, cum, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = func if path == "~" else f"{shorten(path)}:{line}({func})"
        rows.append((own, calls, cum, where))
    rows.sort(reverse=True)
    lines = [f"{'calls/req':>9} {'own us/req':>10} {'cum us/req':>10}  function"]
    for own, calls, cum, where in rows[:top]:
        lines.append(f"{calls / n:>9.1f} {own / n * 1e6:>10.1f} {cum / n * 1e6:>10.1f}  {where}")
    return "\n".join(lines)


def shorten(path: str) -> str:
    for root in (str(REPO) + "/", "site-packages/", "lib/python3."):
        if root in path:
            path = path.split(root, 1)[1]
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="per cell and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        help="another source tree (a checkout's root) to run workers from, for a before/after",
    )
    parser.add_argument("--profile", type=int, default=300, help="requests; 0: no profile")
    parser.add_argument("--profile-dtype", default="bfloat16")
    parser.add_argument("--profile-concurrency", type=int, default=1)
    parser.add_argument("--top", type=int, default=25, help="functions in each profile")
    args = parser.parse_args()
    for line in host_lines():
        print(line)
    print(f"load average {os.getloadavg()[0]:.1f}; {args.rounds} rounds of {args.seconds:g} s")
    if args.rounds > 0:
        run_workers(args)
    if args.profile > 0:
        asyncio.run(
            profile_in_process(args.profile, args.profile_dtype, args.top, args.profile_concurrency)
        )


if __name__ == "__main__":
    main()
