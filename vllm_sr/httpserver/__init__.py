"""The one HTTP/1.1 server of vllm-sr: the frontend, the workers and the control socket all
serve on it. Requests are parsed by ``httptools`` (llhttp, the parser uvicorn uses) fed straight
from an asyncio protocol.

A worker answers every request the frontend forwards, on the same core as its forwards, and the
frontend every request of every caller, so the Python work per request is worth keeping small:
no URL objects, header multidicts, middleware chains or per-request streams. The whole body is
read before the handler runs (bodies are small and capped), and an answer goes out in one write
with a ``Content-Length``; a ``StreamResponse`` goes out as it is made (Router mode's SSE, the
control socket's event stream), and ``cancel_on_disconnect`` cancels a request whose caller
hangs up (the frontend, the control socket).

The package, one thing a module:
- ``types``: ``Request`` and ``Response``, and the bytes of an answer's head;
- ``streaming``: ``StreamResponse`` (chunked to HTTP/1.1, close-delimited to HTTP/1.0);
- ``routing``: ``Handler``, ``resolve`` and ``PathRoutes`` (path -> method -> route; 404, 405),
  ``answer`` (a ``PathRoutes`` request's route run, or its 404 / 405) and ``error_response``,
  the one error answer (``vllm_sr.wire``);
- ``peer``: the kernel's account of a Unix socket's peer (``SO_PEERCRED``), ``Request.peer``;
- ``connection``: the asyncio protocol that reads, queues and answers one connection;
- ``server``: ``HttpServer``: listening, the connection cap, ``close(grace_s)``.

What it does, and what the tests pin down:
- keep-alive (HTTP/1.1 by default, ``Connection: close`` and HTTP/1.0 honoured; a connection
  idle ``idle_timeout_s`` between requests, or before its first, is closed: 75 s by default,
  the common keep-alive bound), requests pipelined on one connection answered in order,
  ``Content-Length`` and chunked bodies, ``Expect: 100-continue``, HEAD answered like GET
  without a body;
- a body over ``max_body`` is refused (413) as soon as it is known to be: at once when its
  ``Content-Length`` says so, when a chunked body crosses the cap otherwise. What the client
  still sends of that request is read and dropped, then the connection closes, so the client
  reads the 413 rather than a reset;
- a request not whole ``read_timeout_s`` after its first byte (its head or its body stalled) is
  answered 408 and its connection closed (other connections are not held up; while the server
  itself holds a pipelined request back, its clock stops);
- a request head (request line and headers) over ``MAX_HEAD_BYTES`` is refused (413; one
  header is measured as it arrives, not only once it ends) and bytes that are not HTTP get 400;
  both close the connection, and when answers are still owed on it the refusal is not sent:
  those answers go out, then the connection closes;
- a request whose ``Transfer-Encoding`` is anything but exactly ``chunked`` (``identity,
  chunked``, ``gzip, chunked``, ``chunked, chunked`` ...) is refused 501 and its connection
  closed: RFC 9112 asks that of a server that does not implement the coding, and framing a
  body by a coding list is where request smuggling lives;
- with ``max_connections``, a connection past that many open ones is answered 503
  ``unavailable`` (``Retry-After: 1``) and closed at once, so a flood of idle connections
  cannot take the file descriptors that worker restarts and the control socket need;
- over a Unix socket, ``Request.peer`` is who connected (pid, uid, gid; groups on demand), read
  from the kernel when the connection was accepted.

Errors found while reading (413, 408) reach the handler as ``Request.error`` rather than being
answered here, so the application answers them like any other error (its headers, its
metrics). ``close(grace_s)`` stops accepting, closes idle connections, lets requests being
handled finish within the grace and then closes the rest.
"""

from __future__ import annotations

from vllm_sr.httpserver.connection import (
    LINGER_S,
    MAX_HEAD_BYTES,
    CodingNotImplemented,
    Connection,
)
from vllm_sr.httpserver.peer import PeerCredentials, peer_credentials
from vllm_sr.httpserver.routing import Handler, PathRoutes, answer, error_response, resolve
from vllm_sr.httpserver.server import FULL_ANSWER, IDLE_TIMEOUT_S, HttpServer
from vllm_sr.httpserver.streaming import StreamResponse
from vllm_sr.httpserver.types import Request, Response, header_lines, render

__all__ = [
    "FULL_ANSWER",
    "IDLE_TIMEOUT_S",
    "LINGER_S",
    "MAX_HEAD_BYTES",
    "CodingNotImplemented",
    "Connection",
    "Handler",
    "HttpServer",
    "PathRoutes",
    "PeerCredentials",
    "Request",
    "Response",
    "StreamResponse",
    "answer",
    "error_response",
    "header_lines",
    "peer_credentials",
    "render",
    "resolve",
]
