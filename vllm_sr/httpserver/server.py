"""``HttpServer``: listens on Unix sockets and TCP ports, makes a ``Connection`` per client,
caps how many it holds, and closes them all with a grace (``close(grace_s)``)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

from vllm_sr import wire
from vllm_sr.errors import Unavailable
from vllm_sr.httpserver.connection import Connection
from vllm_sr.httpserver.routing import Handler

IDLE_TIMEOUT_S = 75.0  # a kept-alive connection with no request for this long is closed

FULL_ANSWER = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
)


class HttpServer:
    """Serves ``handler`` on Unix sockets and TCP ports (``listen_unix``, ``listen_tcp``)."""

    def __init__(
        self,
        handler: Handler,
        *,
        max_body: int,
        read_timeout_s: float,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        cancel_on_disconnect: bool = False,
        max_connections: int | None = None,
    ) -> None:
        if max_body < 0:
            raise ValueError(f"max_body: {max_body} is below 0")
        if read_timeout_s <= 0:
            raise ValueError(f"read_timeout_s: {read_timeout_s} is not above 0")
        if idle_timeout_s <= 0:
            raise ValueError(f"idle_timeout_s: {idle_timeout_s} is not above 0")
        if max_connections is not None and max_connections < 1:
            raise ValueError(f"max_connections: {max_connections} is below 1")
        self.handler = handler
        self.max_body = max_body
        self.read_timeout_s = read_timeout_s
        self.idle_timeout_s = idle_timeout_s
        # True: a request whose client hangs up is cancelled (the frontend frees its slot);
        # False: it runs to its end (a worker's forward is queued already).
        self.cancel_on_disconnect = cancel_on_disconnect
        self.connections: set[Connection] = set()
        self.max_connections = max_connections  # None: no cap (a worker: only the frontend)
        self.turned_away = 0  # connections answered 503 at the cap
        body = wire.error_body(Unavailable("too many open connections; try again shortly"))
        self.full_answer = FULL_ANSWER % (len(body), body)
        self.servers: list[asyncio.AbstractServer] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._all_gone: asyncio.Event | None = None  # set by close(): the last one went

    def forget(self, conn: Connection) -> None:
        self.connections.discard(conn)
        if not self.connections and self._all_gone is not None:
            self._all_gone.set()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _protocol(self) -> Connection:
        return Connection(self)

    async def listen_unix(
        self, path: str | None = None, *, sock: socket.socket | None = None, backlog: int = 100
    ) -> None:
        """Listen on the Unix socket ``path``, or on ``sock``, bound and published by the
        caller (the control socket gets its mode and group before anyone can connect)."""
        server = await self.loop.create_unix_server(
            self._protocol, path, sock=sock, backlog=backlog
        )
        self.servers.append(server)

    async def listen_tcp(self, host: str, port: int) -> tuple[str, int]:
        """Listen on ``host:port`` (port 0: any free one); returns the address bound."""
        server = await self.loop.create_server(self._protocol, host, port, reuse_address=True)
        self.servers.append(server)
        address: Any = server.sockets[0].getsockname()
        return str(address[0]), int(address[1])

    def stop_accepting(self) -> None:
        for server in self.servers:
            server.close()

    async def close(self, grace_s: float) -> None:
        """Stop accepting; answer the requests being handled within ``grace_s``, close every
        connection."""
        self.stop_accepting()
        self._all_gone = asyncio.Event()
        for conn in list(self.connections):
            conn.shut()
        if self.connections:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_gone.wait(), grace_s)
        for conn in list(self.connections):
            conn.abort()
        for server in self.servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self.servers.clear()
