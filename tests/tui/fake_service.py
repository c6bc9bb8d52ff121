"""A stand-in service process for the dashboard's terminal test: the REAL control server on a
Unix socket with the test FakeBackend (the real pool and event bus) behind it, and some moving
traffic figures.

    python -m tests.tui.fake_service SOCKET [--replicas N] [--group NAME]

Runs until SIGTERM or SIGINT (handled on the loop: the handler only sets an event)."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal

from tests.support.control_fake import FakeBackend
from vllm_sr import events as ev
from vllm_sr.control.server import ControlServer


def _traffic(backend: FakeBackend, tick: int) -> None:
    for i, rid in enumerate(backend.replica_ids()):
        replica = backend.replica(rid)
        if replica.display_state() != "ready":
            backend.set_traffic(rid, inflight=0, requests_per_s=0.0)
            continue
        wave = (tick + 3 * i) % 12
        inflight = min(32, 2 * wave + i)
        backend.set_traffic(
            rid,
            inflight=inflight,
            outstanding_bytes=700 * inflight,
            requests_per_s=20.0 + 5 * wave,
            requests=replica.requests() + 20 + 5 * wave,
            latency_p50_ms=4.0 + wave / 2,
            latency_p99_ms=30.0 + 4 * wave,
        )


async def serve(socket: str, replicas: int, group: str | None) -> None:
    backend = FakeBackend({"primary": ["cpu"] * replicas, "classifier": ["cpu"]})
    for rid in backend.replica_ids():
        backend.events.publish(ev.REPLICA_READY, **backend.who(rid), pid=backend.replica(rid).pid)
    server = ControlServer(backend, socket, group=group, heartbeat_s=1.0)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        print(f"serving on {socket}", flush=True)
        for tick in itertools.count():
            _traffic(backend, tick)
            try:
                await asyncio.wait_for(stop.wait(), timeout=0.5)
                break
            except TimeoutError:
                continue


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("socket")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--group", default=None, help="group of the socket file (mode 0660)")
    args = parser.parse_args()
    asyncio.run(serve(args.socket, args.replicas, args.group))


if __name__ == "__main__":
    main()
