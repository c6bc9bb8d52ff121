"""The blocking client (what the CLI uses) and curl against a real server; errors mapped to the
vllm_sr.errors types; a dead or absent socket is ServiceNotRunning."""

from __future__ import annotations

import errno
import json
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.control_fake import FakeBackend, ThreadedControlServer
from tests.support.workers import short_socket_dir
from vllm_sr import errors
from vllm_sr.control.client import (
    AsyncControlClient,
    ControlClient,
    connect_error,
    error_from_response,
)
from vllm_sr.control.protocol import RequestTimeout


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    d = short_socket_dir(prefix="vsr-cl-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def served(sock_dir: Path) -> Iterator[ThreadedControlServer]:
    backend = FakeBackend({"primary": ["cpu", "cpu"]})
    with ThreadedControlServer(backend, sock_dir / "c.sock", group=None, heartbeat_s=0.1) as srv:
        yield srv


def wait_for(cond: object, deadline_s: float = 10.0) -> None:
    end = time.monotonic() + deadline_s
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < end, "condition not reached before the deadline"
        time.sleep(0.01)


def test_sync_client_every_call(served: ThreadedControlServer) -> None:
    c = ControlClient(served.path)
    assert [r["id"] for r in c.inventory()["deployments"][0]["replicas"]] == [
        "primary-0",
        "primary-1",
    ]
    assert c.health()["status"] == "ready"
    assert "model_catalog" in c.config()["global"]
    assert c.eject("primary-0", 1500)["state"] == "ejected"
    assert c.readmit("primary-0")["state"] == "ready"
    assert c.drain("primary-1")["inflight"] == 0
    old_pid = served.call(lambda: served.backend.replica("primary-1").pid)
    assert c.restart("primary-1")["old_pid"] == old_pid
    assert c.scale("primary", 1)["retired"] == ["primary-1"]
    assert c.reload()["ok"] is True
    names = [e["event"] for e in c.events()["events"]]
    assert names == [
        "replica_ejected",
        "replica_readmitted",
        "replica_draining",
        "replica_exited",
        "replica_restarted",
        "replica_ready",
        "replica_draining",
        "pool_published",
        "replica_stopped",
        "pool_published",
    ]
    assert [cmd.kind for cmd in served.backend.commands] == [
        "eject",
        "readmit",
        "drain",
        "restart",
        "scale",
        "reload",
    ]
    with pytest.raises(errors.NotFound):
        c.eject("primary-7")


def test_sync_stream_replays_then_follows(sock_dir: Path) -> None:
    # Three replicas: the pool ejects two only while a third still serves.
    backend = FakeBackend({"primary": ["cpu", "cpu", "cpu"]})
    with ThreadedControlServer(backend, sock_dir / "c.sock", group=None, heartbeat_s=0.1) as srv:
        _stream_replays_then_follows(srv)


def _stream_replays_then_follows(served: ThreadedControlServer) -> None:
    c = ControlClient(served.path)
    c.eject("primary-0", 1000)
    bus = served.backend.events

    def eject_later() -> None:
        wait_for(lambda: bus.subscriber_count == 1)
        ControlClient(served.path).eject("primary-1", 2000)

    helper = threading.Thread(target=eject_later)
    helper.start()
    seen = []
    for event in c.stream_events(since=0):
        seen.append(event)
        if len(seen) == 2:
            break
    helper.join(10)
    assert [(e["event"], e["replica"]) for e in seen] == [
        ("replica_ejected", "primary-0"),
        ("replica_ejected", "primary-1"),
    ]


def test_sync_stream_without_heartbeats_times_out(sock_dir: Path) -> None:
    backend = FakeBackend()
    with ThreadedControlServer(backend, sock_dir / "c.sock", group=None, heartbeat_s=60) as srv:
        c = ControlClient(srv.path)
        with pytest.raises(errors.DeadlineExceeded, match="no event or heartbeat"):
            next(iter(c.stream_events(idle_timeout_s=0.3)))


def test_absent_or_stale_socket_is_service_not_running(sock_dir: Path) -> None:
    absent = sock_dir / "absent.sock"
    with pytest.raises(errors.ServiceNotRunning, match=f"nothing is serving on {absent}"):
        ControlClient(absent).inventory()
    stale = sock_dir / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(stale))
    s.close()
    with pytest.raises(errors.ServiceNotRunning) as info:
        ControlClient(stale).health()
    assert info.value.exit_code == errors.EXIT_NOT_RUNNING


async def test_async_client_absent_socket_is_service_not_running(sock_dir: Path) -> None:
    async with AsyncControlClient(sock_dir / "absent.sock") as c:
        with pytest.raises(errors.ServiceNotRunning):
            await c.inventory()
        with pytest.raises(errors.ServiceNotRunning):
            async for _ in c.stream_events():
                pass


def test_connect_errors() -> None:
    path = Path("/run/x.sock")
    refused = connect_error(path, OSError(errno.EACCES, "Permission denied"))
    assert isinstance(refused, errors.Forbidden) and "permission denied" in str(refused)
    assert isinstance(
        connect_error(path, ConnectionRefusedError(errno.ECONNREFUSED, "r")),
        errors.ServiceNotRunning,
    )


@pytest.mark.parametrize(
    ("status", "body", "cls"),
    [
        (404, {"error": {"code": "not_found", "message": "m"}}, errors.NotFound),
        (403, {"error": {"code": "forbidden", "message": "m"}}, errors.Forbidden),
        (409, {"error": {"code": "placement_failed", "message": "m"}}, errors.PlacementError),
        (400, {"error": {"code": "invalid_config", "message": "m"}}, errors.ConfigError),
        (429, {"error": {"code": "overloaded", "message": "m"}}, errors.Overloaded),
        (408, {"error": {"code": "request_timeout", "message": "m"}}, RequestTimeout),
        (504, {"error": {"code": "deadline_exceeded", "message": "m"}}, errors.DeadlineExceeded),
        (404, {"error": {"code": "some_new_code", "message": "m"}}, errors.NotFound),
    ],
)
def test_error_from_response_by_code_then_status(
    status: int, body: dict, cls: type[errors.VllmSrError]
) -> None:
    exc = error_from_response(status, json.dumps(body).encode())
    assert type(exc) is cls and exc.message == "m"


def test_error_from_a_non_json_body() -> None:
    exc = error_from_response(502, b"Bad Gateway")
    assert type(exc) is errors.VllmSrError and exc.message == "Bad Gateway"


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_unix_socket(served: ThreadedControlServer) -> None:
    def curl(*args: str) -> dict:
        out = subprocess.run(
            ["curl", "-sS", "--unix-socket", str(served.path), *args],
            check=True,
            capture_output=True,
            text=True,
            timeout=20,
        )
        result: dict = json.loads(out.stdout)
        return result

    inv = curl("http://localhost/v1/inventory")
    assert inv["deployments"][0]["replicas"][1]["id"] == "primary-1"
    url = "http://localhost/v1/replicas/primary-1/eject"
    ejected = curl("-X", "POST", "-d", '{"duration_ms": 30000}', url)
    assert (ejected["ok"], ejected["state"]) == (True, "ejected")
    assert served.call(lambda: served.backend.replica("primary-1").display_state()) == "ejected"
    missing = curl("-X", "POST", "http://localhost/v1/replicas/nope/drain")
    assert missing["error"]["code"] == "not_found"
