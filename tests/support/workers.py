"""Real worker processes for tests: start one with ``python -m vllm_sr.cli worker``, wait for
its /health over the Unix socket (polling to a deadline), and stop it without leaving a process
behind. Also a small synchronous HTTP client over a Unix socket."""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over an AF_UNIX stream socket."""

    def __init__(self, path: str | Path, timeout: float = 30.0) -> None:
        super().__init__("localhost", timeout=timeout)
        self._uds_path = str(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._uds_path)
        self.sock = sock


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def uds_request(
    uds: str | Path | None,
    method: str,
    path: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    port: int | None = None,
) -> Response:
    """One HTTP request over a Unix socket (or TCP to 127.0.0.1:``port`` when given).
    ``body`` is sent as JSON; ``raw`` as given."""
    conn: http.client.HTTPConnection
    if port is not None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    else:
        assert uds is not None
        conn = UnixHTTPConnection(uds, timeout=timeout)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


_SESSION_ROOT: Path | None = None


def _session_root() -> Path:
    """One short directory under /tmp per test process, holding every directory
    ``short_socket_dir`` makes; removed with all in it when the process exits."""
    global _SESSION_ROOT
    if _SESSION_ROOT is None:
        _SESSION_ROOT = Path(tempfile.mkdtemp(prefix="vsr-t", dir="/tmp"))
        _SESSION_ROOT.chmod(0o755)  # a test may let another user reach a socket inside
        atexit.register(shutil.rmtree, _SESSION_ROOT, True)
    return _SESSION_ROOT


def short_socket_dir(prefix: str = "vsr-") -> Path:
    """A fresh short directory for sockets (AF_UNIX paths are limited to ~107 bytes)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=_session_root()))


@dataclass
class WorkerHandle:
    proc: subprocess.Popen[bytes]
    uds: Path
    log_path: Path
    argv: list[str] = field(default_factory=list)
    port: int | None = None  # set when the worker listens on TCP instead of the socket

    @property
    def pid(self) -> int:
        return self.proc.pid

    def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Response:
        return uds_request(self.uds, method, path, body, port=self.port, **kw)

    def get(self, path: str, **kw: Any) -> Response:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Response:
        return self.request("POST", path, body, **kw)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def worker_argv(
    artifact: str, uds: Path, extra_args: Sequence[str] = (), port: int | None = None
) -> list[str]:
    where = ["--port", str(port)] if port is not None else ["--uds", str(uds)]
    return [sys.executable, "-m", "vllm_sr.cli", "worker", artifact, *where, *extra_args]


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def worker_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    merged = dict(os.environ)
    merged.setdefault("HF_HUB_OFFLINE", "1")
    merged.setdefault("TRANSFORMERS_OFFLINE", "1")
    merged["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), merged.get("PYTHONPATH", "")) if p
    )
    merged.update(env or {})
    return merged


def spawn_worker(
    artifact: str,
    uds: str | Path,
    *,
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    log_path: Path | None = None,
    port: int | None = None,
) -> WorkerHandle:
    """Start a worker process (exec, its own process group) and return at once. With
    ``port`` it listens on 127.0.0.1:port (``uds`` then only names its log file)."""
    uds = Path(uds)
    log_path = log_path or uds.with_suffix(".log")
    argv = worker_argv(artifact, uds, extra_args, port=port)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=worker_env(env), start_new_session=True
        )
    return WorkerHandle(proc, uds, log_path, argv, port)


def wait_health(handle: WorkerHandle, *, timeout: float = 120.0, want: int = 200) -> Response:
    """Poll /health until it answers ``want``; raise with the worker's log if the process
    exits or the deadline passes."""
    deadline = time.monotonic() + timeout
    last: Response | str = "no answer"
    while time.monotonic() < deadline:
        if handle.proc.poll() is not None:
            code = handle.proc.returncode
            raise RuntimeError(f"worker exited with {code} before /health {want}:\n{handle.log()}")
        try:
            resp = handle.get("/health", timeout=5.0)
            if resp.status == want:
                return resp
            last = resp
        except OSError as exc:
            last = repr(exc)
        time.sleep(0.05)
    raise TimeoutError(f"/health never answered {want} (last: {last!r}):\n{handle.log()}")


def start_worker(
    artifact: str,
    uds: str | Path,
    *,
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    ready_timeout: float = 180.0,
    log_path: Path | None = None,
    port: int | None = None,
) -> WorkerHandle:
    """Start a worker and wait until /health answers 200. On failure the process is stopped."""
    handle = spawn_worker(
        artifact, uds, env=env, extra_args=extra_args, log_path=log_path, port=port
    )
    try:
        wait_health(handle, timeout=ready_timeout)
    except BaseException:
        stop_worker(handle)
        raise
    return handle


def stop_worker(handle: WorkerHandle, timeout: float = 15.0) -> int:
    """SIGTERM, wait up to ``timeout``, then SIGKILL the whole process group. Returns the exit
    code (negative for a signal)."""
    proc = handle.proc
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    # Anything the worker left in its group goes too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode


@contextlib.contextmanager
def running_worker(
    artifact: str,
    uds: str | Path | None = None,
    **kw: Any,
) -> Iterator[WorkerHandle]:
    """``with running_worker("vllm-sr/d3-edge") as w: w.get("/health")``."""
    path = Path(uds) if uds else short_socket_dir() / "w.sock"
    handle = start_worker(artifact, path, **kw)
    try:
        yield handle
    finally:
        stop_worker(handle)
