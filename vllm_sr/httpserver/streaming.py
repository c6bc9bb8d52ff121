"""An answer sent as it is made (Router mode's SSE, the control socket's event stream).

To an HTTP/1.1 request it goes out chunked and the connection serves on after its end. An
HTTP/1.0 client cannot read chunks, so to one the body goes out as it is written and its end
is the connection's close (``Connection: close``), as RFC 9112 frames a body without a length.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_sr.httpserver.types import Request, header_lines, reason

if TYPE_CHECKING:
    from vllm_sr.httpserver.connection import Connection


class StreamResponse:
    """``await prepare(request)`` sends the head, ``await write(data)`` a part (waiting while the
    client reads slower than we write), and ``await write_eof()`` the end; the server ends a
    stream its handler left open. ``write`` raises ``ConnectionResetError`` once the client
    has gone."""

    __slots__ = ("_conn", "chunked", "content_type", "ended", "headers", "status")

    def __init__(
        self,
        status: int = 200,
        content_type: str = "application/octet-stream",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.status = status
        self.content_type = content_type
        self.headers = headers if headers is not None else {}
        self.ended = False
        self.chunked = True  # False once prepared for an HTTP/1.0 client: ends with the close
        self._conn: Connection | None = None

    @property
    def prepared(self) -> bool:
        return self._conn is not None

    async def prepare(self, request: Request) -> None:
        if request.conn is None:
            raise RuntimeError("a streamed answer needs a request read by HttpServer")
        self.chunked = request.version != "1.0"
        framing = b"Transfer-Encoding: chunked" if self.chunked else b"Connection: close"
        lines = [
            b"HTTP/1.1 %d %s" % (self.status, reason(self.status)),
            *header_lines(self.content_type, self.headers),
            framing,
            b"\r\n",
        ]
        self._conn = request.conn
        request.conn.stream = self  # once its head is out, nothing else may answer
        await self._conn.send(b"\r\n".join(lines))

    async def write(self, data: bytes) -> None:
        if self._conn is None:
            raise RuntimeError("write before prepare")
        if data:
            await self._conn.send(b"%x\r\n%s\r\n" % (len(data), data) if self.chunked else data)

    async def write_eof(self) -> None:
        if self._conn is not None and not self.ended:
            self.ended = True
            if self.chunked:
                await self._conn.send(b"0\r\n\r\n")
