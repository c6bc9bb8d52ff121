"""The control socket file: refuse a live one, replace a stale one, and publish a new one with
its final mode and group already set (bind at a temporary name, chmod/chown, then rename), so
no client ever sees it with wider permissions than 0660."""

from __future__ import annotations

import errno
import grp
import logging
import os
import socket
import stat
from pathlib import Path

from vllm_sr.errors import ConfigError, Conflict
from vllm_sr.httpserver import peer_credentials

log = logging.getLogger("vllm_sr.control")

SOCKET_MODE = 0o660
# sun_path is 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH = 107


def probe(path: Path, timeout_s: float = 1.0) -> int | None:
    """The pid serving on ``path``, or None when no process listens there (absent or stale).
    A socket that accepts the connection is live even if its pid cannot be read (0)."""
    if not path.exists() and not path.is_symlink():
        return None
    if not stat.S_ISSOCK(path.lstat().st_mode):
        raise Conflict(
            f"{path} exists and is not a socket; remove it or set another control socket path"
        )
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return None
    except PermissionError as exc:
        raise Conflict(f"cannot probe the control socket {path}: {exc.strerror}") from exc
    except OSError as exc:
        # A full backlog (EAGAIN) or a timeout still means somebody listens.
        if exc.errno in (errno.EAGAIN, errno.ETIMEDOUT) or isinstance(exc, TimeoutError):
            return 0
        raise
    try:
        return peer_credentials(sock).pid
    finally:
        sock.close()


def group_gid(group: str | None) -> int | None:
    """The gid of ``group``; None when it is unset or does not exist here (the caller says so,
    once: ``ControlServer``)."""
    if not group:
        return None
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return None


def bind_socket(
    path: Path, gid: int | None, backlog: int, group: str | None = None
) -> tuple[socket.socket, int]:
    """A listening socket published at ``path`` (mode 0660, owned by ``gid``, the group named
    ``group``, when given; else the process's group). Returns the socket and the inode of the
    published file (to remove only our own on stop)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if len(os.fsencode(str(tmp))) > MAX_SOCKET_PATH:
        room = MAX_SOCKET_PATH - (len(os.fsencode(str(tmp))) - len(os.fsencode(str(path))))
        raise ConfigError(
            f"control_socket: {str(path)!r} is {len(os.fsencode(str(path)))} bytes; accepted: "
            f"at most {room} (a Unix socket path holds {MAX_SOCKET_PATH}, and the socket is "
            "bound under a longer temporary name first)"
        )
    pid = probe(path)
    if pid is not None:
        raise Conflict(f"another vllm-sr is serving on {path}, pid {pid}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(tmp))
        os.chmod(tmp, SOCKET_MODE)
        _set_group(tmp, gid, group)
        sock.listen(backlog)
        sock.setblocking(False)
        if path.exists() or path.is_symlink():
            log.info("replacing the stale control socket %s (nothing listens on it)", path)
        os.rename(tmp, path)
    except BaseException:
        sock.close()
        tmp.unlink(missing_ok=True)
        raise
    return sock, path.lstat().st_ino


def _set_group(path: Path, gid: int | None, group: str | None) -> None:
    if gid is None:
        return
    try:
        os.chown(path, -1, gid)
    except PermissionError:
        log.warning(
            "cannot give the control socket group %r (gid %d) as uid %d; it keeps gid %d",
            group,
            gid,
            os.geteuid(),
            os.getegid(),
        )


def remove_if_ours(path: Path, inode: int | None) -> None:
    """Unlink the socket file unless another process has replaced it since."""
    if inode is None:
        return
    try:
        if path.lstat().st_ino == inode:
            path.unlink()
    except FileNotFoundError:
        pass
