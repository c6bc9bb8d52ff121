"""HttpServer on real sockets, driven by raw bytes: keep-alive, pipelining, chunked bodies, the
body cap, stalled clients, bad bytes, HEAD, Expect, and a graceful close."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from vllm_sr.errors import VllmSrError
from vllm_sr.httpserver import MAX_HEAD_BYTES, HttpServer, Request, Response, StreamResponse


@dataclass
class Echo:
    """A handler that answers each request with what it saw; ``gate`` holds answers back."""

    seen: list[Request] = field(default_factory=list)
    gate: asyncio.Event | None = None
    entered: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, request: Request) -> Response:
        self.seen.append(request)
        self.entered.set()
        if request.error is not None:
            err = request.error
            return Response(json.dumps(err.to_json()).encode(), err.http_status)
        if request.path == "/boom":
            raise RuntimeError("handler bug")
        if self.gate is not None:
            await self.gate.wait()
        body = {
            "method": request.method,
            "path": request.path,
            "query": request.query,
            "body": request.body.decode(),
            "x": request.headers.get("x-thing"),
        }
        return Response(json.dumps(body).encode(), headers={"X-Answer": "yes"})


@dataclass
class Running:
    server: HttpServer
    echo: Echo
    port: int

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)


@pytest.fixture
async def running() -> AsyncIterator[Running]:
    echo = Echo()
    server = HttpServer(echo, max_body=100, read_timeout_s=0.5)
    _, port = await server.listen_tcp("127.0.0.1", 0)
    yield Running(server, echo, port)
    await server.close(1.0)


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


def post(path: bytes, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n%s\r\n%s" % (
        path,
        len(body),
        extra,
        body,
    )


async def closed(reader: asyncio.StreamReader) -> bool:
    """True when the server has closed the connection (EOF within a deadline)."""
    return await asyncio.wait_for(reader.read(), 10) == b""


async def test_keep_alive_answers_requests_in_turn(running: Running) -> None:
    reader, writer = await running.connect()
    for i in range(3):
        writer.write(post(b"/a?n=%d" % i, b'{"i": %d}' % i, b"X-Thing: t\r\n"))
        status, headers, body = await read_answer(reader)
        answer = json.loads(body)
        assert status == 200 and headers["x-answer"] == "yes"
        assert answer == {
            "method": "POST",
            "path": "/a",
            "query": f"n={i}",
            "body": f'{{"i": {i}}}',
            "x": "t",
        }
    writer.close()


async def test_pipelined_requests_are_answered_in_order(running: Running) -> None:
    running.echo.gate = asyncio.Event()
    reader, writer = await running.connect()
    writer.write(b"".join(post(b"/%d" % i, b"x") for i in range(4)))
    await asyncio.wait_for(running.echo.entered.wait(), 10)
    assert len(running.echo.seen) == 1  # one at a time per connection
    (conn,) = running.server.connections
    assert conn.transport is not None and not conn.transport.is_reading()  # no more buffered
    running.echo.gate.set()
    paths = [json.loads((await read_answer(reader))[2])["path"] for _ in range(4)]
    assert paths == ["/0", "/1", "/2", "/3"]
    assert conn.transport.is_reading()  # answered: reading on
    writer.close()


async def test_a_request_half_read_behind_pipelined_ones_is_finished(running: Running) -> None:
    running.echo.gate = asyncio.Event()
    reader, writer = await running.connect()
    third = post(b"/3", b"abcdef")
    writer.write(post(b"/1", b"x") + post(b"/2", b"y") + third[:-3])
    await asyncio.wait_for(running.echo.entered.wait(), 10)
    running.echo.gate.set()
    assert [json.loads((await read_answer(reader))[2])["path"] for _ in range(2)] == ["/1", "/2"]
    writer.write(third[-3:])
    status, _, body = await read_answer(reader)
    assert status == 200 and json.loads(body)["body"] == "abcdef"
    writer.close()


async def test_connection_close_and_http_1_0_end_the_connection(running: Running) -> None:
    for request in (
        post(b"/c", b"x", b"Connection: close\r\n"),
        b"GET /old HTTP/1.0\r\nHost: t\r\n\r\n",
    ):
        reader, writer = await running.connect()
        writer.write(request)
        status, headers, _ = await read_answer(reader)
        assert status == 200 and headers["connection"] == "close"
        assert await closed(reader)
        writer.close()


async def test_nothing_after_a_last_request_is_answered(running: Running) -> None:
    reader, writer = await running.connect()
    writer.write(post(b"/last", b"x", b"Connection: close\r\n") + post(b"/after", b"y"))
    status, headers, _ = await read_answer(reader)
    assert status == 200 and headers["connection"] == "close"
    assert await closed(reader)
    assert [r.path for r in running.echo.seen] == ["/last"]
    writer.close()


async def test_a_body_refused_behind_a_pipelined_request_is_still_dropped(
    running: Running,
) -> None:
    running.echo.gate = asyncio.Event()
    reader, writer = await running.connect()
    big = b"POST /big HTTP/1.1\r\nHost: t\r\nContent-Length: 300\r\n\r\n"
    writer.write(post(b"/first", b"x") + big + b"x" * 100)
    await asyncio.wait_for(running.echo.entered.wait(), 10)
    running.echo.gate.set()
    assert (await read_answer(reader))[0] == 200
    assert (await read_answer(reader))[0] == 413
    writer.write(b"x" * 200)  # the rest of the refused body: read, dropped, then closed
    assert await closed(reader)
    writer.close()


async def test_a_chunked_body_is_read_whole(running: Running) -> None:
    reader, writer = await running.connect()
    writer.write(
        b"POST /chunks HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n"
    )
    _, _, body = await read_answer(reader)
    assert json.loads(body)["body"] == "abcdefg"
    writer.close()


async def test_head_gets_the_headers_without_the_body(running: Running) -> None:
    reader, writer = await running.connect()
    writer.write(b"HEAD /h HTTP/1.1\r\nHost: t\r\n\r\nGET /g HTTP/1.1\r\nHost: t\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 200") and b"Content-Length: " in head
    # The next bytes are the GET's answer: the HEAD's carried no body.
    status, _, body = await read_answer(reader)
    assert status == 200 and json.loads(body)["method"] == "GET"
    assert [r.method for r in running.echo.seen] == ["HEAD", "GET"]
    writer.close()


async def test_expect_100_continue_is_answered(running: Running) -> None:
    reader, writer = await running.connect()
    writer.write(
        b"POST /e HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"
    )
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"ok")
    status, _, body = await read_answer(reader)
    assert status == 200 and json.loads(body)["body"] == "ok"
    writer.close()


async def test_a_declared_body_over_the_cap_is_refused_before_it_is_sent(
    running: Running,
) -> None:
    reader, writer = await running.connect()
    writer.write(b"POST /big HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n\r\n" + b"x" * 10)
    status, headers, body = await read_answer(reader)  # without the other 4990 bytes
    assert status == 413 and headers["connection"] == "close"
    assert json.loads(body)["error"]["code"] == "request_too_large"
    assert "5000 bytes" in json.loads(body)["error"]["message"]
    # The rest of the refused body is read and dropped (the connection stays open for it, so
    # a client still sending is not reset); then the connection closes.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.read(1), 0.2)
    writer.write(b"x" * 4990)
    assert await closed(reader)
    writer.close()


async def test_a_chunked_body_crossing_the_cap_is_refused(running: Running) -> None:
    reader, writer = await running.connect()
    writer.write(b"POST /big HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
    writer.write(b"40\r\n" + b"x" * 64 + b"\r\n")
    writer.write(b"40\r\n" + b"x" * 64 + b"\r\n")
    status, _, _ = await read_answer(reader)
    assert status == 413
    assert running.echo.seen[-1].body == b""  # nothing of it was kept
    writer.write(b"40\r\n" + b"x" * 64 + b"\r\n0\r\n\r\n")
    assert await closed(reader)
    writer.close()


async def test_a_stalled_request_gets_408_and_others_are_served(running: Running) -> None:
    stalled_reader, stalled = await running.connect()
    stalled.write(b"POST /s HTTP/1.1\r\nHost: t\r\nContent-Length: 50\r\n\r\nhalf")
    reader, writer = await running.connect()
    writer.write(post(b"/meanwhile", b"x"))
    assert (await read_answer(reader))[0] == 200
    status, _, body = await read_answer(stalled_reader)
    assert status == 408 and json.loads(body)["error"]["code"] == "request_timeout"
    assert await closed(stalled_reader)
    stalled.close()
    writer.close()


async def test_bad_bytes_get_400_and_a_closed_connection(running: Running) -> None:
    reader, writer = await running.connect()
    writer.write(b"NOT HTTP AT ALL\r\n\r\n")
    status, _, body = await read_answer(reader)
    assert status == 400 and "malformed" in json.loads(body)["error"]["message"]
    assert await closed(reader)
    assert running.echo.seen == []
    writer.close()


async def test_a_head_over_the_cap_is_refused(running: Running) -> None:
    reader, writer = await running.connect()
    pad = b"X-Pad: " + b"a" * (MAX_HEAD_BYTES + 10) + b"\r\n"
    writer.write(b"GET /h HTTP/1.1\r\nHost: t\r\n" + pad + b"\r\n")
    status, _, body = await read_answer(reader)
    assert status == 413 and "request head" in json.loads(body)["error"]["message"]
    assert await closed(reader)
    writer.close()


async def test_a_chunked_body_refused_then_bad_bytes_closes_the_connection(
    running: Running,
) -> None:
    reader, writer = await running.connect()
    writer.write(
        b"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"80\r\n" + b"a" * 128 + b"\r\nzz\r\n"
    )
    assert (await read_answer(reader))[0] == 413
    assert await closed(reader)  # the parser is stuck: nothing more of that body will come
    writer.close()


async def test_no_100_continue_ahead_of_an_answer_owed(running: Running) -> None:
    running.echo.gate = asyncio.Event()
    reader, writer = await running.connect()
    writer.write(
        post(b"/first", b"x")
        + b"POST /e HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"
    )
    await asyncio.wait_for(running.echo.entered.wait(), 10)
    writer.write(b"ok")
    running.echo.gate.set()
    status, _, body = await read_answer(reader)  # the first answer, not a 100
    assert status == 200 and json.loads(body)["path"] == "/first"
    status, _, body = await read_answer(reader)
    assert status == 200 and json.loads(body)["body"] == "ok"
    writer.close()


async def test_a_request_the_server_holds_back_is_not_timed_out() -> None:
    echo = Echo(gate=asyncio.Event())
    server = HttpServer(echo, max_body=100, read_timeout_s=0.2)
    _, port = await server.listen_tcp("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    third = post(b"/3", b"abc")
    writer.write(post(b"/1", b"x") + post(b"/2", b"y") + third[:5])
    await asyncio.wait_for(echo.entered.wait(), 10)
    writer.write(third[5:])  # the client sent it all; the server holds it behind /1 and /2
    await asyncio.sleep(0.5)  # longer than the read timeout, while the server holds /3 back
    echo.gate.set()  # type: ignore[union-attr]
    statuses = [(await read_answer(reader))[0] for _ in range(3)]
    assert statuses == [200, 200, 200]
    writer.close()
    await server.close(1.0)


async def test_one_header_without_end_is_refused_at_the_cap(running: Running) -> None:
    reader, writer = await running.connect()
    writer.write(b"GET / HTTP/1.1\r\nX-Big: ")
    with contextlib.suppress(ConnectionError):  # the refusal may come while this is sent
        for _ in range(16):
            writer.write(b"a" * (MAX_HEAD_BYTES // 2))
            await writer.drain()
    status, _, body = await read_answer(reader)  # before the header ever ends
    assert status == 413 and "request head" in json.loads(body)["error"]["message"]
    assert await closed(reader)
    writer.close()


async def test_an_absolute_form_target_is_routed_by_its_path(running: Running) -> None:
    reader, writer = await running.connect()
    writer.write(b"GET http://worker/health?x=1 HTTP/1.1\r\nHost: worker\r\n\r\n")
    _, _, body = await read_answer(reader)
    assert json.loads(body)["path"] == "/health" and json.loads(body)["query"] == "x=1"
    writer.close()


async def test_a_handler_cancelled_from_inside_closes_its_connection() -> None:
    async def cancelled(request: Request) -> Response:
        raise asyncio.CancelledError

    server = HttpServer(cancelled, max_body=100, read_timeout_s=5)
    _, port = await server.listen_tcp("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post(b"/c", b"x"))
    assert await closed(reader)
    await asyncio.wait_for(server.close(30), 5)  # nothing left to wait for
    writer.close()


async def test_a_handler_that_raises_answers_500_and_the_connection_serves_on(
    running: Running,
) -> None:
    reader, writer = await running.connect()
    writer.write(post(b"/boom", b""))
    status, _, body = await read_answer(reader)
    assert status == 500 and json.loads(body)["error"]["code"] == "internal_error"
    writer.write(post(b"/after", b""))
    assert (await read_answer(reader))[0] == 200
    writer.close()


async def test_a_client_gone_mid_request_leaves_the_server_serving(running: Running) -> None:
    running.echo.gate = asyncio.Event()
    _, gone = await running.connect()
    gone.write(post(b"/slow", b"x"))
    await asyncio.wait_for(running.echo.entered.wait(), 10)
    gone.close()
    running.echo.gate.set()
    reader, writer = await running.connect()
    writer.write(post(b"/next", b"x"))
    assert (await read_answer(reader))[0] == 200
    writer.close()


@dataclass
class InHand:
    """A server whose handler holds one request (``echo.gate`` closed) on ``busy``."""

    server: HttpServer
    echo: Echo
    port: int
    reader: asyncio.StreamReader
    busy: asyncio.StreamWriter
    gate: asyncio.Event


async def one_request_in_hand() -> InHand:
    gate = asyncio.Event()
    echo = Echo(gate=gate)
    server = HttpServer(echo, max_body=100, read_timeout_s=5)
    _, port = await server.listen_tcp("127.0.0.1", 0)
    reader, busy = await asyncio.open_connection("127.0.0.1", port)
    busy.write(post(b"/in-hand", b"x"))
    await asyncio.wait_for(echo.entered.wait(), 10)
    return InHand(server, echo, port, reader, busy, gate)


async def test_close_answers_what_is_in_hand_and_closes_idle_connections() -> None:
    held = await one_request_in_hand()
    idle_reader, idle = await asyncio.open_connection("127.0.0.1", held.port)
    await asyncio.wait_for(_until(lambda: len(held.server.connections) == 2), 10)
    closing = asyncio.ensure_future(held.server.close(10))
    assert await closed(idle_reader)
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", held.port)
    held.gate.set()
    status, headers, _ = await read_answer(held.reader)
    assert status == 200 and headers["connection"] == "close"
    await asyncio.wait_for(closing, 10)
    assert held.server.connections == set()
    idle.close()
    held.busy.close()


async def test_close_cuts_connections_still_busy_after_the_grace() -> None:
    held = await one_request_in_hand()
    await asyncio.wait_for(held.server.close(0.2), 10)
    assert held.server.connections == set()
    assert await asyncio.wait_for(held.reader.read(), 10) == b""
    held.busy.close()
    held.gate.set()


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.01)


async def test_an_idle_connection_is_closed_and_a_busy_one_is_not() -> None:
    echo = Echo(gate=asyncio.Event())
    server = HttpServer(echo, max_body=100, read_timeout_s=5, idle_timeout_s=0.2)
    _, port = await server.listen_tcp("127.0.0.1", 0)
    idle_reader, idle = await asyncio.open_connection("127.0.0.1", port)
    busy_reader, busy = await asyncio.open_connection("127.0.0.1", port)
    busy.write(post(b"/held", b"x"))
    assert await closed(idle_reader)  # no request within 0.2 s
    assert busy_reader.at_eof() is False and len(server.connections) == 1  # in hand: kept
    echo.gate.set()  # type: ignore[union-attr]
    assert (await read_answer(busy_reader))[0] == 200
    assert await closed(busy_reader)  # then idle, and closed in turn
    idle.close()
    busy.close()
    await server.close(1.0)


async def test_a_streamed_answer_goes_out_chunk_by_chunk_and_the_connection_serves_on() -> None:
    step = asyncio.Event()

    async def handler(request: Request) -> Response | StreamResponse:
        if request.path != "/stream":
            return Response(b"{}")
        out = StreamResponse(200, "text/event-stream", {"X-Kind": "sse"})
        await out.prepare(request)
        await out.write(b"data: 1\n\n")
        await step.wait()  # the first chunk is out before the handler goes on
        await out.write(b"data: 2\n\n")
        if request.query != "open":
            await out.write_eof()
        return out  # "open": left for the server to end

    server = HttpServer(handler, max_body=100, read_timeout_s=5)
    _, port = await server.listen_tcp("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for query in (b"", b"?open"):
        step.clear()
        writer.write(b"GET /stream%s HTTP/1.1\r\nHost: t\r\n\r\n" % query)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert b"Transfer-Encoding: chunked" in head and b"X-Kind: sse" in head
        first = b"9\r\ndata: 1\n\n\r\n"
        assert await asyncio.wait_for(reader.readexactly(len(first)), 10) == first
        step.set()
        rest = b"9\r\ndata: 2\n\n\r\n0\r\n\r\n"
        assert await asyncio.wait_for(reader.readexactly(len(rest)), 10) == rest
    writer.write(post(b"/after", b""))
    assert (await read_answer(reader))[0] == 200
    writer.close()
    await server.close(1.0)


async def test_cancel_on_disconnect_cancels_the_handler_and_writes_then_fail() -> None:
    entered = asyncio.Event()
    outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def handler(request: Request) -> Response | StreamResponse:
        out = StreamResponse()
        await out.prepare(request)
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            outcome.set_result("cancelled")
            raise
        return out

    server = HttpServer(handler, max_body=100, read_timeout_s=5, cancel_on_disconnect=True)
    _, port = await server.listen_tcp("127.0.0.1", 0)
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post(b"/hang", b""))
    await asyncio.wait_for(entered.wait(), 10)
    writer.close()
    assert await asyncio.wait_for(outcome, 10) == "cancelled"
    await asyncio.wait_for(server.close(30), 5)


async def test_a_stream_written_after_its_client_left_raises() -> None:
    entered, left = asyncio.Event(), asyncio.Event()
    raised: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    async def handler(request: Request) -> Response | StreamResponse:
        out = StreamResponse()
        await out.prepare(request)
        entered.set()
        await left.wait()
        try:
            for _ in range(100):  # the first writes may still reach the socket's buffer
                await out.write(b"x" * 65536)
        except ConnectionError as exc:
            raised.set_result(exc)
        return out

    server = HttpServer(handler, max_body=100, read_timeout_s=5)
    _, port = await server.listen_tcp("127.0.0.1", 0)
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post(b"/s", b""))
    await asyncio.wait_for(entered.wait(), 10)
    writer.close()
    await asyncio.wait_for(_until(lambda: not server.connections), 10)
    left.set()
    assert isinstance(await asyncio.wait_for(raised, 10), ConnectionResetError)
    await server.close(1.0)


async def test_headers_go_out_as_utf8_and_a_line_break_in_one_is_refused() -> None:
    async def handler(request: Request) -> Response:
        value = "数学" if request.path == "/utf8" else "a\r\nX-Injected: 1"
        return Response(b"{}", headers={"X-Decision": value})

    server = HttpServer(handler, max_body=100, read_timeout_s=5)
    _, port = await server.listen_tcp("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post(b"/utf8", b""))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert "X-Decision: 数学".encode() in head
    await reader.readexactly(2)
    writer.write(post(b"/crlf", b""))
    status, headers, _ = await read_answer(reader)
    assert status == 500 and "x-injected" not in headers
    assert await closed(reader)
    writer.close()
    await server.close(1.0)


async def test_a_stream_whose_handler_fails_is_cut_not_answered_twice() -> None:
    async def handler(request: Request) -> Response | StreamResponse:
        out = StreamResponse()
        await out.prepare(request)
        await out.write(b"partial")
        raise RuntimeError("broke mid-stream")

    server = HttpServer(handler, max_body=100, read_timeout_s=5)
    _, port = await server.listen_tcp("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post(b"/s", b""))
    received = b""
    with contextlib.suppress(ConnectionError):
        while chunk := await asyncio.wait_for(reader.read(4096), 10):
            received += chunk
    assert b"partial" in received and b"500" not in received and b"0\r\n\r\n" not in received
    writer.close()
    await server.close(1.0)


def test_the_server_runs_on_uvloop_too() -> None:
    """The frontend serves on uvloop, whose transports are not asyncio's classes."""
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> list[int]:
        echo = Echo()
        server = HttpServer(echo, max_body=100, read_timeout_s=5, cancel_on_disconnect=True)
        _, port = await server.listen_tcp("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post(b"/a", b"x") + post(b"/b", b"y"))  # pipelined, kept alive
        statuses = [(await read_answer(reader))[0] for _ in range(2)]
        writer.write(b"POST /big HTTP/1.1\r\nHost: t\r\nContent-Length: 500\r\n\r\n")
        statuses.append((await read_answer(reader))[0])
        writer.close()
        await server.close(1.0)
        return statuses

    assert uvloop.run(scenario()) == [200, 200, 413]


def test_bad_settings_are_refused() -> None:
    async def handler(request: Request) -> Response:
        return Response()

    with pytest.raises(ValueError, match="max_body"):
        HttpServer(handler, max_body=-1, read_timeout_s=1)
    with pytest.raises(ValueError, match="read_timeout_s"):
        HttpServer(handler, max_body=1, read_timeout_s=0)
    with pytest.raises(ValueError, match="idle_timeout_s"):
        HttpServer(handler, max_body=1, read_timeout_s=1, idle_timeout_s=0)


def test_errors_render_as_the_project_s_json() -> None:
    from vllm_sr.httpserver import error_response, render

    wire = render(error_response(VllmSrError("x")), head_only=False, close=True)
    head, _, body = wire.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 500 Internal Server Error")
    assert b"Connection: close" in head and b"Content-Length: %d" % len(body) in head
    assert json.loads(body)["error"]["code"] == "internal_error"
