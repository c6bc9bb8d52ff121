"""The control server on a real Unix socket with the fake backend: every endpoint, the socket
file's life (mode, group, stale, live), and hostile requests (malformed, huge, stalled)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import socket
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.support.control_fake import FakeBackend
from tests.support.workers import short_socket_dir
from vllm_sr import errors
from vllm_sr.config.service import ServiceSettings, load_service_settings
from vllm_sr.control.client import AsyncControlClient
from vllm_sr.control.server import ControlServer


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # Short: a Unix socket path must fit in 107 bytes, pytest's tmp_path may not.
    d = short_socket_dir(prefix="vsr-ctl-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend({"primary": ["cpu", "cpu"], "side": ["cuda:0"]})


@pytest.fixture
async def server(backend: FakeBackend, sock_dir: Path) -> AsyncIterator[ControlServer]:
    srv = ControlServer(
        backend,
        sock_dir / "control.sock",
        group=None,
        heartbeat_s=0.2,
        idle_timeout_s=0.3,
        body_timeout_s=0.2,
        write_timeout_s=0.5,
    )
    await srv.start()
    yield srv
    await srv.stop()


@pytest.fixture
async def client(server: ControlServer) -> AsyncIterator[AsyncControlClient]:
    async with AsyncControlClient(server.path, timeout_s=10) as c:
        yield c


async def raw_request(path: Path, data: bytes, timeout: float = 5.0) -> tuple[int, dict]:
    """Send ``data`` as-is, read the whole answer (the server closes after it)."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(data)
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), timeout)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    return status, json.loads(body) if body.strip() else {}


def _replica(inv: dict, rid: str) -> dict:
    return next(r for d in inv["deployments"] for r in d["replicas"] if r["id"] == rid)


# --- the socket file -------------------------------------------------------------------


async def test_socket_is_0660_and_removed_on_stop(server: ControlServer) -> None:
    st = server.path.lstat()
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o660
    assert st.st_gid == os.getegid()  # group=None keeps the process's group
    await server.stop()
    assert not server.path.exists()


