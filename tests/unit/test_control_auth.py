"""Who may mutate: the policy on its own, the kernel's account of a peer, and (as root) a real
second uid connecting from a child process."""

from __future__ import annotations

import asyncio
import grp
import json
import os
import pwd
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.control_fake import FakeBackend
from tests.support.workers import short_socket_dir
from vllm_sr import errors
from vllm_sr.control.auth import AccessPolicy, Peer, read_peer
from vllm_sr.control.server import ControlServer

PEER_USER = "vsrctl-peer"
SOCK_GROUP = "vsrctl-sock"
ADMIN_GROUP = "vsrctl-admin"


def ensure_group(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        subprocess.run(["groupadd", "--system", name], check=True, capture_output=True)
        return grp.getgrnam(name).gr_gid


def ensure_user(name: str) -> int:
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(name).pw_uid


def _peer(uid: int, *groups: int) -> Peer:
    return Peer(pid=4242, uid=uid, gid=groups[0] if groups else uid, groups=frozenset(groups))


# --- the policy ------------------------------------------------------------------------


def test_root_and_service_user_may_mutate() -> None:
    policy = AccessPolicy(service_uid=990, admin_gid=None)
    policy.check_mutation(_peer(0))
    policy.check_mutation(_peer(990, 990))


def test_admin_group_member_may_mutate_through_a_supplementary_group() -> None:
    policy = AccessPolicy(service_uid=990, admin_gid=977, admin_group="ops")
    policy.check_mutation(_peer(1000, 1000, 977))


def test_others_are_refused_with_why() -> None:
    policy = AccessPolicy(service_uid=990, admin_gid=977, admin_group="ops")
    with pytest.raises(errors.Forbidden) as info:
        policy.check_mutation(_peer(1000, 1000, 990))
    message = str(info.value)
    assert "uid 1000" in message and "pid 4242" in message
    assert "not in the admin group 'ops' (gid 977)" in message
    assert "service user (uid 990)" in message


def test_without_admin_group_the_refusal_says_so() -> None:
    policy = AccessPolicy(service_uid=990, admin_gid=None)
    with pytest.raises(errors.Forbidden, match="no admin group is configured"):
        policy.check_mutation(_peer(1000, 1000))


def test_defaults_are_this_process_and_no_admin_group() -> None:
    policy = AccessPolicy()
    assert policy.service_uid == os.geteuid() and policy.admin_gid is None
    policy.check_mutation(_peer(os.geteuid(), os.getegid()))


def test_unknown_names_fall_back(caplog: pytest.LogCaptureFixture) -> None:
    policy = AccessPolicy(service_user="no-such-user-vsr", admin_group="no-such-group-vsr")
    assert policy.service_uid == os.geteuid() and policy.admin_gid is None
    assert "no-such-user-vsr" in caplog.text and "no-such-group-vsr" in caplog.text


# --- the kernel's account of a peer ---------------------------------------------------


def test_read_peer_over_a_real_socket() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        peer = read_peer(a)
    assert (peer.pid, peer.uid, peer.gid) == (os.getpid(), os.geteuid(), os.getegid())
    assert set(os.getgroups()) | {os.getegid()} <= peer.groups


# --- a second uid, for real -----------------------------------------------------------

# Standard library only: it runs as another user, who cannot read the venv under /root.
CHILD = r"""
import http.client, json, socket, sys

class Conn(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(sys.argv[1])

out = {}
for key, method, target in (
    ("GET", "GET", "/v1/inventory"),
    ("HEALTH", "GET", "/v1/health"),
    ("POST", "POST", "/v1/replicas/primary-0/eject"),
):
    conn = Conn("localhost", timeout=10)
    try:
        conn.request(method, target, body=b"{}" if method == "POST" else None)
        resp = conn.getresponse()
        out[key] = [resp.status, json.loads(resp.read())]
    except OSError as exc:
        out[key] = ["oserror", exc.errno]
print(json.dumps(out))
"""

SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture
def peer_env() -> Iterator[tuple[int, int, int, Path]]:
    if os.geteuid() != 0:
        pytest.skip("a second uid needs root here (to create a user and setuid to it)")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is missing: the second uid needs a Python it can run")
    uid = ensure_user(PEER_USER)
    sock_gid = ensure_group(SOCK_GROUP)
    admin_gid = ensure_group(ADMIN_GROUP)
    d = short_socket_dir(prefix="vsr-auth-")
    d.chmod(0o755)  # the peer must be able to reach the socket file
    yield uid, sock_gid, admin_gid, d
    shutil.rmtree(d, ignore_errors=True)


async def _as_peer(path: Path, uid: int, groups: list[int]) -> dict:
    proc = await asyncio.create_subprocess_exec(
        SYSTEM_PYTHON,
        "-I",
        "-c",
        CHILD,
        str(path),
        user=uid,
        group=pwd.getpwuid(uid).pw_gid,
        extra_groups=groups,
        cwd="/",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    result: dict = json.loads(out)
    return result


async def test_second_uid_reads_but_may_not_mutate(peer_env: tuple[int, int, int, Path]) -> None:
    uid, sock_gid, _, d = peer_env
    backend = FakeBackend()
    async with ControlServer(backend, d / "c.sock", group=SOCK_GROUP) as srv:
        out = await _as_peer(srv.path, uid, [sock_gid])
    assert out["GET"][0] == 200 and out["GET"][1]["deployments"][0]["name"] == "primary"
    status, body = out["POST"]
    assert status == 403 and body["error"]["code"] == "forbidden"
    assert f"uid {uid} ({PEER_USER})" in body["error"]["message"]
    caller = out["HEALTH"][1]["caller"]  # so a dashboard can disable its actions up front
    assert caller["uid"] == uid and caller["may_mutate"] is False
    assert caller["why"] == body["error"]["message"]
    assert backend.commands == []
    assert backend.replica("primary-0").state == "ready"


async def test_admin_group_member_may_mutate(peer_env: tuple[int, int, int, Path]) -> None:
    uid, sock_gid, admin_gid, d = peer_env
    backend = FakeBackend()
    srv = ControlServer(backend, d / "c.sock", group=SOCK_GROUP, admin_group=ADMIN_GROUP)
    async with srv:
        out = await _as_peer(srv.path, uid, [sock_gid, admin_gid])
    assert out["HEALTH"][1]["caller"] == {"uid": uid, "may_mutate": True, "why": None}
    assert out["POST"][0] == 200 and out["POST"][1]["state"] == "ejected"
    assert [c.kind for c in backend.commands] == ["eject"]


async def test_outside_the_socket_group_cannot_connect(
    peer_env: tuple[int, int, int, Path],
) -> None:
    uid, _, _, d = peer_env
    async with ControlServer(FakeBackend(), d / "c.sock", group=SOCK_GROUP) as srv:
        out = await _as_peer(srv.path, uid, [])
    assert out["GET"] == ["oserror", 13]  # EACCES: mode 0660 keeps others out
