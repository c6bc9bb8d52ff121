"""WorkerClient's streamed exchanges and limits (what Router mode's backend calls use) against
a scripted TCP server on real sockets: the head before the body, a chunked body handed over
chunk by chunk as the server sends it, Content-Length and close-delimited bodies, flow control
(a reader that falls behind stops the socket being read), the connection cap, idle expiry on a
fake clock, the per-phase timeouts, and how each broken exchange is typed."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable

import pytest

from tests.support.scripted_http import OK, sends
from tests.support.scripted_http import ScriptedServer as Server
from tests.support.workers import free_tcp_port
from vllm_sr.clock import FakeClock
from vllm_sr.pool.client import Broken, WorkerClient
from vllm_sr.pool.stream import HIGH_WATER_BYTES


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    srv = Server(replies={"/v1/ok": sends(OK)})
    tcp = await asyncio.start_server(srv.handle, "127.0.0.1", 0)
    srv.port = tcp.sockets[0].getsockname()[1]
    yield srv
    tcp.close()
    for w in srv.writers:
        w.transport.abort()


def client_for(srv: Server, **kw: object) -> WorkerClient:
    return WorkerClient(base_url=f"http://127.0.0.1:{srv.port}/v1", **kw)  # type: ignore[arg-type]


async def until(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not cond():
        assert loop.time() < end, "condition not met in time"
        await asyncio.sleep(0.005)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def test_the_head_comes_first_and_a_chunked_body_chunk_by_chunk(server: Server) -> None:
    gate = asyncio.Event()

    async def sse(writer: asyncio.StreamWriter) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
            b"X-Twice: a\r\nX-Twice: b\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        writer.write(chunk(b"data: one\n\n"))
        await writer.drain()
        await gate.wait()  # the rest only once the client has shown it has the first
        writer.write(chunk(b"data: two\n\n") + b"0\r\n\r\n")
        return True

    server.replies["/v1/chat"] = sse
    client = client_for(server)
    try:
        answer = await client.stream("POST", "/chat", b"{}", headers={"Authorization": "k"})
        assert answer.status == 200 and answer.media_type == "text/event-stream"
        assert answer.headers["x-twice"] == "a, b"
        assert await asyncio.wait_for(answer.__anext__(), 5) == b"data: one\n\n"
        gate.set()
        assert [c async for c in answer] == [b"data: two\n\n"]
        head = server.heads[0]
        assert head.startswith(b"POST /v1/chat HTTP/1.1\r\n")  # the base URL's prefix
        assert b"\r\nAuthorization: k\r\n" in head
        assert b"\r\nContent-Type: application/json\r\n" in head
        again = await client.stream("GET", "/ok")
        assert await again.read() == b"{}"
        assert server.connections == 1  # the streamed exchange left it clean for reuse
        assert b"Content-Length" not in server.heads[1]  # a GET without a body
    finally:
        await client.close()


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nall of it",
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nall of it",
    ],
    ids=["content-length", "close-delimited", "after-100-continue"],
)
async def test_every_kind_of_body_is_streamed_whole(server: Server, reply: bytes) -> None:
    server.replies["/v1/body"] = sends(reply, keep=b"close" not in reply)
    client = client_for(server)
    try:
        answer = await client.stream("POST", "/body", b"{}")
        assert answer.status == 200 and await answer.read() == b"all of it"
        assert (await client.request("GET", "/ok")).body == b"{}"
        assert server.connections == (2 if b"close" in reply else 1)
    finally:
        await client.close()


async def test_a_reader_that_falls_behind_stops_the_socket_being_read(server: Server) -> None:
    total = 64 * 1024 * 1024  # more than loopback's socket buffers can hold

    async def flood(writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        writer.write(b"x" * total)
        return True

    server.replies["/v1/flood"] = flood
    client = client_for(server)
    try:
        answer = await client.stream("GET", "/flood")
        writer = server.writers[0]
        await until(lambda: answer._paused)  # the client reads nothing: its socket is not read
        held = answer._held
        assert HIGH_WATER_BYTES < held < HIGH_WATER_BYTES + 1024 * 1024
        await asyncio.sleep(0.1)  # nothing more arrives while paused, however long it lasts
        assert answer._held == held and writer.transport.get_write_buffer_size() > 0
        got = 0
        async for data in answer:
            got += len(data)
        assert got == total
        assert (await client.request("GET", "/ok")).body == b"{}"
        assert server.connections == 1  # reading resumed; the connection went back clean
    finally:
        await client.close()


async def test_beyond_the_connection_cap_an_exchange_waits_within_its_deadline(
    server: Server,
) -> None:
    gate = asyncio.Event()

    async def held(writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(b"a"))
        await gate.wait()
        writer.write(b"0\r\n\r\n")
        return True

    server.replies["/v1/held"] = held
    client = client_for(server, max_connections=1)
    try:
        first = await client.stream("GET", "/held")
        with pytest.raises(TimeoutError):  # the cap's waiter gives up at its own deadline
            async with asyncio.timeout(0.2):
                await client.stream("GET", "/ok")
        waiting = asyncio.create_task(client.request("GET", "/ok", timeout_s=10))
        await until(lambda: client._freed is not None)  # it waits for the one connection
        assert not waiting.done() and server.connections == 1
        gate.set()
        assert await first.read() == b"a"
        assert (await waiting).body == b"{}"
        assert server.connections == 1  # the waiter got the first one's connection
    finally:
        await client.close()


async def test_an_idle_connection_past_its_expiry_is_not_reused(server: Server) -> None:
    clock = FakeClock()
    client = client_for(server, idle_expiry_s=4.0, clock=clock)
    try:
        await (await client.stream("GET", "/ok")).read()
        clock.advance(3.9)
        await (await client.stream("GET", "/ok")).read()
        assert server.connections == 1
        old = client._idle[0]
        clock.advance(4.1)
        await (await client.stream("GET", "/ok")).read()
        assert server.connections == 2 and old.transport is not None
        assert old.transport.is_closing()  # closed rather than kept
    finally:
        await client.close()


async def test_read_timeouts_cover_the_head_and_the_gaps_between_reads(server: Server) -> None:
    async def silent(writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(30)
        return False

    async def stalls(writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(b"a"))
        await asyncio.sleep(30)
        return False

    server.replies.update({"/v1/silent": silent, "/v1/stalls": stalls})
    client = client_for(server, read_timeout_s=0.2)
    try:
        with pytest.raises(TimeoutError, match=r"sent no answer within 0\.2 s"):
            await client.stream("GET", "/silent")
        answer = await client.stream("GET", "/stalls")
        assert await answer.__anext__() == b"a"
        with pytest.raises(TimeoutError, match=r"sent nothing more within 0\.2 s"):
            await answer.__anext__()
        await answer.aclose()
        assert client._busy == 0 and client._idle == []  # both connections cut, none kept
    finally:
        await client.close()


async def test_failures_are_typed_before_and_after_the_answer(server: Server) -> None:
    async def breaks(writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(b"a"))
        await writer.drain()
        writer.transport.abort()
        return False

    server.replies.update({"/v1/drop": sends(b"", keep=False), "/v1/breaks": breaks})
    refused = WorkerClient(base_url=f"http://127.0.0.1:{free_tcp_port()}")
    client = client_for(server)
    try:
        with pytest.raises(Broken) as info:
            await refused.stream("GET", "/x")
        assert info.value.connecting and info.value.before_answer
        with pytest.raises(Broken) as info:
            await client.stream("POST", "/drop", b"{}")
        assert not info.value.connecting and info.value.before_answer
        answer = await client.stream("GET", "/breaks")
        assert await answer.__anext__() == b"a"  # what arrived is read before the break
        with pytest.raises(Broken) as info:
            await answer.__anext__()
        assert not info.value.before_answer
        with pytest.raises(ValueError, match="line break"):
            await client.stream("GET", "/ok", headers={"X-Evil": "a\r\nHost: elsewhere"})
    finally:
        await refused.close()
        await client.close()


async def test_a_connect_that_hangs_is_a_connect_failure_at_its_timeout() -> None:
    # A listening socket whose backlog is full: the kernel answers no further SYN.
    with socket.socket() as full:
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        port = full.getsockname()[1]
        fillers = []
        for _ in range(8):
            s = socket.socket()
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect(("127.0.0.1", port))
            fillers.append(s)
        client = WorkerClient(base_url=f"http://127.0.0.1:{port}", connect_timeout_s=0.3)
        try:
            with pytest.raises(Broken, match=r"timed out after 0\.3 s") as info:
                await client.stream("GET", "/x")
            assert info.value.connecting
        finally:
            await client.close()
            for s in fillers:
                s.close()


async def test_giving_up_on_a_body_cuts_the_connection(server: Server) -> None:
    server.replies["/v1/long"] = sends(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(b"a")
    )
    client = client_for(server)
    try:
        answer = await client.stream("GET", "/long")
        assert await answer.__anext__() == b"a"
        await answer.aclose()
        assert (await client.request("GET", "/ok")).body == b"{}"
        assert server.connections == 2  # half an answer is never reused
    finally:
        await client.close()


async def test_a_body_the_server_does_not_take_times_out_at_the_write_timeout() -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def never_reads(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        await asyncio.sleep(30)

    tcp = await asyncio.start_server(never_reads, "127.0.0.1", 0)
    port = tcp.sockets[0].getsockname()[1]
    client = WorkerClient(base_url=f"http://127.0.0.1:{port}", write_timeout_s=0.3)
    try:
        body = b"x" * (64 * 1024 * 1024)  # more than loopback's socket buffers can hold
        with pytest.raises(TimeoutError, match=r"did not take the request's body within 0\.3 s"):
            async with asyncio.timeout(10):  # not this one: its message differs
                await client.stream("POST", "/chat", body)
        assert client._busy == 0 and client._idle == []  # the connection was cut
    finally:
        await client.close()
        tcp.close()
        for w in accepted:
            w.transport.abort()
