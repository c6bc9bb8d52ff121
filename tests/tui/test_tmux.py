"""The real ``vllm-sr-top`` in a real terminal (tmux), read back with ``tmux capture-pane``.

Against a stand-in service process (the real control server with the fake backend behind it,
``tests/tui/fake_service.py``): the screen, an ejection confirmed with keys, the service going
away and a new process coming back, and a second, unprivileged uid that may only read.
Against a real ``vllm-sr serve`` (CPU workers, the d3-edge model): the replicas as the
supervisor reports them, and an ejection applied by the real pool."""

from __future__ import annotations

import os
import shutil
import signal
import socket as socketlib
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from vllm_sr.control.client import ControlClient
from vllm_sr.errors import VllmSrError

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NOBODY = 65534


class Tmux:
    """One detached tmux session on a private tmux server (never the user's own)."""

    def __init__(self, command: str, size: tuple[int, int] = (120, 36)) -> None:
        self.server = f"vsr-top-{uuid.uuid4().hex[:8]}"
        self._tmux(
            "new-session", "-d", "-s", "top", "-x", str(size[0]), "-y", str(size[1]), command
        )

    def _tmux(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", "-L", self.server, *args], capture_output=True, text=True, timeout=10
        )

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "top").stdout

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "top", *keys)

    def alive(self) -> bool:
        return self._tmux("has-session", "-t", "top").returncode == 0

    def wait(self, predicate: Callable[[str], bool], what: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if predicate(screen):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; the screen:\n{screen}")

    def close(self) -> None:
        self._tmux("kill-server")
        # tmux leaves its socket file behind.
        tmpdir = Path(os.environ.get("TMUX_TMPDIR", "/tmp"))
        (tmpdir / f"tmux-{os.getuid()}" / self.server).unlink(missing_ok=True)


def rows(screen: str, *ids: str) -> bool:
    """Whether the replica tables show a row for every id (ids also appear in the events
    pane, which fills first: keys sent before the tables exist find nothing selected)."""
    lines = screen.splitlines()
    return all(any(line.startswith(f" {rid} ") for line in lines) for rid in ids)


def _wait_for_service(socket: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            ControlClient(socket, timeout_s=2.0).health()
            return
        except VllmSrError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _start_fake_service(socket: Path, log: Path, group: str | None) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "tests.tui.fake_service", str(socket)]
    if group:
        argv += ["--group", group]
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    _wait_for_service(socket)
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def sock_dir(socket_dir: Path) -> Iterator[Path]:
    socket_dir.chmod(0o755)  # the read-only test's second uid must reach the socket
    yield socket_dir
    shutil.rmtree(socket_dir, ignore_errors=True)


@pytest.fixture
def fake_service(sock_dir: Path) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    socket = sock_dir / "control.sock"
    proc = _start_fake_service(socket, sock_dir / "service.log", group="users")
    try:
        yield socket, proc
    finally:
        _stop(proc)


def _top(socket: Path, prefix: str = "") -> str:
    return f"{prefix}{BIN / 'vllm-sr-top'} --socket {socket} --interval 0.5"


def test_top_in_a_terminal_ejects_and_survives_a_service_restart(
    fake_service: tuple[Path, subprocess.Popen[bytes]], sock_dir: Path
) -> None:
    socket, proc = fake_service
    term = Tmux(_top(socket))
    try:
        screen = term.wait(lambda s: rows(s, "primary-2", "classifier-0"), "the replicas")
        assert "primary 3/3 ready" in screen and "replica_ready" in screen
        term.keys("j", "e")
        term.wait(lambda s: "Eject primary-1 from dispatch" in s, "the confirmation")
        term.keys("y")
        screen = term.wait(lambda s: "eject primary-1: done" in s, "the result")
        screen = term.wait(lambda s: "replica_ejected primary-1" in s, "the event")
        term.wait(lambda s: "primary  3/3 ready  degraded  1 ejected" in s, "degraded")
        term.wait(
            lambda s: any(line.startswith(" primary-1  ejected ") for line in s.splitlines()),
            "the ejected row",
        )

        _stop(proc)
        term.wait(lambda s: "DISCONNECTED" in s and "Retrying in" in s, "the banner")
        proc = _start_fake_service(socket, sock_dir / "service.log", group="users")
        screen = term.wait(
            lambda s: "DISCONNECTED" not in s and "primary 3/3 ready" in s, "the resumed screen"
        )
        term.wait(lambda s: "the service restarted" in s, "the events of the new process")
        term.keys("q")
        deadline = time.monotonic() + 10
        while term.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not term.alive(), "q did not quit"
    finally:
        term.close()
        _stop(proc)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the dashboard as a second uid")
def test_a_user_who_may_only_read_sees_actions_disabled(
    fake_service: tuple[Path, subprocess.Popen[bytes]],
) -> None:
    socket, _ = fake_service
    # nobody, in the socket's group (so it may connect and read) but not an admin.
    users_gid = 100
    dashboard = BIN / "vllm-sr-top"
    as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    reach = subprocess.run([*as_nobody, "test", "-x", str(dashboard)], check=False)
    if reach.returncode != 0:  # e.g. a checkout inside a 0700 directory (mktemp -d)
        pytest.skip(f"{NOBODY} cannot reach {dashboard}: this checkout is private to its owner")
    prefix = f"HOME=/tmp setpriv --reuid={NOBODY} --regid={NOBODY} --groups={users_gid} "
    term = Tmux(_top(socket, prefix))
    try:
        term.wait(lambda s: rows(s, "primary-0"), "the replicas, read by nobody")
        # The service's /v1/health tells nobody it may only read: the banner says so at once.
        screen = term.wait(lambda s: "read-only:" in s, "the read-only banner")
        assert "may read but not change the service" in screen
        # Keys are handled in order: once help (opened after d and e) is up, a wrongly enabled
        # d or e would already have opened its confirmation.
        term.keys("d")
        term.keys("e")
        term.keys("?")
        screen = term.wait(lambda s: "this help" in s, "the help screen")
        assert "Drain primary-0" not in screen and "Eject primary-0" not in screen
    finally:
        term.close()
    assert ControlClient(socket).inventory()["deployments"][0]["replicas"][0]["state"] == "ready"


def _free_port() -> int:
    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _all_ready(socket: Path) -> bool:
    try:
        inventory = ControlClient(socket, timeout_s=2.0).inventory()
    except VllmSrError:
        return False
    replicas = [r for d in inventory["deployments"] for r in d["replicas"]]
    return bool(replicas) and all(r["ready"] for r in replicas)


@pytest.fixture
def serve(tiny_bert_dir: Path, sock_dir: Path) -> Iterator[Path]:
    """A real ``vllm-sr serve``: two CPU workers of a tiny BERT, control API on a temp socket."""
    (sock_dir / "vllm-sr.toml").write_text("# host settings: defaults, paths given as flags\n")
    socket = sock_dir / "control.sock"
    argv = [
        sys.executable, "-m", "vllm_sr.cli", "serve", str(tiny_bert_dir), "-e",
        "--platform", "cpu", "-dp", "2", "--config", str(sock_dir / "config.yaml"),
        "--service-config", str(sock_dir / "vllm-sr.toml"), "--runtime-dir", str(sock_dir / "run"),
        "--control-socket", str(socket), "--listen", f"127.0.0.1:{_free_port()}",
    ]  # fmt: skip
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with (sock_dir / "serve.log").open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while not _all_ready(socket):
            assert proc.poll() is None, (sock_dir / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "vllm-sr serve: workers not ready in 120 s"
            time.sleep(0.2)
        yield socket
    finally:
        _stop(proc)


def test_top_against_a_real_vllm_sr_serve(serve: Path) -> None:
    term = Tmux(_top(serve))
    try:
        # The events pane fills on its own poll, after the replicas' rows: wait for both.
        screen = term.wait(
            lambda s: (
                rows(s, "primary-0", "primary-1")
                and all(f"replica_ready primary-{i}" in s for i in (0, 1))
            ),
            "the replicas and their ready events",
        )
        assert "primary 2/2 ready" in screen
        assert "replica_ready primary-0" in screen and "replica_ready primary-1" in screen
        term.keys("j", "e")
        term.wait(lambda s: "Eject primary-1 from dispatch" in s, "the confirmation")
        term.keys("y")
        screen = term.wait(
            lambda s: "eject primary-1: done" in s and "replica_ejected primary-1" in s,
            "the ejection applied by the real pool",
        )
        pid = next(
            r["pid"]
            for r in ControlClient(serve).inventory()["deployments"][0]["replicas"]
            if r["id"] == "primary-0"
        )
        os.kill(pid, signal.SIGKILL)  # the supervisor restarts it; the screen shows it
        screen = term.wait(lambda s: "replica_restarted primary-0" in s, "the restart", timeout=60)
        row = next(line for line in screen.splitlines() if line.startswith(" primary-0 "))
        assert str(pid) not in row
    finally:
        term.close()
