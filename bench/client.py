"""Worker-client microbenchmark: the cost per exchange of ``vllm_sr.pool.client.WorkerClient``
against an instant aiohttp server on a Unix socket, run in its own process so the client's CPU
time is measured apart from the server's.

Prints, for N sequential and N concurrent (64 in flight) small POSTs: exchanges/s (wall) and
the client process's CPU microseconds per exchange (what the frontend pays per request).

    .venv/bin/python bench/client.py [--n 5000] [--concurrency 64] [--module M ...] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SERVER = """
import sys
from aiohttp import web
async def echo(request):
    body = await request.read()
    return web.Response(body=body, content_type="application/json")
app = web.Application()
app.router.add_post("/echo", echo)
web.run_app(app, path=sys.argv[1], print=lambda *a: print("up", flush=True), access_log=None)
"""


async def _wait_for(path: str, proc: subprocess.Popen[bytes], deadline_s: float = 20.0) -> None:
    end = time.monotonic() + deadline_s
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > end:
            raise RuntimeError("bench server did not start")
        await asyncio.sleep(0.02)


async def _run(module: str, n: int, concurrency: int, path: str) -> None:
    client_mod = importlib.import_module(module)
    client = client_mod.WorkerClient(uds=path, replica_id="bench")
    body = b'{"model":"primary","input":"The quick brown fox jumps over the lazy dog."}'

    async def one() -> None:
        resp = await client.post("/echo", body, timeout_s=10)
        assert resp.status == 200 and resp.body == body

    for _ in range(200):  # warm up: connections opened, code paths hot
        await one()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        await one()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(
        f"{module}: sequential  {n} x: {n / wall:8.0f}/s  "
        f"client CPU {cpu / n * 1e6:6.1f} us/exchange"
    )

    sem = asyncio.Semaphore(concurrency)

    async def limited() -> None:
        async with sem:
            await one()

    t0, c0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(limited() for _ in range(n)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(
        f"{module}: concurrent {concurrency} x {n}: {n / wall:8.0f}/s  "
        f"client CPU {cpu / n * 1e6:6.1f} us/exchange"
    )
    await client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--module", action="append", default=None)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    path = str(Path(tempfile.mkdtemp(prefix="vsr-bc-", dir="/tmp")) / "w.sock")
    proc = subprocess.Popen([sys.executable, "-c", SERVER, path], stdout=subprocess.DEVNULL)
    try:
        asyncio.run(_wait_for(path, proc))
        for _ in range(args.rounds):  # modules interleaved, so drift in the machine hits each
            for module in args.module or ["vllm_sr.pool.client"]:
                asyncio.run(_run(module, args.n, args.concurrency, path))
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
