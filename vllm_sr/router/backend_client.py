"""The one outbound client for LLM backends: the workers' own client
(:class:`vllm_sr.pool.client.WorkerClient`, httptools on asyncio protocols), one per backend
origin, configured here, and the rules that turn its failures into what the router acts on.

Why that client (docs/internals.md "One outbound client"): a chat through the router is one
exchange in and one out, and the outbound one was most of the router's own cost with a
general client (httpx spent 1.8-2.8 ms of CPU per non-streamed chat; this one a fraction of
that). It streams an answer through as it arrives, with flow control, verifies TLS and never
follows redirects.

- TLS: an ``https://`` backend is verified against the system's CA store
  (``ssl.create_default_context``: OpenSSL's ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` point it
  elsewhere), one context for every backend, made once.
- Redirects are not followed: a backend's 3xx is its answer (a chat must not be re-sent to a
  URL a backend names, nor turned into a GET).
- No environment: proxies (``HTTP(S)_PROXY``) and ``.netrc`` are not read, so a credential
  goes nowhere but the configured backend.
- One client per origin (scheme, host and port; backends on one server share it): at most
  ``MAX_CONNECTIONS`` open to it at once (a chat beyond it waits for one, within its
  deadline), as many may stay idle; idle ones older than ``KEEPALIVE_EXPIRY_S`` are closed
  rather than reused, under the 5 s keep-alive of uvicorn (vLLM's server), so a chat is not
  sent on a connection the backend is closing.
- Timeouts per phase: ``CONNECT_TIMEOUT_S`` to connect, ``WRITE_TIMEOUT_S`` to send a chat's
  body, ``READ_TIMEOUT_S`` for the answer's head and between two reads of its body (a slow
  model may think a while before its first token), no total (a long stream is fine).
"""

from __future__ import annotations

import ssl

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.endpoint import InvalidEndpoint, parse_endpoint
from vllm_sr.pool.client import Broken, WorkerClient

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 600.0  # between two chunks of an answer: a slow model may think for a while
WRITE_TIMEOUT_S = 60.0  # sending a chat's body
MAX_CONNECTIONS = 1024  # per backend origin
KEEPALIVE_EXPIRY_S = 4.0


class BackendClients:
    """The clients every backend request goes through (module docstring): ``for_url`` gives
    the one for a backend's API base, made on first use."""

    def __init__(
        self,
        *,
        max_connections: int = MAX_CONNECTIONS,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        read_timeout_s: float = READ_TIMEOUT_S,
        tls: ssl.SSLContext | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.max_connections = max_connections
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._tls = tls
        self._clock = clock
        self._by_origin: dict[tuple[str, str], WorkerClient] = {}
        self._by_base: dict[str, tuple[WorkerClient, str]] = {}

    def for_url(self, api_base: str) -> tuple[WorkerClient, str]:
        """(the client for ``api_base``'s origin, its path prefix, e.g. ``/v1``). A base that
        is not an ``http(s)://`` URL raises ``Broken`` (as a backend that cannot be reached)."""
        known = self._by_base.get(api_base)
        if known is not None:
            return known
        try:
            ep = parse_endpoint(api_base)
            if ep.scheme == "unix":
                raise InvalidEndpoint(api_base, "a backend is http:// or https://")
        except InvalidEndpoint as exc:
            raise Broken(f"cannot connect: {exc}", before_answer=True, connecting=True) from exc
        key = (ep.scheme, ep.netloc)
        client = self._by_origin.get(key)
        if client is None:
            if ep.tls and self._tls is None:
                self._tls = ssl.create_default_context()  # the system store, read once
            client = WorkerClient(
                base_url=f"{ep.scheme}://{ep.netloc}",
                replica_id=f"{ep.scheme}://{ep.netloc}",
                ssl_context=self._tls,
                max_idle=self.max_connections,
                max_connections=self.max_connections,
                idle_expiry_s=KEEPALIVE_EXPIRY_S,
                connect_timeout_s=self._connect_timeout_s,
                read_timeout_s=self._read_timeout_s,
                write_timeout_s=WRITE_TIMEOUT_S,
                clock=self._clock,
            )
            self._by_origin[key] = client
        self._by_base[api_base] = (client, ep.prefix)
        return client, ep.prefix

    async def aclose(self) -> None:
        clients = list(self._by_origin.values())
        self._by_origin.clear()
        self._by_base.clear()
        for client in clients:
            await client.close()


# A backend request that did not get a whole answer: no connection, a connection that broke,
# or a timeout (``is_timeout`` tells those apart; the builtin TimeoutError, which the client
# and asyncio raise, is an OSError).
BROKEN: tuple[type[Exception], ...] = (Broken, OSError)


def is_timeout(exc: BaseException) -> bool:
    """A read, write or caller's deadline that ran out (a connect that did is ``connect``)."""
    return isinstance(exc, TimeoutError)


def connection_reason(exc: BaseException) -> str:
    """``connect`` for a connection that could not be opened (refused, unreachable, TLS
    refused, connect timed out), else ``reset`` (the backend dropped or broke it)."""
    if (isinstance(exc, Broken) and exc.connecting) or isinstance(exc, ConnectionRefusedError):
        return "connect"
    return "reset"
