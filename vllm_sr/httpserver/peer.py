"""The kernel's account of the process on the other end of a Unix socket: its pid, uid and gid
(``SO_PEERCRED``) and its groups (``SO_PEERGROUPS``). Both are recorded by the kernel when the
peer connected, so nothing the peer sends can change them; the control socket decides who may
change the service by them.

The server reads the credentials once per accepted Unix connection (one ``getsockopt``); the
groups, a larger read, only when asked for."""

from __future__ import annotations

import socket
import struct
from typing import Any

# Linux >= 4.13; Python does not export the constant on every build.
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)
_MAX_GROUPS = 65536
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class PeerCredentials:
    """Who connected: ``pid``, ``uid``, ``gid``; ``groups()`` reads its groups on first use."""

    __slots__ = ("_groups", "_sock", "gid", "pid", "uid")

    def __init__(self, pid: int, uid: int, gid: int, sock: Any = None) -> None:
        self.pid = pid
        self.uid = uid
        self.gid = gid
        self._sock = sock  # the connection's socket (a transport's wrapper of it is fine)
        self._groups: frozenset[int] | None = None

    def groups(self) -> frozenset[int]:
        """The peer's groups, its primary group included."""
        if self._groups is None:
            found = peer_groups(self._sock, self.pid) if self._sock is not None else []
            self._groups = frozenset({self.gid, *found})
        return self._groups

    def __repr__(self) -> str:
        return f"PeerCredentials(pid={self.pid}, uid={self.uid}, gid={self.gid})"


def peer_credentials(sock: Any) -> PeerCredentials:
    """``SO_PEERCRED`` of a connected Unix socket (``OSError`` if it is not one)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
    pid, uid, gid = _CRED.unpack(raw)
    return PeerCredentials(pid, uid, gid, sock)


def unix_peer(sock: Any) -> PeerCredentials | None:
    """The credentials of the peer when ``sock`` is a Unix socket, else None (TCP, or a socket
    the kernel will not describe)."""
    if sock is None or getattr(sock, "family", None) != socket.AF_UNIX:
        return None
    try:
        return peer_credentials(sock)
    except OSError:
        return None


def peer_groups(sock: Any, pid: int) -> list[int]:
    """The peer's groups from ``SO_PEERGROUPS``; on older kernels, the process's supplementary
    groups as /proc shows them now."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 4 * _MAX_GROUPS)
        return list(struct.unpack(f"{len(raw) // 4}I", raw))
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Groups:"):
                    return [int(g) for g in line.split()[1:]]
    except OSError:
        pass
    return []
