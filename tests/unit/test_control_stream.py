"""The NDJSON event stream: events made through the API reach every subscriber, heartbeats,
replay from a seq, a slow reader dropped without holding anyone up, and 200 clients at once."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.control_fake import FakeBackend
from tests.support.workers import short_socket_dir
from vllm_sr.control.client import AsyncControlClient
from vllm_sr.control.server import ControlServer


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    d = short_socket_dir(prefix="vsr-ev-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend({"primary": ["cpu", "cpu"]})


def make_server(backend: FakeBackend, sock_dir: Path, **kwargs: Any) -> ControlServer:
    options: dict[str, Any] = {"group": None, "heartbeat_s": 30.0, "write_timeout_s": 0.5}
    return ControlServer(backend, sock_dir / "c.sock", **(options | kwargs))


async def until(cond: Callable[[], bool], deadline_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not cond():
        assert loop.time() < end, "condition not reached before the deadline"
        await asyncio.sleep(0.01)


async def collect(
    client: AsyncControlClient, out: list[dict], since: int | None = None, heartbeats: bool = False
) -> None:
    async for event in client.stream_events(since, heartbeats=heartbeats):
        out.append(event)


async def test_stream_receives_an_ejection_made_through_the_api(
    backend: FakeBackend, sock_dir: Path
) -> None:
    async with (
        make_server(backend, sock_dir) as srv,
        AsyncControlClient(srv.path) as watcher,
        AsyncControlClient(srv.path) as admin,
    ):
        seen: list[dict] = []
        task = asyncio.create_task(collect(watcher, seen))
        await until(lambda: backend.events.subscriber_count == 1)
        await admin.eject("primary-1", 2500)
        await until(lambda: len(seen) == 1)
        task.cancel()
    event = seen[0]
    assert event["event"] == "replica_ejected"
    assert (event["replica"], event["reason"], event["duration_ms"]) == (
        "primary-1",
        "manual",
        2500,
    )
    assert event["seq"] == 1 and isinstance(event["time"], float)


async def test_heartbeats_arrive_between_events(backend: FakeBackend, sock_dir: Path) -> None:
    srv = make_server(backend, sock_dir, heartbeat_s=0.05)
    async with srv, AsyncControlClient(srv.path) as c:
        lines = []
        async for line in c.stream_events(heartbeats=True):
            lines.append(line)
            if len(lines) == 3:
                break
    assert [line["event"] for line in lines] == ["heartbeat"] * 3
    assert lines[0]["time"] <= lines[1]["time"] <= lines[2]["time"]


async def test_since_replays_then_goes_live_without_duplicates(
    backend: FakeBackend, sock_dir: Path
) -> None:
    for i in range(3):
        backend.events.publish("replica_ready", replica=f"primary-{i}")
    async with make_server(backend, sock_dir) as srv, AsyncControlClient(srv.path) as c:
        seen: list[dict] = []
        task = asyncio.create_task(collect(c, seen, since=1))
        await until(lambda: len(seen) == 2)
        backend.events.publish("replica_exited", replica="primary-0")
        await until(lambda: len(seen) == 3)
        task.cancel()
    assert [e["seq"] for e in seen] == [2, 3, 4]


async def test_many_subscribers_each_get_every_event(backend: FakeBackend, sock_dir: Path) -> None:
    async with make_server(backend, sock_dir) as srv:
        clients = [AsyncControlClient(srv.path) for _ in range(20)]
        seen: list[list[dict]] = [[] for _ in clients]
        tasks = [asyncio.create_task(collect(c, s)) for c, s in zip(clients, seen, strict=True)]
        await until(lambda: backend.events.subscriber_count == 20)
        for i in range(5):
            backend.events.publish("replica_ready", replica=f"primary-{i}")
        await until(lambda: all(len(s) == 5 for s in seen))
        for t in tasks:
            t.cancel()
        for c in clients:
            await c.close()
    assert all([e["seq"] for e in s] == [1, 2, 3, 4, 5] for s in seen)


async def open_raw_stream(path: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A bare HTTP/1.0 stream (no chunking: the body is the NDJSON lines)."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(b"GET /v1/events/stream HTTP/1.0\r\nHost: x\r\n\r\n")
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.0 200") or head.startswith(b"HTTP/1.1 200"), head
    return reader, writer


async def test_a_slow_reader_is_dropped_and_holds_nobody_up(
    backend: FakeBackend, sock_dir: Path
) -> None:
    async with make_server(backend, sock_dir, subscriber_queue=8) as srv:
        _, stuck = await open_raw_stream(srv.path)  # never reads
        async with AsyncControlClient(srv.path) as c:
            seen: list[dict] = []
            arrived = asyncio.Event()

            async def good_reader() -> None:
                async for event in c.stream_events():
                    seen.append(event)
                    arrived.set()

            task = asyncio.create_task(good_reader())
            await until(lambda: backend.events.subscriber_count == 2)
            pad = "x" * 32768
            for i in range(1, 121):
                backend.events.publish("replica_ready", replica="primary-0", pad=pad)
                # Paced by the good reader: only the stuck one can fall behind.
                while len(seen) < i:
                    arrived.clear()
                    await asyncio.wait_for(arrived.wait(), 10)
            await until(lambda: backend.events.subscriber_count == 1)
            assert "deployments" in await c.inventory()  # still serving
            task.cancel()
        stuck.close()
    assert [e["seq"] for e in seen] == list(range(1, 121))


async def test_stop_ends_streams_with_a_closing_line(backend: FakeBackend, sock_dir: Path) -> None:
    srv = make_server(backend, sock_dir)
    await srv.start()
    async with AsyncControlClient(srv.path) as c:
        seen: list[dict] = []
        task = asyncio.create_task(collect(c, seen))
        await until(lambda: backend.events.subscriber_count == 1)
        await srv.stop()
        await asyncio.wait_for(task, 10)
    assert seen == [{"event": "stream_closed", "reason": "the service is stopping"}]
    assert backend.events.subscriber_count == 0


async def _read_until_event(reader: asyncio.StreamReader, name: str) -> dict:
    while True:
        line = await reader.readline()
        assert line, "stream ended early"
        event = json.loads(line)
        if event["event"] == name:
            return event


async def test_200_clients_leave_serving_unaffected(backend: FakeBackend, sock_dir: Path) -> None:
    async with make_server(backend, sock_dir) as srv:
        streams = await asyncio.gather(*(open_raw_stream(srv.path) for _ in range(100)))
        idle = [await asyncio.open_unix_connection(str(srv.path)) for _ in range(100)]
        await until(lambda: backend.events.subscriber_count == 100)
        async with AsyncControlClient(srv.path, timeout_s=10) as c:
            inv = await c.inventory()
            assert [r["state"] for r in inv["deployments"][0]["replicas"]] == ["ready", "ready"]
            assert (await c.eject("primary-0", 1000))["state"] == "ejected"
        reads: list[Awaitable[dict]] = [
            asyncio.wait_for(_read_until_event(r, "replica_ejected"), 10) for r, _ in streams
        ]
        events = await asyncio.gather(*reads)
        assert {e["replica"] for e in events} == {"primary-0"} and len(events) == 100
        for _, w in [*streams, *idle]:
            w.close()
