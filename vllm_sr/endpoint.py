"""The endpoint grammar of an attached runtime, in one home: ``parse_endpoint`` is what the
worker client connects with, and ``endpoint_problem`` is what the config schema can validate
with, so a config that validates is a config the service can serve.

Accepted (``ENDPOINT_ACCEPTED``): ``http://HOST[:PORT][/PREFIX]``,
``https://HOST[:PORT][/PREFIX]`` (TLS, the certificate verified against the system CA store or a
given CA file), ``unix:/path/to.sock`` and ``unix:///path/to.sock``. Refused, each with its
reason: other schemes, credentials in the URL, a missing host, a port that is not 1-65535, a
query or fragment, a ``unix://HOST/...`` form (a Unix socket has no host), a socket path that
is relative, ends in ``/``, holds a NUL byte or is longer than the kernel's 107 bytes.

Pure: no I/O, standard library only (the schema imports it, and ``config`` stays data).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from vllm_sr.errors import ConfigError

ENDPOINT_ACCEPTED = (
    "http://HOST:PORT[/PREFIX], https://HOST:PORT[/PREFIX] (PORT defaults to 80 / 443) "
    "or unix:/path/to.sock (also unix:///path/to.sock)"
)
MAX_UNIX_PATH_BYTES = 107  # sockaddr_un.sun_path is 108 bytes, the last one a NUL

Scheme = Literal["http", "https", "unix"]


@dataclass(frozen=True)
class Endpoint:
    """A parsed endpoint. TCP: ``host`` (no brackets), ``port``, ``prefix`` (no trailing /)
    and ``netloc`` (for the Host header); Unix: ``path``."""

    scheme: Scheme
    host: str = ""
    port: int = 0
    prefix: str = ""
    netloc: str = ""
    path: str = ""

    @property
    def tls(self) -> bool:
        return self.scheme == "https"


class InvalidEndpoint(ConfigError, ValueError):
    """An endpoint outside the grammar; names the value, the reason and what is accepted.
    A ``ValueError`` too, so pydantic validators may let it through as a field error."""

    def __init__(self, value: str, reason: str) -> None:
        message = f"endpoint {value!r}: {reason}; accepted: {ENDPOINT_ACCEPTED}"
        super().__init__(message)
        self.value = value
        self.reason = reason


def endpoint_problem(value: str) -> str | None:
    """Why ``value`` is not an endpoint (the reason alone), or None when it is one."""
    try:
        parse_endpoint(value)
    except InvalidEndpoint as exc:
        return exc.reason
    return None


def parse_endpoint(value: str) -> Endpoint:
    """``value`` -> ``Endpoint``; raises ``InvalidEndpoint`` with the reason."""
    if not value or any(c.isspace() for c in value):
        raise InvalidEndpoint(value, "empty or holds whitespace")
    if value.startswith("unix:"):
        return _parse_unix(value)
    scheme, sep, _ = value.partition("://")
    if not sep or scheme not in ("http", "https"):
        raise InvalidEndpoint(value, f"scheme {scheme if sep else value!r} is not accepted")
    return _parse_tcp(value, "https" if scheme == "https" else "http")


def _parse_unix(value: str) -> Endpoint:
    rest = value[len("unix:") :]
    if rest.startswith("//"):
        if not rest.startswith("///"):
            raise InvalidEndpoint(value, "unix://HOST/... names a host; a Unix socket has none")
        rest = rest[2:]
    if not rest.startswith("/"):
        raise InvalidEndpoint(value, "the socket path must be absolute")
    if rest.endswith("/"):
        raise InvalidEndpoint(value, "the socket path ends in '/' (a directory)")
    if "\0" in rest:
        raise InvalidEndpoint(value, "the socket path holds a NUL byte")
    if len(rest.encode()) > MAX_UNIX_PATH_BYTES:
        raise InvalidEndpoint(
            value, f"the socket path is longer than the kernel's {MAX_UNIX_PATH_BYTES} bytes"
        )
    return Endpoint("unix", path=rest)


def _parse_tcp(value: str, scheme: Scheme) -> Endpoint:
    if "?" in value or "#" in value:
        raise InvalidEndpoint(value, "a query or fragment is not accepted")
    try:
        parts = urlsplit(value)
    except ValueError as exc:  # an unclosed IPv6 bracket and the like
        raise InvalidEndpoint(value, f"not a URL ({exc})") from None
    if "@" in parts.netloc:
        raise InvalidEndpoint(value, "credentials in the URL are not accepted")
    if not parts.hostname:
        raise InvalidEndpoint(value, "no host")
    try:
        port = parts.port
    except ValueError:
        raise InvalidEndpoint(value, "the port is not a number 1-65535") from None
    if port == 0:
        raise InvalidEndpoint(value, "the port is not a number 1-65535")
    default = 443 if scheme == "https" else 80
    return Endpoint(
        scheme,
        host=parts.hostname,
        port=port or default,
        prefix=parts.path.rstrip("/"),
        netloc=parts.netloc,
    )
