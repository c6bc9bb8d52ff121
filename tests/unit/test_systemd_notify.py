"""SystemdNotifier against a real AF_UNIX datagram socket standing in for systemd."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_sr.clock import FakeClock
from vllm_sr.supervisor.systemd import SystemdNotifier, status_line


class FakeSystemd:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(2.0)

    def recv(self) -> dict[str, str]:
        data = self.sock.recv(4096).decode()
        return dict(line.split("=", 1) for line in data.split("\n"))

    def pending(self) -> list[bytes]:
        self.sock.setblocking(False)
        out = []
        try:
            while True:
                out.append(self.sock.recv(4096))
        except BlockingIOError:
            pass
        finally:
            self.sock.settimeout(2.0)
        return out


@pytest.fixture
def systemd(tmp_path: Path) -> Iterator[FakeSystemd]:
    fake = FakeSystemd(tmp_path / "notify")
    yield fake
    fake.sock.close()


def test_noop_without_notify_socket() -> None:
    n = SystemdNotifier(env={})
    assert not n.enabled
    n.ready("x")
    n.status("y")
    n.watchdog_ping()
    assert n.watchdog_interval() is None


def test_ready_and_status(systemd: FakeSystemd) -> None:
    n = SystemdNotifier(env={"NOTIFY_SOCKET": str(systemd.path)})
    assert n.enabled
    n.ready("primary: 1/1 ready, 0 ejected, 0 restarts")
    assert systemd.recv() == {
        "READY": "1",
        "STATUS": "primary: 1/1 ready, 0 ejected, 0 restarts",
    }


def test_status_only_sent_on_change(systemd: FakeSystemd) -> None:
    n = SystemdNotifier(env={"NOTIFY_SOCKET": str(systemd.path)})
    n.status("a")
    n.status("a")
    n.status("b")
    n.status("b")
    assert [m.decode() for m in systemd.pending()] == ["STATUS=a", "STATUS=b"]


def test_reloading_carries_monotonic_usec(systemd: FakeSystemd) -> None:
    n = SystemdNotifier(env={"NOTIFY_SOCKET": str(systemd.path)}, clock=FakeClock(start=12.5))
    n.reloading()
    assert systemd.recv() == {"RELOADING": "1", "MONOTONIC_USEC": "12500000"}


def test_stopping_and_extend_timeout(systemd: FakeSystemd) -> None:
    n = SystemdNotifier(env={"NOTIFY_SOCKET": str(systemd.path)})
    n.extend_timeout(90)
    assert systemd.recv() == {"EXTEND_TIMEOUT_USEC": "90000000"}
    n.stopping()
    assert systemd.recv() == {"STOPPING": "1"}


def test_abstract_socket() -> None:
    name = f"vllm-sr-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(2.0)
    try:
        SystemdNotifier(env={"NOTIFY_SOCKET": "@" + name}).watchdog_ping()
        assert sock.recv(100) == b"WATCHDOG=1"
    finally:
        sock.close()


def test_missing_socket_does_not_raise(tmp_path: Path) -> None:
    n = SystemdNotifier(env={"NOTIFY_SOCKET": str(tmp_path / "gone")})
    n.ready()
    n.ready()  # a second failure is swallowed as well


def test_failures_are_logged_once_and_the_socket_found_later(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "late"
    n = SystemdNotifier(env={"NOTIFY_SOCKET": str(path)})
    with caplog.at_level(logging.WARNING, logger="vllm_sr.supervisor.systemd"):
        n.status("a")
        n.status("b")
    assert len([r for r in caplog.records if "sd_notify" in r.getMessage()]) == 1
    late = FakeSystemd(path)  # systemd's socket appears after the service started
    try:
        n.ready("up")
        assert late.recv() == {"READY": "1", "STATUS": "up"}
    finally:
        late.sock.close()


def test_a_rebound_socket_gets_the_next_message(systemd: FakeSystemd) -> None:
    n = SystemdNotifier(env={"NOTIFY_SOCKET": str(systemd.path)})
    n.status("before")
    assert systemd.recv() == {"STATUS": "before"}
    systemd.sock.close()  # systemd re-executed: a new socket bound at the same path
    systemd.path.unlink()
    again = FakeSystemd(systemd.path)
    try:
        n.status("after")
        assert again.recv() == {"STATUS": "after"}
    finally:
        again.sock.close()


def test_status_text_goes_out_as_utf8(systemd: FakeSystemd) -> None:
    SystemdNotifier(env={"NOTIFY_SOCKET": str(systemd.path)}).status("prêt ✓")
    assert systemd.sock.recv(100) == "STATUS=prêt ✓".encode()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"WATCHDOG_USEC": "20000000"}, 10.0),
        ({"WATCHDOG_USEC": "20000000", "WATCHDOG_PID": str(os.getpid())}, 10.0),
        ({"WATCHDOG_USEC": "20000000", "WATCHDOG_PID": "1"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "junk"}, None),
        ({}, None),
    ],
)
def test_watchdog_interval(env: dict[str, str], expected: float | None, tmp_path: Path) -> None:
    n = SystemdNotifier(env={"NOTIFY_SOCKET": str(tmp_path / "s"), **env})
    assert n.watchdog_interval() == expected


async def test_run_watchdog_pings_until_cancelled(systemd: FakeSystemd) -> None:
    n = SystemdNotifier(env={"NOTIFY_SOCKET": str(systemd.path), "WATCHDOG_USEC": "40000"})
    task = asyncio.create_task(n.run_watchdog())
    loop = asyncio.get_running_loop()
    got = []
    for _ in range(3):
        got.append(await loop.run_in_executor(None, systemd.sock.recv, 100))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert got == [b"WATCHDOG=1"] * 3


async def test_run_watchdog_returns_when_disabled() -> None:
    await asyncio.wait_for(SystemdNotifier(env={}).run_watchdog(), 1.0)


def _replica(state: str, restarts: int = 0) -> dict[str, object]:
    return {"state": state, "ready": state == "ready", "restarts": restarts}


def test_status_line_counts_from_inventory() -> None:
    inv = {
        "deployments": [
            {
                "name": "primary",
                "desired_replicas": 2,
                "ready_replicas": 2,
                "ejected_replicas": 0,
                "replicas": [_replica("ready", 1), _replica("ready")],
            },
            {
                "name": "aux",
                "replicas": [_replica("ejected", 2), _replica("starting", 1), _replica("ready")],
            },
        ]
    }
    assert status_line(inv) == (
        "primary: 2/2 ready, 0 ejected, 1 restart; aux: 1/3 ready, 1 ejected, 3 restarts"
    )


def test_status_line_without_deployments() -> None:
    assert status_line({"deployments": []}) == "no deployments"
