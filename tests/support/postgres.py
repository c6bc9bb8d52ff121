"""A real PostgreSQL server for a test: its own cluster in a temp dir, listening only on a Unix
socket there, stopped and removed afterwards (Debian's ``postgresql`` package; CI installs it).

``initdb`` and ``postgres`` refuse to run as root, so as root the cluster belongs to an
unprivileged user (Debian's ``postgres``, else ``nobody``) and both run through ``setpriv``;
otherwise they run as the current user. Tests skip, saying why, only when the binaries are
absent."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DATABASE = "vsr"
USER = "router"


def pg_bin(name: str) -> str | None:
    """``initdb`` / ``postgres``: on PATH, else Debian's newest /usr/lib/postgresql/N/bin."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


HAVE_POSTGRES = pg_bin("initdb") is not None and pg_bin("postgres") is not None
SKIP_REASON = "needs PostgreSQL's initdb and postgres (Debian package postgresql)"


@dataclass
class PgServer:
    socket_dir: Path
    proc: subprocess.Popen[bytes]

    @property
    def settings(self) -> dict[str, object]:
        """``global.services.router_replay.postgres`` for this server."""
        return {"host": str(self.socket_dir), "port": 5432, "database": DATABASE, "user": USER}

    def conninfo(self) -> str:
        return f"host={self.socket_dir} port=5432 dbname={DATABASE} user={USER}"

    def stop(self) -> None:
        """A fast shutdown (SIGINT), then a kill if it lingers."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _runner() -> tuple[list[str], int | None, int | None]:
    """The command prefix that drops root, and the uid/gid to own the files (None: as we are)."""
    if os.geteuid() != 0:
        return [], None, None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            user = pwd.getpwnam(name)
            prefix = [
                "setpriv",
                f"--reuid={user.pw_uid}",
                f"--regid={user.pw_gid}",
                "--clear-groups",
            ]
            return prefix, user.pw_uid, user.pw_gid
    raise RuntimeError("running as root with neither a postgres nor a nobody user")


@contextlib.contextmanager
def postgres_server() -> Iterator[PgServer]:
    """Start a cluster with database ``vsr`` owned by ``router`` (trust auth on the socket)."""
    prefix, uid, gid = _runner()
    root = Path(tempfile.mkdtemp(prefix="vsr-pg-"))
    if uid is not None and gid is not None:
        os.chown(root, uid, gid)
    data, sock = root / "data", root / "sock"
    env = {**os.environ, "LC_ALL": "C", "TZ": "UTC"}

    def as_owner(*cmd: str) -> list[str]:
        return [*prefix, *cmd]

    proc = None
    server: PgServer | None = None
    try:
        subprocess.run(as_owner("mkdir", "-p", str(sock)), check=True)
        subprocess.run(
            as_owner(str(pg_bin("initdb")), "-D", str(data), "-U", USER, "-A", "trust",
                     "--no-sync", "-E", "UTF8"),
            check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        proc = subprocess.Popen(
            as_owner(str(pg_bin("postgres")), "-D", str(data), "-k", str(sock),
                     "-c", "listen_addresses=", "-c", "fsync=off", "-c", "port=5432"),
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        server = PgServer(sock, proc)
        _wait_ready(server, "postgres")
        with _connect(server, "postgres") as conn:
            conn.execute(f"CREATE DATABASE {DATABASE} OWNER {USER}")
        yield server
    finally:
        if server is not None:
            server.stop()  # the server's current process (start_again may have replaced it)
        elif proc is not None:
            PgServer(sock, proc).stop()
        shutil.rmtree(root, ignore_errors=True)


def start_again(server: PgServer) -> PgServer:
    """The same cluster started again after ``stop`` (a restarted database server); the
    fixture stops this process at the end."""
    prefix, _, _ = _runner()
    data = server.socket_dir.parent / "data"
    proc = subprocess.Popen(
        [*prefix, str(pg_bin("postgres")), "-D", str(data), "-k", str(server.socket_dir),
         "-c", "listen_addresses=", "-c", "fsync=off", "-c", "port=5432"],
        env={**os.environ, "LC_ALL": "C", "TZ": "UTC"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    server.proc = proc
    _wait_ready(server, DATABASE)
    return server


def _connect(server: PgServer, dbname: str):  # type: ignore[no-untyped-def]
    import psycopg

    return psycopg.connect(
        host=str(server.socket_dir), port=5432, dbname=dbname, user=USER, autocommit=True
    )


def _wait_ready(server: PgServer, dbname: str) -> None:
    import psycopg

    deadline = time.monotonic() + 30
    while True:
        try:
            with _connect(server, dbname):
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline or server.proc.poll() is not None:
                raise
        time.sleep(0.05)