async def test_missing_group_keeps_process_group(
    backend: FakeBackend, sock_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    srv = ControlServer(backend, sock_dir / "c.sock", group="no-such-group-vsr")
    async with srv:
        assert srv.path.lstat().st_gid == os.getegid()
    assert "no-such-group-vsr" in caplog.text


async def test_a_missing_group_is_said_once_with_what_to_do(
    backend: FakeBackend, sock_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 39: the warning came once per check (the admin group's, then the socket's at every
    # bind) and said nothing of what to do. Here both settings name the one missing group and
    # the server is started twice.
    srv = ControlServer(
        backend, sock_dir / "c.sock", group="no-such-group-vsr", admin_group="no-such-group-vsr"
    )
    for _ in range(2):
        async with srv:
            assert srv.path.lstat().st_gid == os.getegid()
    said = [r.getMessage() for r in caplog.records if "no-such-group-vsr" in r.getMessage()]
    assert len(said) == 1, said
    (text,) = said
    assert text.startswith("group 'no-such-group-vsr' (control_group, admin_group) does not exist")
    assert f"keeps the service's own group (gid {os.getegid()})" in text
    assert "only root and the service user may change the service" in text
    assert "sudo groupadd --system no-such-group-vsr" in text
    assert "sudo usermod -aG no-such-group-vsr USER" in text
    assert 'control_group = "" keeps the service\'s own group' in text
    # ... and what it says holds: the host settings' control_group = "" is silent
    settings = tmp_path_settings(sock_dir, 'control_group = ""\n')
    caplog.clear()
    async with ControlServer(backend, sock_dir / "d.sock", group=settings.control_group) as quiet:
        assert quiet.path.lstat().st_gid == os.getegid()
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def tmp_path_settings(where: Path, toml: str) -> ServiceSettings:
    path = where / "vllm-sr.toml"
    path.write_text(toml)
    return load_service_settings(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file another group needs root")
async def test_socket_gets_configured_group(backend: FakeBackend, sock_dir: Path) -> None:
    from tests.unit.test_control_auth import ensure_group

    gid = ensure_group("vsrctl-sock")
    async with ControlServer(backend, sock_dir / "c.sock", group="vsrctl-sock") as srv:
        assert srv.path.lstat().st_gid == gid


async def test_stale_socket_is_replaced(backend: FakeBackend, sock_dir: Path) -> None:
    path = sock_dir / "control.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))  # bound, never listening: what a killed process leaves behind
    dead.close()
    old_inode = path.lstat().st_ino
    async with ControlServer(backend, path, group=None) as srv, AsyncControlClient(path) as c:
        assert srv.path.lstat().st_ino != old_inode
        assert (await c.health())["status"] == "ready"


async def test_live_socket_is_refused_with_its_pid(server: ControlServer) -> None:
    second = ControlServer(FakeBackend(), server.path, group=None)
    with pytest.raises(errors.Conflict) as info:
        await second.start()
    assert str(info.value) == f"another vllm-sr is serving on {server.path}, pid {os.getpid()}"
    async with AsyncControlClient(server.path) as c:  # the first one still serves
        assert "deployments" in await c.inventory()


async def test_a_regular_file_is_not_replaced(backend: FakeBackend, sock_dir: Path) -> None:
    path = sock_dir / "control.sock"
    path.write_text("not a socket")
    with pytest.raises(errors.Conflict, match="is not a socket"):
        await ControlServer(backend, path, group=None).start()
    assert path.read_text() == "not a socket"


async def test_stop_leaves_a_successors_socket(backend: FakeBackend, sock_dir: Path) -> None:
    path = sock_dir / "control.sock"
    first = ControlServer(backend, path, group=None)
    await first.start()
    path.unlink()  # e.g. an operator removed it and another instance took the path
    async with ControlServer(FakeBackend(), path, group=None):
        await first.stop()
        assert stat.S_ISSOCK(path.lstat().st_mode)


# --- reads -----------------------------------------------------------------------------


async def test_inventory_health_config(client: AsyncControlClient, backend: FakeBackend) -> None:
    inv = await client.inventory()
    assert [d["name"] for d in inv["deployments"]] == ["primary", "side"]
    assert [r["id"] for r in inv["deployments"][0]["replicas"]] == ["primary-0", "primary-1"]
    assert inv == json.loads(json.dumps(backend.inventory() | {"service": inv["service"]}))
    assert (await client.health())["status"] == "ready"
    backend.fail("side-0", "exit 78: bad artifact")
    health = await client.health()
    assert health["deployments"]["side"] == 0 and health["status"] == "unavailable"
    config = await client.config()
    assert config == backend.effective_config()


async def test_events_since_and_bad_since(
    client: AsyncControlClient, backend: FakeBackend, server: ControlServer
) -> None:
    for i in range(3):
        backend.events.publish("replica_ready", replica=f"primary-{i}")
    answer = await client.events(1)
    assert [e["seq"] for e in answer["events"]] == [2, 3]
    assert answer["last_seq"] == 3 and answer["oldest_seq"] == 1
    assert answer["events"][0]["replica"] == "primary-1"
    status, body = await raw_request(
        server.path, b"GET /v1/events?since=-1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert status == 400 and "since" in body["error"]["message"]


async def test_unknown_path_and_wrong_method_are_json(server: ControlServer) -> None:
    status, body = await raw_request(
        server.path, b"GET /v1/nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert status == 404 and body["error"]["code"] == "not_found"
    status, body = await raw_request(
        server.path, b"GET /v1/reload HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert status == 405 and body["error"]["code"] == "method_not_allowed"


# --- mutations -------------------------------------------------------------------------


async def test_eject_readmit_drain_restart(
    client: AsyncControlClient, backend: FakeBackend
) -> None:
    result = await client.eject("primary-0", 5000)
    assert result["ok"] is True and result["state"] == "ejected"
    replica = _replica(await client.inventory(), "primary-0")
    assert replica["state"] == "ejected" and replica["ejections"] == 1
    assert replica["ejected_until"] == pytest.approx(backend.clock.time() + 5, abs=2)
    assert (await client.readmit("primary-0"))["state"] == "ready"
    assert (await client.drain("primary-1"))["inflight"] == 0
    assert _replica(await client.inventory(), "primary-1")["state"] == "draining"
    old_pid = backend.replica("side-0").pid
    assert (await client.restart("side-0"))["pid"] != old_pid
    kinds = [(c.kind, c.replica, c.duration_ms) for c in backend.commands]
    assert kinds == [
        ("eject", "primary-0", 5000),
        ("readmit", "primary-0", None),
        ("drain", "primary-1", None),
        ("restart", "side-0", None),
    ]
    assert all(c.source == "control" for c in backend.commands)


async def test_eject_without_duration_uses_the_default(
    client: AsyncControlClient, backend: FakeBackend
) -> None:
    await client.eject("primary-1")
    assert backend.commands[-1].duration_ms is None


async def test_scale_and_reload(client: AsyncControlClient, backend: FakeBackend) -> None:
    result = await client.scale("primary", 3)
    assert result["started"] == ["primary-2"]
    inv = await client.inventory()
    assert inv["deployments"][0]["desired_replicas"] == 3
    generation = inv["service"]["generation"]
    assert (await client.reload())["generation"] == generation + 1
    with pytest.raises(errors.NotFound, match="no deployment 'nope'"):
        await client.scale("nope", 1)


async def test_unknown_replica_is_404(client: AsyncControlClient) -> None:
    with pytest.raises(errors.NotFound, match="no replica 'primary-9'"):
        await client.drain("primary-9")


async def test_backend_refusal_comes_back_typed(
    client: AsyncControlClient, backend: FakeBackend
) -> None:
    backend.refuse = errors.PlacementError("scale primary to 9: only 2 GPUs free")
    with pytest.raises(errors.PlacementError, match="only 2 GPUs free"):
        await client.scale("primary", 9)
    backend.refuse = None
    with pytest.raises(errors.Conflict, match="no other replica of 'side'"):
        await client.eject("side-0")


async def test_backend_crash_is_a_500(client: AsyncControlClient, backend: FakeBackend) -> None:
    def boom() -> dict:
        raise RuntimeError("bug")

    backend.inventory = boom  # type: ignore[method-assign]
    with pytest.raises(errors.VllmSrError, match="internal error") as info:
        await client.inventory()
    assert info.value.code == "internal_error"
    assert (await client.config()) == backend.effective_config()  # still serving


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b'{"duration_ms": "30s"}', "duration_ms"),
        (b'{"duration_ms": 0}', "duration_ms"),
        (b'{"duration": 5}', "duration: unknown field"),
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
    ],
)
async def test_bad_eject_bodies_are_400(
    server: ControlServer, backend: FakeBackend, body: bytes, needle: str
) -> None:
    head = (
        f"POST /v1/replicas/primary-0/eject HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    status, answer = await raw_request(server.path, head + body)
    assert status == 400
    assert answer["error"]["code"] == "invalid_request"
    assert needle in answer["error"]["message"]
    assert backend.commands == []


async def test_scale_needs_a_whole_replica_count(client: AsyncControlClient) -> None:
    with pytest.raises(errors.InvalidRequest, match="replicas"):
        await client.request("POST", "/v1/deployments/primary/scale", {"replicas": "2"})
    with pytest.raises(errors.InvalidRequest, match="replicas"):
        await client.request("POST", "/v1/deployments/primary/scale", {"replicas": -1})


async def test_huge_body_is_413(server: ControlServer, backend: FakeBackend) -> None:
    body = b'{"pad": "' + b"x" * (server.max_body + 10) + b'"}'
    head = (
        f"POST /v1/reload HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    status, answer = await raw_request(server.path, head + body)
    assert status == 413 and answer["error"]["code"] == "request_too_large"
    assert backend.commands == []


async def test_huge_chunked_body_is_413(server: ControlServer, backend: FakeBackend) -> None:
    chunk = b"x" * 8192
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(10)) + b"0\r\n\r\n"
    head = (
        b"POST /v1/reload HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    status, answer = await raw_request(server.path, head + chunks)
    assert status == 413 and answer["error"]["code"] == "request_too_large"
    assert backend.commands == []


async def _closed_by_server(reader: asyncio.StreamReader, deadline_s: float) -> bytes:
    return await asyncio.wait_for(reader.read(), deadline_s)


async def test_stalled_headers_are_cut_off(
    server: ControlServer, client: AsyncControlClient
) -> None:
    silent_r, silent_w = await asyncio.open_unix_connection(str(server.path))
    partial_r, partial_w = await asyncio.open_unix_connection(str(server.path))
    partial_w.write(b"GET /v1/inventory HTTP/1.1\r\nHost: x\r\n")  # never finishes
    await partial_w.drain()
    # idle_timeout_s (0.3) closes the silent one; body_timeout_s (0.2 from its first byte)
    # answers the half-sent head 408 and closes: both well before this deadline.
    assert await _closed_by_server(silent_r, 5.0) == b""
    answer = await _closed_by_server(partial_r, 5.0)
    assert answer.split()[1] == b"408" and b"request_timeout" in answer
    assert "deployments" in await client.inventory()
    silent_w.close()
    partial_w.close()


async def test_stalled_body_is_408(server: ControlServer, backend: FakeBackend) -> None:
    reader, writer = await asyncio.open_unix_connection(str(server.path))
    writer.write(
        b"POST /v1/replicas/primary-0/eject HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b'Content-Length: 100\r\n\r\n{"duration'
    )
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 5.0)
    writer.close()
    assert raw.split()[1] == b"408"
    assert b"request_timeout" in raw
    assert backend.commands == []


async def test_client_hanging_up_does_not_cancel_a_queued_command(
    server: ControlServer, backend: FakeBackend
) -> None:
    backend.hold = asyncio.Event()
    async with AsyncControlClient(server.path, command_timeout_s=0.3) as c:
        with pytest.raises(errors.DeadlineExceeded):
            await c.eject("primary-0", 1000)
    backend.hold.set()
    async with AsyncControlClient(server.path) as c:
        for _ in range(100):
            if _replica(await c.inventory(), "primary-0")["state"] == "ejected":
                break
            await asyncio.sleep(0.02)
        assert _replica(await c.inventory(), "primary-0")["state"] == "ejected"


async def test_reads_survive_the_server_closing_an_idle_connection(
    server: ControlServer, client: AsyncControlClient
) -> None:
    assert "deployments" in await client.inventory()
    loop = asyncio.get_running_loop()
    end = loop.time() + 5
    while server.connection_count:  # idle_timeout_s (0.3) closes the pooled connection
        assert loop.time() < end
        await asyncio.sleep(0.02)
    assert "deployments" in await client.inventory()


async def test_too_long_a_path_is_a_config_error(backend: FakeBackend, sock_dir: Path) -> None:
    path = sock_dir / ("x" * 100 + ".sock")
    with pytest.raises(errors.ConfigError, match=r"control_socket: .* accepted: at most"):
        await ControlServer(backend, path, group=None).start()
