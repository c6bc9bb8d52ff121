"""What the control socket needs of the one server (issue 27): the peer's credentials on a real
Unix socket (none over TCP), a socket bound by the caller, a stream to an HTTP/1.0 client
framed by the close, and routes with ``{name}`` segments."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.workers import short_socket_dir
from tests.unit.test_httpserver import read_answer
from vllm_sr import errors
from vllm_sr.httpserver import (
    HttpServer,
    PathRoutes,
    PeerCredentials,
    Request,
    Response,
    StreamResponse,
    peer_credentials,
)


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    d = short_socket_dir(prefix="vsr-hs-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def who(request: Request) -> Response:
    peer = request.peer
    if peer is None:
        return Response(b"null")
    body = {"pid": peer.pid, "uid": peer.uid, "gid": peer.gid, "groups": sorted(peer.groups())}
    return Response(json.dumps(body).encode())


def get(path: bytes, version: bytes = b"1.1") -> bytes:
    return b"GET %s HTTP/%s\r\nHost: t\r\n\r\n" % (path, version)


async def test_a_unix_peer_is_who_the_kernel_says_connected(sock_dir: Path) -> None:
    server = HttpServer(who, max_body=100, read_timeout_s=5)
    await server.listen_unix(str(sock_dir / "s.sock"))
    reader, writer = await asyncio.open_unix_connection(str(sock_dir / "s.sock"))
    writer.write(get(b"/"))
    status, _, body = await read_answer(reader)
    writer.close()
    await server.close(1.0)
    peer = json.loads(body)
    assert status == 200
    assert (peer["pid"], peer["uid"], peer["gid"]) == (os.getpid(), os.geteuid(), os.getegid())
    assert set(os.getgroups()) | {os.getegid()} <= set(peer["groups"])


async def test_a_tcp_request_has_no_peer() -> None:
    server = HttpServer(who, max_body=100, read_timeout_s=5)
    _, port = await server.listen_tcp("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(get(b"/"))
    assert (await read_answer(reader))[2] == b"null"
    writer.close()
    await server.close(1.0)


def test_peer_credentials_of_a_socketpair() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        peer = peer_credentials(a)
        assert (peer.pid, peer.uid, peer.gid) == (os.getpid(), os.geteuid(), os.getegid())
        assert os.getegid() in peer.groups()
    # A record made without a socket has only its primary group to tell.
    assert PeerCredentials(1, 2, 3).groups() == frozenset({3})


def test_the_peer_is_read_on_uvloop_too(sock_dir: Path) -> None:
    """The service serves the control socket on the frontend's loop: uvloop, whose transport
    hands out a socket of its own kind."""
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> dict[str, int]:
        server = HttpServer(who, max_body=100, read_timeout_s=5)
        await server.listen_unix(str(sock_dir / "u.sock"))
        reader, writer = await asyncio.open_unix_connection(str(sock_dir / "u.sock"))
        writer.write(get(b"/"))
        body = (await read_answer(reader))[2]
        writer.close()
        await server.close(1.0)
        answer: dict[str, int] = json.loads(body)
        return answer

    assert uvloop.run(scenario())["uid"] == os.geteuid()


async def test_listen_on_a_socket_bound_by_the_caller(sock_dir: Path) -> None:
    path = sock_dir / "b.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(8)
    sock.setblocking(False)
    server = HttpServer(who, max_body=100, read_timeout_s=5)
    await server.listen_unix(sock=sock, backlog=8)
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(get(b"/"))
    assert json.loads((await read_answer(reader))[2])["uid"] == os.geteuid()
    writer.close()
    await server.close(1.0)


async def lines(request: Request) -> StreamResponse:
    out = StreamResponse(200, "application/x-ndjson")
    await out.prepare(request)
    for i in range(3):
        await out.write(b'{"n": %d}\n' % i)
    return out  # left open: the server ends it


async def test_a_stream_to_http_1_0_is_raw_lines_ended_by_the_close(sock_dir: Path) -> None:
    server = HttpServer(lines, max_body=100, read_timeout_s=5)
    await server.listen_unix(str(sock_dir / "s.sock"))
    reader, writer = await asyncio.open_unix_connection(str(sock_dir / "s.sock"))
    writer.write(get(b"/", b"1.0"))
    raw = await asyncio.wait_for(reader.read(), 10)  # EOF: the close ends the body
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"Connection: close" in head and b"Transfer-Encoding" not in head
    assert [json.loads(line) for line in body.splitlines()] == [{"n": 0}, {"n": 1}, {"n": 2}]
    writer.close()
    # HTTP/1.1 on the same server: chunked, and the connection stays open after the end.
    reader, writer = await asyncio.open_unix_connection(str(sock_dir / "s.sock"))
    writer.write(get(b"/") * 2)
    for _ in range(2):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert b"Transfer-Encoding: chunked" in head
        await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 10)
    writer.close()
    await server.close(1.0)


ROUTES = PathRoutes(
    {
        "/v1/health": {"GET": "health"},
        "/v1/replicas/{id}/drain": {"POST": "drain"},
        "/v1/deployments/{name}/scale": {"POST": "scale"},
    }
)


def req(method: str, path: str) -> Request:
    return Request(method, path, "", {}, b"")


def test_path_routes_match_fixed_paths_and_named_segments() -> None:
    assert ROUTES.resolve(req("GET", "/v1/health")) == ("health", {})
    assert ROUTES.resolve(req("HEAD", "/v1/health")) == ("health", {})
    assert ROUTES.resolve(req("POST", "/v1/replicas/primary-0/drain")) == (
        "drain",
        {"id": "primary-0"},
    )
    # Percent-decoded, one segment each: a quoted "/" does not split an id.
    assert ROUTES.resolve(req("POST", "/v1/deployments/a%2Fb%20c/scale")) == (
        "scale",
        {"name": "a/b c"},
    )


@pytest.mark.parametrize(
    "path", ["/v1/replicas//drain", "/v1/replicas/a/b/drain", "/v1/replicas/a", "/v1/nope"]
)
def test_path_routes_refuse_unknown_paths(path: str) -> None:
    with pytest.raises(errors.NotFound, match="no such path"):
        ROUTES.resolve(req("POST", path))


def test_path_routes_name_the_methods_allowed() -> None:
    with pytest.raises(errors.MethodNotAllowed) as info:
        ROUTES.resolve(req("GET", "/v1/replicas/primary-0/drain"))
    assert info.value.details["allowed"] == ["POST"]
