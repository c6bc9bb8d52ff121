"""WorkerClient against scripted servers on real sockets that write exact bytes: chunked
answers with trailers on a kept-alive connection, interim answers, bodies ended by the stream,
bytes beyond the answer, and how each kind of broken connection is classified (before or after
the first byte of an answer)."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import struct
from collections.abc import AsyncIterator

import pytest

from tests.support.scripted_http import OK, Reply, sends
from tests.support.scripted_http import ScriptedServer as Scripted
from tests.support.workers import short_socket_dir
from vllm_sr.errors import DeadlineExceeded, WorkerFailed
from vllm_sr.pool import connection as connection_module
from vllm_sr.pool.client import MAX_HEADER_BYTES, WorkerClient


async def reset(writer: asyncio.StreamWriter) -> bool:
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
    return False


async def never(writer: asyncio.StreamWriter) -> bool:
    await asyncio.sleep(30)
    return False


@pytest.fixture
async def scripted() -> AsyncIterator[Scripted]:
    srv = Scripted(replies={"/ok": sends(OK)})
    srv.path = str(short_socket_dir(prefix="vsr-w-") / "w.sock")
    server = await asyncio.start_unix_server(srv.handle, srv.path)
    yield srv
    server.close()


async def _failure(client: WorkerClient, path: str) -> WorkerFailed:
    with pytest.raises(WorkerFailed) as info:
        await client.post(path, b"{}", timeout_s=5)
    return info.value


async def test_chunked_with_trailers_leaves_the_kept_alive_connection_clean(
    scripted: Scripted,
) -> None:
    scripted.replies["/trailers"] = sends(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n"
        b"Trailer: X-Checksum, X-Other\r\n\r\n"
        b'4\r\n{"a"\r\n3;ext=1\r\n:1}\r\n0\r\nX-Checksum: abc\r\nX-Other: 2\r\n\r\n'
    )
    client = WorkerClient(uds=scripted.path, replica_id="r0")
    try:
        first = await client.post("/trailers", b"{}", timeout_s=5)
        assert first.status == 200 and first.json() == {"a": 1} and first.headers == {}
        second = await client.post("/ok", b"{}", timeout_s=5)
        third = await client.post("/trailers", b"{}", timeout_s=5)
        assert second.body == b"{}" and third.json() == {"a": 1}
        assert scripted.connections == 1  # one connection carried all three
    finally:
        await client.close()


async def test_interim_answer_is_skipped(scripted: Scripted) -> None:
    scripted.replies["/continue"] = sends(b"HTTP/1.1 100 Continue\r\n\r\n" + OK)
    client = WorkerClient(uds=scripted.path)
    try:
        resp = await client.post("/continue", b"{}", timeout_s=5)
        assert resp.status == 200 and resp.body == b"{}"
        assert (await client.post("/ok", b"{}", timeout_s=5)).body == b"{}"
        assert scripted.connections == 1
    finally:
        await client.close()


async def test_body_ended_by_the_stream_is_read_and_the_connection_not_kept(
    scripted: Scripted,
) -> None:
    scripted.replies["/eof"] = sends(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nall of it",
        keep=False,
    )
    client = WorkerClient(uds=scripted.path)
    try:
        resp = await client.post("/eof", b"{}", timeout_s=5)
        assert (resp.body, resp.content_type) == (b"all of it", "text/plain")
        assert client._idle == []
    finally:
        await client.close()


async def test_connection_close_answer_is_not_reused(scripted: Scripted) -> None:
    scripted.replies["/close"] = sends(
        b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}",
        keep=False,
    )
    client = WorkerClient(uds=scripted.path)
    try:
        assert (await client.post("/close", b"{}", timeout_s=5)).status == 503
        assert client._idle == []
        assert (await client.post("/ok", b"{}", timeout_s=5)).status == 200
        assert scripted.connections == 2
    finally:
        await client.close()


async def test_bytes_beyond_the_answer_drop_the_connection(scripted: Scripted) -> None:
    scripted.replies["/extra"] = sends(OK + b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    client = WorkerClient(uds=scripted.path)
    try:
        assert (await client.post("/extra", b"{}", timeout_s=5)).body == b"{}"
        assert (await client.post("/ok", b"{}", timeout_s=5)).body == b"{}"
        assert scripted.connections == 2  # the corrupt stream was not reused
    finally:
        await client.close()


async def test_reset_before_answer_is_before_answer(scripted: Scripted) -> None:
    scripted.replies["/reset"] = reset
    client = WorkerClient(uds=scripted.path, replica_id="r2")
    exc = await _failure(client, "/reset")
    assert exc.details == {"replica": "r2", "before_answer": True}


async def test_closed_before_answer_is_before_answer(scripted: Scripted) -> None:
    scripted.replies["/quiet"] = sends(b"", keep=False)
    exc = await _failure(WorkerClient(uds=scripted.path), "/quiet")
    assert exc.details["before_answer"] is True


async def test_closed_mid_answer_is_after_answer(scripted: Scripted) -> None:
    scripted.replies["/half"] = sends(
        b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"emb', keep=False
    )
    client = WorkerClient(uds=scripted.path)
    exc = await _failure(client, "/half")
    assert exc.details["before_answer"] is False and client._idle == []


async def test_reset_mid_chunked_answer_is_after_answer(scripted: Scripted) -> None:
    async def half_then_reset(writer: asyncio.StreamWriter) -> bool:
        writer.write(b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{"a"\r\n')
        await writer.drain()
        return await reset(writer)

    scripted.replies["/halfreset"] = half_then_reset
    exc = await _failure(WorkerClient(uds=scripted.path), "/halfreset")
    assert exc.details["before_answer"] is False


async def test_garbage_is_worker_failed(scripted: Scripted) -> None:
    scripted.replies["/garbage"] = sends(b"SSH-2.0-OpenSSH_9.6\r\n\r\n", keep=False)
    exc = await _failure(WorkerClient(uds=scripted.path), "/garbage")
    assert "not an HTTP/1.x answer" in exc.message and exc.details["before_answer"] is False


@pytest.mark.parametrize("end", [b"", b"Content-Length: 2\r\n\r\n{}"])
async def test_oversized_head_is_worker_failed(scripted: Scripted, end: bytes) -> None:
    big = b"X-Pad: " + b"a" * (MAX_HEADER_BYTES + 10) + b"\r\n"
    scripted.replies["/bighead"] = sends(b"HTTP/1.1 200 OK\r\n" + big + end, keep=False)
    exc = await _failure(WorkerClient(uds=scripted.path), "/bighead")
    assert "head over" in exc.message


async def test_oversized_body_is_worker_failed(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection_module, "MAX_RESPONSE_BYTES", 8)
    scripted.replies["/big"] = sends(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n123456789")
    client = WorkerClient(uds=scripted.path)
    exc = await _failure(client, "/big")
    assert "over 8 bytes" in exc.message and client._idle == []


async def test_refused_tcp_is_before_answer() -> None:
    with socket.socket() as probe:  # a port nobody listens on: bound, never listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        client = WorkerClient(base_url=f"http://127.0.0.1:{port}", replica_id="tcp")
        exc = await _failure(client, "/x")
    assert exc.details["before_answer"] is True and "ConnectionRefusedError" in exc.message


async def test_missing_socket_is_before_answer() -> None:
    exc = await _failure(WorkerClient(uds="/tmp/vsr-no-such-worker.sock"), "/x")
    assert exc.details["before_answer"] is True


async def test_deadline_on_a_silent_worker_drops_the_connection(scripted: Scripted) -> None:
    scripted.replies["/never"] = never
    client = WorkerClient(uds=scripted.path, replica_id="slow")
    await client.post("/ok", b"{}", timeout_s=5)
    with pytest.raises(DeadlineExceeded, match="slow"):
        await client.post("/never", b"{}", timeout_s=0.2)
    assert client._idle == []
    assert (await client.post("/ok", b"{}", timeout_s=5)).status == 200
    assert scripted.connections == 2
    await client.close()


async def test_host_header_and_prefix_come_from_the_base_url() -> None:
    heads: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        await reader.readexactly(2)
        writer.write(OK)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = WorkerClient(base_url=f"http://127.0.0.1:{port}/v1/", replica_id="p")
    try:
        await client.post("/embeddings", b"{}", timeout_s=5)
    finally:
        await client.close()
        server.close()
    first_lines = heads[0].split(b"\r\n")[:2]
    assert first_lines == [b"POST /v1/embeddings HTTP/1.1", f"Host: 127.0.0.1:{port}".encode()]


def slow_ok(delay_s: float) -> Reply:
    async def reply(writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(delay_s)
        writer.write(OK)
        await writer.drain()
        return True

    return reply


async def test_out_of_descriptors_a_request_waits_for_a_connection_in_use(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EMFILE on connect is this process's shortage, not the worker's: with an exchange under
    way, the next request waits for its connection instead of failing (issue 25)."""
    scripted.replies["/slow"] = slow_ok(0.3)
    client = WorkerClient(uds=scripted.path, replica_id="r0")
    loop = asyncio.get_running_loop()
    real = loop.create_unix_connection
    starved = {"on": False}

    async def connect(*args: object, **kwargs: object) -> object:
        if starved["on"]:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(loop, "create_unix_connection", connect)
    try:
        first = asyncio.ensure_future(client.post("/slow", b"{}", timeout_s=5))
        while scripted.requests != ["/slow"]:
            await asyncio.sleep(0.01)
        starved["on"] = True
        second = await client.post("/ok", b"{}", timeout_s=5)  # today's main: WorkerFailed
        assert second.status == 200 and (await first).status == 200
        assert scripted.connections == 1  # the second went over the first's connection
        # Nothing under way to wait for: the shortage is answered at once, before any answer.
        await client.close()  # its idle connection goes
        failure = await _failure(client, "/ok")
        assert failure.details["before_answer"] is True and "Errno 24" in failure.message
    finally:
        await client.close()
