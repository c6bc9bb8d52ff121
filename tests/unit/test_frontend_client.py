"""WorkerClient on a real aiohttp server over a real Unix socket: keep-alive reuse, a stale
idle connection, chunked answers, deadlines and a dead worker, each typed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from tests.support.workers import short_socket_dir
from vllm_sr.errors import DeadlineExceeded, WorkerFailed
from vllm_sr.pool.client import WorkerClient


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, dict[str, int], web.AppRunner]]:
    seen = {"connections": 0}

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        return web.Response(
            body=body, content_type="application/json", headers={"Server-Timing": "total;dur=1"}
        )

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({})

    async def die(request: web.Request) -> web.Response:
        await asyncio.sleep(0.1)
        assert request.transport is not None
        request.transport.abort()  # the worker process vanishing mid-request looks like this
        await asyncio.sleep(1)
        return web.json_response({})

    async def chunked(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for part in (b'{"a":', b" 1}"):
            await resp.write(part)
        await resp.write_eof()
        return resp

    async def on_connect(request: web.Request) -> web.Response:
        return web.json_response({"status": "ready"})

    app = web.Application()
    app.router.add_post("/echo", echo)
    app.router.add_post("/slow", slow)
    app.router.add_post("/die", die)
    app.router.add_get("/chunked", chunked)
    app.router.add_get("/health", on_connect)
    runner = web.AppRunner(app, keepalive_timeout=30, shutdown_timeout=0.1)
    await runner.setup()
    path = str(short_socket_dir(prefix="vsr-c-") / "w.sock")
    await web.UnixSite(runner, path).start()
    yield path, seen, runner
    await runner.cleanup()


async def test_bytes_go_through_unchanged_and_connections_are_reused(server) -> None:  # type: ignore[no-untyped-def]
    path, _, _ = server
    client = WorkerClient(uds=path, replica_id="r0")
    try:
        body = b'{"input": "\xc3\xa9t\xc3\xa9", "model": "primary"}'
        first = await client.post("/echo", body, timeout_s=5)
        assert first.status == 200 and first.body == body
        assert first.headers == {"Server-Timing": "total;dur=1"}
        assert len(client._idle) == 1
        conn = client._idle[0]
        second = await client.post("/echo", b"{}", timeout_s=5)
        assert second.body == b"{}" and client._idle == [conn]  # the same connection again
        status, doc = await client.health()
        assert status == 200 and doc == {"status": "ready"}
    finally:
        await client.close()


async def test_a_stale_idle_connection_is_replaced(server) -> None:  # type: ignore[no-untyped-def]
    path, _, _ = server
    client = WorkerClient(uds=path)
    try:
        await client.post("/echo", b"1", timeout_s=5)
        conn = client._idle[0]
        assert conn.transport is not None
        conn.transport.abort()  # as if the worker closed it while idle
        await asyncio.sleep(0)
        resp = await client.post("/echo", b"2", timeout_s=5)
        assert resp.body == b"2"
    finally:
        await client.close()


async def test_chunked_answer_is_read_whole(server) -> None:  # type: ignore[no-untyped-def]
    path, _, _ = server
    client = WorkerClient(uds=path)
    try:
        resp = await client.request("GET", "/chunked", timeout_s=5)
        assert resp.json() == {"a": 1}
    finally:
        await client.close()


async def test_deadline_is_typed_and_the_connection_dropped(server) -> None:  # type: ignore[no-untyped-def]
    path, _, _ = server
    client = WorkerClient(uds=path, replica_id="r1")
    try:
        with pytest.raises(DeadlineExceeded, match="r1"):
            await client.post("/slow", b"{}", timeout_s=0.1)
        assert client._idle == []
    finally:
        await client.close()


async def test_no_worker_is_worker_failed() -> None:
    client = WorkerClient(uds="/tmp/vsr-no-such-worker.sock", replica_id="gone")
    with pytest.raises(WorkerFailed, match="gone"):
        await client.post("/echo", b"{}", timeout_s=1)


async def test_worker_dying_mid_request_is_worker_failed(server) -> None:  # type: ignore[no-untyped-def]
    path, _, _ = server
    client = WorkerClient(uds=path)
    try:
        with pytest.raises(WorkerFailed):
            await client.post("/die", b"{}", timeout_s=10)
        assert client._idle == []
    finally:
        await client.close()


def test_base_url_must_be_http() -> None:
    with pytest.raises(ValueError, match="http://HOST:PORT"):
        WorkerClient(base_url="ftp://x")
    with pytest.raises(ValueError, match="exactly one"):
        WorkerClient()
