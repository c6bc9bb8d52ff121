"""Who may change the service through the control socket.

Anyone who can connect (the socket is 0660 with the service's group) may read. A mutating
request must come from root, from the service user, or from a member of the admin group; the
kernel vouches for the peer (SO_PEERCRED, SO_PEERGROUPS), so nothing the client sends counts."""

from __future__ import annotations

import grp
import logging
import os
import pwd
import socket
from dataclasses import dataclass

from vllm_sr.errors import Forbidden
from vllm_sr.httpserver import PeerCredentials, peer_credentials

log = logging.getLogger("vllm_sr.control")


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int
    groups: frozenset[int]

    def describe(self) -> str:
        return f"uid {self.uid} ({_user_name(self.uid)}), pid {self.pid}"


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "unknown user"


def peer_of(creds: PeerCredentials) -> Peer:
    """The policy's view of a connection's peer (``Request.peer``, read by the server when it
    accepted the connection), its groups included."""
    return Peer(creds.pid, creds.uid, creds.gid, creds.groups())


def read_peer(sock: socket.socket) -> Peer:
    """The kernel's account of the process on the other end of ``sock``."""
    return peer_of(peer_credentials(sock))


class AccessPolicy:
    """Decides whether a peer may mutate. Names are resolved once, at start."""

    def __init__(
        self,
        *,
        service_user: str | None = None,
        admin_group: str | None = None,
        service_uid: int | None = None,
        admin_gid: int | None = None,
    ) -> None:
        self.service_uid = service_uid if service_uid is not None else _uid_of(service_user)
        self.admin_group = admin_group
        self.admin_gid = admin_gid if admin_gid is not None else _gid_of(admin_group)

    def check_mutation(self, peer: Peer) -> None:
        """Raise ``Forbidden`` saying why, unless ``peer`` may change the service."""
        if peer.uid == 0 or peer.uid == self.service_uid:
            return
        if self.admin_gid is not None and self.admin_gid in peer.groups:
            return
        if self.admin_gid is None:
            how = "no admin group is configured (host settings: control admin_group)"
        else:
            how = f"it is not in the admin group {self.admin_group!r} (gid {self.admin_gid})"
        raise Forbidden(
            f"{peer.describe()} may read but not change the service: it is not root, "
            f"not the service user (uid {self.service_uid}), and {how}",
            uid=peer.uid,
            pid=peer.pid,
        )


def _uid_of(user: str | None) -> int:
    if user is None:
        return os.geteuid()
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        log.warning("service user %r does not exist; using uid %d", user, os.geteuid())
        return os.geteuid()


def _gid_of(group: str | None) -> int | None:
    if group is None:
        return None
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        log.warning(
            "admin group %r does not exist; only root and the service user may mutate", group
        )
        return None
