"""A real redis-server for a test (Debian's package; CI installs it): on a Unix socket in the
given directory, no persistence, killed afterwards."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import redis

HAVE_REDIS = shutil.which("redis-server") is not None


@contextlib.contextmanager
def redis_server(directory: Path) -> Iterator[Path]:
    """Yields the socket's path once the server answers PING."""
    sock = directory / "redis.sock"
    proc = subprocess.Popen(
        ["redis-server", "--port", "0", "--unixsocket", str(sock), "--save", "",
         "--appendonly", "no", "--dir", str(directory)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                if redis.Redis(unix_socket_path=str(sock)).ping():
                    break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
            time.sleep(0.02)
        yield sock
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
