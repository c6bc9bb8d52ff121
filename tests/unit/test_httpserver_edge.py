"""The public edge refuses what it cannot frame and bounds its connections (issue 25 part 5):
any transfer coding but exactly ``chunked`` is refused 501 with the connection closed, and a
connection past ``max_connections`` is answered 503 and closed while the ones held are served.
Real sockets, raw bytes."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from tests.unit.test_httpserver import Echo, Running, read_answer
from tests.unit.test_httpserver import running as running  # the fixture
from vllm_sr.httpserver import HttpServer

CHUNKED_BODY = b"2\r\nab\r\n0\r\n\r\n"


def chunked_post(coding: bytes) -> bytes:
    return b"POST /te HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: %s\r\n\r\n%s" % (
        coding,
        CHUNKED_BODY,
    )


@pytest.mark.parametrize(
    "coding",
    [b"identity, chunked", b"gzip, chunked", b"identity", b"gzip", b"chunked;x=1"],
)
async def test_a_transfer_coding_other_than_chunked_is_refused_501(
    running: Running, coding: bytes
) -> None:
    reader, writer = await running.connect()
    writer.write(chunked_post(coding))
    status, headers, body = await read_answer(reader)
    assert status == 501, body
    error = json.loads(body)["error"]
    assert error["code"] == "not_implemented" and coding.decode() in error["message"]
    assert headers["connection"] == "close"
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed: nothing else is read
    assert running.echo.seen == []  # never reached the handler
    writer.close()


@pytest.mark.parametrize("coding", [b"chunked", b"Chunked"])
async def test_exactly_chunked_is_served(running: Running, coding: bytes) -> None:
    reader, writer = await running.connect()
    writer.write(chunked_post(coding))
    status, _, body = await read_answer(reader)
    assert status == 200 and json.loads(body)["body"] == "ab"
    writer.close()


async def test_a_connection_flood_past_the_cap_is_answered_503_and_the_held_ones_serve() -> None:
    echo = Echo()
    server = HttpServer(echo, max_body=100, read_timeout_s=5.0, max_connections=20)
    _, port = await server.listen_tcp("127.0.0.1", 0)
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for _ in range(20):  # idle connections up to the cap
            held.append(await asyncio.open_connection("127.0.0.1", port))
        while len(server.connections) < 20:
            await asyncio.sleep(0.01)
        flood = [await asyncio.open_connection("127.0.0.1", port) for _ in range(200)]
        for reader, writer in flood:
            status, headers, body = await read_answer(reader)
            assert status == 503 and headers["retry-after"] == "1"
            assert json.loads(body)["error"]["code"] == "unavailable"
            assert await asyncio.wait_for(reader.read(), 5) == b""  # and closed
            writer.close()
        assert server.turned_away == 200 and len(server.connections) == 20
        # A connection it holds is served as usual.
        reader, writer = held[0]
        writer.write(b"GET /ok HTTP/1.1\r\nHost: t\r\n\r\n")
        status, _, _ = await read_answer(reader)
        assert status == 200
        # One held connection closes: a new one is taken again.
        held.pop()[1].close()
        while len(server.connections) > 19:
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        held.append((reader, writer))
        writer.write(b"GET /again HTTP/1.1\r\nHost: t\r\n\r\n")
        status, _, _ = await read_answer(reader)
        assert status == 200
    finally:
        for _, writer in held:
            writer.close()
        with contextlib.suppress(Exception):
            await server.close(1.0)


def test_the_cap_must_be_at_least_one() -> None:
    with pytest.raises(ValueError, match="max_connections: 0"):
        HttpServer(Echo(), max_body=1, read_timeout_s=1.0, max_connections=0)


@pytest.mark.parametrize(
    "request_bytes",
    [
        # CL and TE together
        b"POST /s HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
        + CHUNKED_BODY,
        # two Content-Lengths that differ
        b"POST /s HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nContent-Length: 4\r\n\r\nabcd",
        # a chunk size that is not hex
        b"POST /s HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
        # obs-fold: a header continued on the next line
        b"POST /s HTTP/1.1\r\nHost: t\r\nX-Thing: a\r\n  b\r\nContent-Length: 2\r\n\r\nab",
    ],
    ids=["cl-and-te", "duplicate-cl", "bad-chunk-size", "obs-fold"],
)
async def test_smuggling_vectors_are_refused_400(running: Running, request_bytes: bytes) -> None:
    reader, writer = await running.connect()
    writer.write(request_bytes)
    status, headers, _ = await read_answer(reader)
    assert status == 400 and headers["connection"] == "close"
    assert running.echo.seen == []
    writer.close()


def test_the_frontends_connection_cap_is_a_host_setting_with_a_sane_default() -> None:
    from pydantic import ValidationError

    from vllm_sr.config.service import ServiceSettings

    assert ServiceSettings().max_connections == 4096
    assert ServiceSettings(max_connections=100).max_connections == 100
    with pytest.raises(ValidationError, match="max_connections"):
        ServiceSettings(max_connections=0)
