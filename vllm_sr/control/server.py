"""The control API: HTTP over a Unix socket (like Docker's), so ``curl --unix-socket`` works.

Reads answer from the backend's state; mutations are turned into ``Command``s and submitted to
the backend (the supervisor's one queue), answering once applied. The socket handler never
changes state itself."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from vllm_sr import wire
from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.control import routes
from vllm_sr.control.auth import AccessPolicy
from vllm_sr.control.outcome_policy import OutcomePolicy
from vllm_sr.control.routes import ControlBackend
from vllm_sr.control.socketfile import bind_socket, group_gid, remove_if_ours
from vllm_sr.control.stream import EventStream
from vllm_sr.httpserver import HttpServer, Request, Response, StreamResponse

__all__ = ["ControlBackend", "ControlServer"]

log = logging.getLogger("vllm_sr.control")

DEFAULT_SOCKET = Path("/run/vllm-sr/control.sock")
MAX_BODY = wire.CONTROL_MAX_BODY_BYTES
STOP_GRACE_S = 2.0  # on stop, requests in hand (a stream's last line) get this long


def missing_groups_warning(socket_group: str | None, admin_group: str | None) -> str:
    """One warning for the host settings' groups that do not exist here (``control_group``,
    ``admin_group``): what the service does instead, and what the operator can do about it."""
    effects = []
    if socket_group:
        effects.append(
            f"the control socket keeps the service's own group (gid {os.getegid()}), so only "
            "root and that group's members can use vllm-sr status, ctl and vllm-sr-top"
        )
    if admin_group:
        effects.append("only root and the service user may change the service")
    names = list(dict.fromkeys(g for g in (socket_group, admin_group) if g))
    keys = [k for k, g in (("control_group", socket_group), ("admin_group", admin_group)) if g]
    which = " and ".join(f"{n!r}" for n in names)
    it = "it" if len(names) == 1 else "them"
    packaged = "; the vllm-sr package's sysusers file does" if names[0] == "vllm-sr" else ""
    return (
        f"group {which} ({', '.join(keys)}) does not exist: {'; '.join(effects)}. To fix: "
        f"create {it} (sudo groupadd --system {names[0]}{packaged}) and add operators "
        f"(sudo usermod -aG {names[0]} USER), or name an existing "
        f"group as {' / '.join(keys)} in the host settings (/etc/vllm-sr/vllm-sr.toml, or "
        '--service-config); control_group = "" keeps the service\'s own group, without this '
        "warning"
    )


class ControlServer:
    """Serves the control API for ``backend`` on the Unix socket ``path``, on the project's one
    HTTP server (``vllm_sr.httpserver``).

    ``group`` owns the socket file (mode 0660); ``admin_group`` and ``service_user`` (default:
    the uid this process runs as) may mutate, as may root; the peer is the kernel's account of
    the connecting process (``Request.peer``, ``SO_PEERCRED``). Timeouts: a connection that
    sends no request for ``idle_timeout_s`` (after opening or after its last answer) is
    closed; a request, head and body, must arrive whole within ``body_timeout_s`` of its
    first byte, else it is answered 408 and its connection closed; and a stream reader that
    does not take a line within ``write_timeout_s`` is cut off. Bodies over ``max_body`` are
    answered 413."""

    def __init__(
        self,
        backend: ControlBackend,
        path: str | Path = DEFAULT_SOCKET,
        *,
        group: str | None = "vllm-sr",
        admin_group: str | None = None,
        service_user: str | None = None,
        heartbeat_s: float = 5.0,
        max_body: int = MAX_BODY,
        idle_timeout_s: float = 15.0,
        body_timeout_s: float = 10.0,
        write_timeout_s: float = 10.0,
        subscriber_queue: int = 1000,
        backlog: int = 1024,
        policy: AccessPolicy | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.backend = backend
        self.path = Path(path)
        self.group = group
        # Both groups are looked up once, here, and a missing one is said once, with what to
        # do (not again at each bind, nor a second time for the admin group).
        self.gid = group_gid(group)
        admin_gid = group_gid(admin_group) if policy is None else None
        missing_admin = admin_group if policy is None and admin_gid is None else None
        missing_socket = group if group and self.gid is None else None
        if missing_socket or missing_admin:
            log.warning("%s", missing_groups_warning(missing_socket, missing_admin))
        self.policy = policy or AccessPolicy(
            service_user=service_user,
            admin_group=admin_group if admin_gid is not None else None,
            admin_gid=admin_gid,
        )
        self.heartbeat_s = heartbeat_s
        self.max_body = max_body
        self.idle_timeout_s = idle_timeout_s
        self.body_timeout_s = body_timeout_s
        self.write_timeout_s = write_timeout_s
        self.subscriber_queue = subscriber_queue
        self.backlog = backlog
        self.clock = clock
        self.outcomes = OutcomePolicy(clock)  # POST /v1/router/outcomes: keys, rate limit
        self.closing = False
        self.streams: set[EventStream] = set()
        self._http: HttpServer | None = None
        self._inode: int | None = None

    @property
    def running(self) -> bool:
        return self._http is not None

    @property
    def connection_count(self) -> int:
        """Open client connections (streams included)."""
        return len(self._http.connections) if self._http is not None else 0

    async def _handle(self, request: Request) -> Response | StreamResponse:
        return await routes.handle(self, request)

    async def start(self) -> None:
        """Bind the socket (refusing a live one, replacing a stale one) and start serving."""
        if self._http is not None:
            return
        sock, inode = bind_socket(self.path, self.gid, self.backlog, self.group)
        http = HttpServer(
            self._handle,
            max_body=self.max_body,
            read_timeout_s=self.body_timeout_s,
            idle_timeout_s=self.idle_timeout_s,
            # A client that goes away cancels its handler (a stream's; mutations are shielded).
            cancel_on_disconnect=True,
        )
        try:
            await http.listen_unix(sock=sock, backlog=self.backlog)
        except BaseException:
            sock.close()
            remove_if_ours(self.path, inode)
            raise
        self.closing = False
        self._http = http
        self._inode = inode
        log.info("control API listening on %s", self.path)

    async def stop(self) -> None:
        """End every stream, stop listening and remove the socket file (if still ours)."""
        http, self._http = self._http, None
        if http is None:
            return
        self.closing = True
        for stream in list(self.streams):
            stream.wake()
        remove_if_ours(self.path, self._inode)
        self._inode = None
        await http.close(STOP_GRACE_S)
        log.info("control API on %s stopped", self.path)

    async def __aenter__(self) -> ControlServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
