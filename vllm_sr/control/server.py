"""The control API: HTTP over a Unix socket (like Docker's), so ``curl --unix-socket`` works.

Reads answer from the backend's state; mutations are turned into ``Command``s and submitted to
the backend (the supervisor's one queue), answering once applied. The socket handler never
changes state itself."""

from __future__ import annotations

import logging
from pathlib import Path

from aiohttp import web

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.control import routes
from vllm_sr.control.auth import AccessPolicy
from vllm_sr.control.routes import ControlBackend
from vllm_sr.control.socketfile import bind_socket, remove_if_ours

__all__ = ["ControlBackend", "ControlServer"]

log = logging.getLogger("vllm_sr.control")

DEFAULT_SOCKET = Path("/run/vllm-sr/control.sock")
MAX_BODY = 64 * 1024


class ControlServer:
    """Serves the control API for ``backend`` on the Unix socket ``path``.

    ``group`` owns the socket file (mode 0660); ``admin_group`` and ``service_user`` (default:
    the uid this process runs as) may mutate, as may root. Timeouts: a connection that does not
    complete a request's headers within ``idle_timeout_s`` is closed, a body must arrive within
    ``body_timeout_s``, and a stream reader that does not take a line within
    ``write_timeout_s`` is cut off."""

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
        self.policy = policy or AccessPolicy(service_user=service_user, admin_group=admin_group)
        self.heartbeat_s = heartbeat_s
        self.max_body = max_body
        self.idle_timeout_s = idle_timeout_s
        self.body_timeout_s = body_timeout_s
        self.write_timeout_s = write_timeout_s
        self.subscriber_queue = subscriber_queue
        self.backlog = backlog
        self.clock = clock
        self.closing = False
        self.streams: set[routes.EventStream] = set()
        self._runner: web.AppRunner | None = None
        self._inode: int | None = None

    @property
    def running(self) -> bool:
        return self._runner is not None

    @property
    def connection_count(self) -> int:
        """Open client connections (streams included)."""
        server = self._runner.server if self._runner is not None else None
        return len(server.connections) if server is not None else 0

    async def start(self) -> None:
        """Bind the socket (refusing a live one, replacing a stale one) and start serving."""
        if self._runner is not None:
            return
        sock, inode = bind_socket(self.path, self.group, self.backlog)
        app = web.Application(
            client_max_size=self.max_body,
            middlewares=[routes.error_middleware],
        )
        app[routes.SERVER_KEY] = self
        routes.add_routes(app)
        runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            # A client that goes away cancels its handler (mutations are shielded).
            handler_cancellation=True,
            # aiohttp arms this timer at connection start and after each response, so it also
            # closes connections that never finish sending a request's headers.
            keepalive_timeout=self.idle_timeout_s,
            # After an early answer (403, 413, 408) the rest of a body is read and dropped for
            # at most this long, so a stalled body cannot hold the connection open either.
            lingering_time=self.body_timeout_s,
            max_line_size=8190,
            max_field_size=8190,
        )
        try:
            await runner.setup()
            site = web.SockSite(runner, sock, shutdown_timeout=2.0, backlog=self.backlog)
            await site.start()
        except BaseException:
            await runner.cleanup()
            sock.close()
            remove_if_ours(self.path, inode)
            raise
        self._runner = runner
        self._inode = inode
        log.info("control API listening on %s", self.path)

    async def stop(self) -> None:
        """End every stream, stop listening and remove the socket file (if still ours)."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        self.closing = True
        for stream in list(self.streams):
            stream.wake()
        remove_if_ours(self.path, self._inode)
        self._inode = None
        await runner.cleanup()
        log.info("control API on %s stopped", self.path)

    async def __aenter__(self) -> ControlServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
