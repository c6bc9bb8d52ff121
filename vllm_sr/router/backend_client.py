"""The one outbound client for LLM backends: httpx's ``AsyncClient``, configured once here, and
the rules that turn its failures into what the router acts on.

Why httpx and not the workers' client (``vllm_sr.pool.client``, see docs/internals.md "One
outbound client"): a chat to a backend is a long exchange whose answer is streamed through
chunk by chunk, over TLS to providers on the internet, to a handful of hosts shared by every
chat, where the workers' client is built for short buffered exchanges with one worker each.
httpx already brings what a backend needs (TLS with hostname checks, incremental reads,
content decoding, one pool with a connection cap, per-phase timeouts) and is already the
control client's library.

- TLS: an ``https://`` backend is verified against the system's CA store
  (``ssl.create_default_context``: OpenSSL's ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` point it
  elsewhere), not certifi's bundle (httpx's default).
- Redirects are not followed: a backend's 3xx is its answer (a chat must not be re-sent to a
  URL a backend names, nor turned into a GET).
- No environment: proxies (``HTTP(S)_PROXY``) and ``.netrc`` are not read (``trust_env`` off),
  so a credential goes nowhere but the configured backend.
- One pool for every backend: at most ``MAX_CONNECTIONS`` open at once (a chat beyond it waits
  for one, within its deadline); idle ones are closed after ``KEEPALIVE_EXPIRY_S``, under the
  5 s keep-alive of uvicorn (vLLM's server), so a chat is not sent on a connection the backend
  is closing. As many may stay idle as may be open: httpcore 1.0 compares its keep-alive limit
  with every connection, not the idle ones, so a lower limit would close each connection as
  soon as it is idle whenever more than that many are open (no reuse under load).
- Timeouts per phase: ``CONNECT_TIMEOUT_S`` to connect, ``READ_TIMEOUT_S`` between two reads
  (a slow model may think a while before its first token), no total (a long stream is fine).
"""

from __future__ import annotations

import logging
import ssl

import httpx

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 600.0  # between two chunks of an answer: a slow model may think for a while
WRITE_TIMEOUT_S = 60.0  # sending a chat's body
MAX_CONNECTIONS = 1024
KEEPALIVE_EXPIRY_S = 4.0

# httpx logs every request at INFO; a chat is counted and timed by the router, not logged.
if logging.getLogger("httpx").level == logging.NOTSET:
    logging.getLogger("httpx").setLevel(logging.WARNING)


def backend_client(
    *,
    max_connections: int = MAX_CONNECTIONS,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    read_timeout_s: float = READ_TIMEOUT_S,
    tls: ssl.SSLContext | None = None,
) -> httpx.AsyncClient:
    """The client every backend request goes through (module docstring)."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(
            connect=connect_timeout_s, read=read_timeout_s, write=WRITE_TIMEOUT_S, pool=None
        ),
        limits=httpx.Limits(
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
        ),
        verify=tls if tls is not None else ssl.create_default_context(),
        follow_redirects=False,
        trust_env=False,
    )


# A backend request that did not get a whole answer: no connection, a connection that broke,
# an answer that cannot be decoded, or a timeout (``is_timeout`` tells those apart; the
# builtin TimeoutError, which asyncio raises, is an OSError).
BROKEN: tuple[type[Exception], ...] = (httpx.TransportError, httpx.DecodingError, OSError)


def is_timeout(exc: BaseException) -> bool:
    """A read, write or pool wait that ran out (a connect that did is unreachable)."""
    if isinstance(exc, httpx.ConnectTimeout):
        return False
    return isinstance(exc, httpx.TimeoutException | TimeoutError)


def connection_reason(exc: BaseException) -> str:
    """``connect`` for a connection that could not be opened (refused, unreachable, TLS
    refused, connect timed out), else ``reset`` (the backend dropped or broke it)."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | ConnectionRefusedError):
        return "connect"
    return "reset"


def media_type(response: httpx.Response) -> str:
    """The answer's Content-Type without parameters, lower case (``text/event-stream``)."""
    return response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
