"""What a handler gets and gives back: ``Request`` (read whole) and ``Response`` (sent whole),
and the bytes of an answer's head. A streamed answer is ``vllm_sr.httpserver.streaming``'s."""

from __future__ import annotations

import http
from collections.abc import Mapping
from typing import TYPE_CHECKING

from vllm_sr.errors import VllmSrError
from vllm_sr.httpserver.peer import PeerCredentials

if TYPE_CHECKING:
    from vllm_sr.httpserver.connection import Connection


class Request:
    """One request, read whole. ``headers`` has lower-case names (repeated ones joined with
    ", "); ``error`` is set when the request could not be read (its body is then empty).
    ``peer`` is the process at the other end of a Unix socket as the kernel vouches for it
    (``SO_PEERCRED``; None over TCP or for a request made outside a server); ``version`` is
    the request's HTTP version ("1.1" or "1.0")."""

    __slots__ = ("body", "conn", "error", "headers", "method", "path", "peer", "query", "version")

    def __init__(
        self,
        method: str,
        path: str,
        query: str,
        headers: dict[str, str],
        body: bytes,
        error: VllmSrError | None = None,
        conn: Connection | None = None,
        peer: PeerCredentials | None = None,
        version: str = "1.1",
    ) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.error = error
        self.conn = conn  # where a StreamResponse writes (None: made outside a server)
        self.peer = peer
        self.version = version


class Response:
    __slots__ = ("body", "content_type", "headers", "status")

    def __init__(
        self,
        body: bytes = b"",
        status: int = 200,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.body = body
        self.status = status
        self.content_type = content_type
        self.headers = headers if headers is not None else {}


def reason(status: int) -> bytes:
    try:
        return http.HTTPStatus(status).phrase.encode()
    except ValueError:
        return b"Unknown"


def header_lines(content_type: str, headers: Mapping[str, str]) -> list[bytes]:
    """``Content-Type`` and ``headers`` as ``Name: value`` lines, UTF-8 (names from a config
    may be any text, and a client library sends them that way too); a CR or LF, which would
    end the head early, is refused."""
    lines = []
    for name, value in (("Content-Type", content_type), *headers.items()):
        line = f"{name}: {value}"
        if "\r" in line or "\n" in line:
            raise ValueError(f"header {name!r}: a CR or LF is not allowed in {value!r}")
        lines.append(line.encode("utf-8"))
    return lines


def render(response: Response, *, head_only: bool, close: bool) -> bytes:
    """The bytes of one answer: status line, headers, and the body unless ``head_only``."""
    lines = [
        b"HTTP/1.1 %d %s" % (response.status, reason(response.status)),
        *header_lines(response.content_type, response.headers),
        b"Content-Length: %d" % len(response.body),
    ]
    if close:
        lines.append(b"Connection: close")
    lines.append(b"\r\n")
    head = b"\r\n".join(lines)
    return head if head_only else head + response.body
