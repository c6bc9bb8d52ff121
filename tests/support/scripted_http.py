"""A scripted HTTP/1.1 server for the outbound client's wire tests: each request target is
answered by a scripted reply that writes exact bytes (or resets, or stays silent), so a test
can put on the socket what no real server would. It records every request's head and target,
counts connections and keeps each connection's writer (a test may cut one)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

Reply = Callable[[asyncio.StreamWriter], Awaitable[bool]]  # -> keep the connection open

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


@dataclass
class ScriptedServer:
    """Serve it with ``asyncio.start_server(srv.handle, ...)`` or ``start_unix_server``;
    ``port`` / ``path`` are for the test to fill in."""

    replies: dict[str, Reply]
    port: int = 0
    path: str = ""
    connections: int = 0
    heads: list[bytes] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # the targets, in order
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                target = head.split(b" ", 2)[1].decode()
                self.heads.append(head)
                self.requests.append(target)
                if not await self.replies[target](writer):
                    break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def sends(data: bytes, *, keep: bool = True) -> Reply:
    """A reply that writes ``data`` and keeps the connection (or closes it)."""

    async def reply(writer: asyncio.StreamWriter) -> bool:
        writer.write(data)
        await writer.drain()
        return keep

    return reply
