"""Every endpoint form the grammar accepts, served for real: ``https://`` against an aiohttp
server with a self-signed certificate made here (``openssl``), ``unix:`` against an aiohttp
server on a Unix socket, and a worker process killed in the middle of its answer."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from tests.support.workers import short_socket_dir
from vllm_sr.endpoint import InvalidEndpoint
from vllm_sr.errors import WorkerFailed
from vllm_sr.pool.client import CA_FILE_ENV, WorkerClient

BODY = b'{"model":"m","input":"hello"}'


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    d = tmp_path_factory.mktemp("tls")
    key, crt = d / "key.pem", d / "cert.pem"
    args = ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    args += [
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(crt),
        "-days",
        "1",
        "-subj",
        "/CN=localhost",
    ]
    args += ["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"]
    subprocess.run(
        ["openssl", *args],
        check=True,
        capture_output=True,
    )
    return crt, key


def _app(peers: list[object]) -> web.Application:
    async def echo(request: web.Request) -> web.Response:
        peers.append(request.transport)
        return web.Response(body=await request.read(), content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ready"})

    app = web.Application()
    app.router.add_post("/v1/embeddings", echo)
    app.router.add_post("/embeddings", echo)
    app.router.add_get("/health", health)
    return app


@pytest.fixture
async def tls_server(cert: tuple[Path, Path]) -> AsyncIterator[tuple[int, list[object]]]:
    import ssl

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert[0], cert[1])
    peers: list[object] = []
    runner = web.AppRunner(_app(peers), shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = runner.addresses[0][1]
    yield port, peers
    await runner.cleanup()


@pytest.fixture
async def unix_server() -> AsyncIterator[tuple[str, list[object]]]:
    peers: list[object] = []
    runner = web.AppRunner(_app(peers), shutdown_timeout=0.1)
    await runner.setup()
    path = str(short_socket_dir(prefix="vsr-ep-") / "rt.sock")
    await web.UnixSite(runner, path).start()
    yield path, peers
    await runner.cleanup()


async def test_https_endpoint_serves_and_keeps_its_connection(
    tls_server: tuple[int, list[object]], cert: tuple[Path, Path]
) -> None:
    port, peers = tls_server
    client = WorkerClient.from_endpoint(f"https://localhost:{port}/v1/", "a0", ca_file=str(cert[0]))
    try:
        first = await client.post("/embeddings", BODY, timeout_s=5)
        second = await client.post("/embeddings", b"{}", timeout_s=5)
        assert (first.status, first.body, second.body) == (200, BODY, b"{}")
        assert len(peers) == 2 and peers[0] is peers[1]  # one TLS connection, kept alive
        assert len(client._idle) == 1
    finally:
        await client.close()


async def test_https_ca_file_from_the_environment(
    tls_server: tuple[int, list[object]], cert: tuple[Path, Path]
) -> None:
    port, _ = tls_server
    env = {CA_FILE_ENV: str(cert[0])}
    client = WorkerClient.from_endpoint(f"https://127.0.0.1:{port}", "a1", env=env)
    try:
        assert await client.health() == (200, {"status": "ready"})
    finally:
        await client.close()


async def test_https_unknown_certificate_is_refused_before_answer(
    tls_server: tuple[int, list[object]],
) -> None:
    port, peers = tls_server
    client = WorkerClient.from_endpoint(f"https://localhost:{port}", "a2", env={})
    with pytest.raises(WorkerFailed) as info:
        await client.post("/embeddings", BODY, timeout_s=5)
    assert "CERTIFICATE_VERIFY_FAILED" in info.value.message
    assert info.value.details["before_answer"] is True and peers == []


def test_missing_ca_file_is_an_invalid_endpoint(tmp_path: Path) -> None:
    with pytest.raises(InvalidEndpoint, match="CA file"):
        WorkerClient.from_endpoint("https://h:1", "a3", ca_file=str(tmp_path / "none.pem"))


@pytest.mark.parametrize("form", ["unix:{}", "unix://{}"])
async def test_unix_endpoint_forms_serve(unix_server: tuple[str, list[object]], form: str) -> None:
    path, peers = unix_server
    client = WorkerClient.from_endpoint(form.format(path), "u0")
    try:
        assert (await client.post("/embeddings", BODY, timeout_s=5)).body == BODY
        assert (await client.post("/embeddings", BODY, timeout_s=5)).body == BODY
        assert peers[0] is peers[1]
    finally:
        await client.close()


def test_an_endpoint_outside_the_grammar_is_refused_by_name() -> None:
    with pytest.raises(InvalidEndpoint, match=r"'unix://host/x\.sock'.*names a host"):
        WorkerClient.from_endpoint("unix://host/x.sock", "u1")


# A worker that answers the first request with half a body, says so, and waits to be killed.
HALF_ANSWER = r"""
import socket, sys, time
srv = socket.socket(socket.AF_UNIX)
srv.bind(sys.argv[1]); srv.listen()
print("listening", flush=True)
conn, _ = srv.accept()
conn.recv(65536)
conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"{" + b" " * 100)
print("sent", flush=True)
time.sleep(60)
"""


async def test_worker_killed_mid_answer_then_refusing(tmp_path: Path) -> None:
    sock = str(short_socket_dir(prefix="vsr-k-") / "w.sock")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HALF_ANSWER, sock, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    try:
        assert await asyncio.wait_for(proc.stdout.readline(), 20) == b"listening\n"
        client = WorkerClient.from_endpoint(f"unix:{sock}", "k0")
        call = asyncio.create_task(client.post("/embeddings", BODY, timeout_s=20))
        assert await asyncio.wait_for(proc.stdout.readline(), 20) == b"sent\n"
        proc.send_signal(signal.SIGKILL)
        with pytest.raises(WorkerFailed) as info:
            await call
        assert info.value.details["before_answer"] is False and client._idle == []
        await proc.wait()
        # The socket file is left behind with nobody listening: refused, before any answer.
        with pytest.raises(WorkerFailed) as again:
            await client.post("/embeddings", BODY, timeout_s=5)
        assert again.value.details["before_answer"] is True
        assert "ConnectionRefusedError" in again.value.message
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
