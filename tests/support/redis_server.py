"""A real redis-server for a test (Debian's package; CI installs it): on a Unix socket in the
given directory (or, for stores that take only ``host:port``, a TCP port on 127.0.0.1), no
persistence, killed afterwards. A test that takes Redis away kills ``proc`` itself."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

HAVE_REDIS = shutil.which("redis-server") is not None


@dataclass
class RedisServer:
    proc: subprocess.Popen[bytes]
    sock: Path | None  # the Unix socket, or None when on a TCP port
    port: int | None  # the TCP port on 127.0.0.1, or None when on a Unix socket

    def client(self) -> redis.Redis:
        if self.sock is not None:
            return redis.Redis(unix_socket_path=str(self.sock))
        return redis.Redis(port=self.port or 0)

    def kill(self) -> None:
        """Redis goes away at once, as a crashed pod's would."""
        self.proc.kill()
        self.proc.wait(10)


@contextlib.contextmanager
def redis_process(directory: Path, *, port: int | None = None) -> Iterator[RedisServer]:
    """Yields the server once it answers PING: on ``directory``/redis.sock, or on ``port``."""
    sock = None if port is not None else directory / "redis.sock"
    if sock is not None:
        where = ["--port", "0", "--unixsocket", str(sock)]
    else:
        where = ["--port", str(port), "--bind", "127.0.0.1"]
    proc = subprocess.Popen(
        ["redis-server", *where, "--save", "", "--appendonly", "no", "--dir", str(directory)],
        stdout=subprocess.DEVNULL,
    )
    server = RedisServer(proc, sock, port)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                if server.client().ping():
                    break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
            time.sleep(0.02)
        yield server
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


@contextlib.contextmanager
def redis_server(directory: Path) -> Iterator[Path]:
    """Yields the socket's path once the server answers PING."""
    with redis_process(directory) as server:
        assert server.sock is not None
        yield server.sock
