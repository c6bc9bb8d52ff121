"""The endpoint grammar: every accepted form parses to what the client connects to, every
refused form names the value, the reason and what is accepted."""

from __future__ import annotations

import pytest

from vllm_sr.endpoint import (
    ENDPOINT_ACCEPTED,
    Endpoint,
    InvalidEndpoint,
    endpoint_problem,
    parse_endpoint,
)
from vllm_sr.errors import ConfigError


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("http://127.0.0.1:8000", Endpoint("http", "127.0.0.1", 8000, "", "127.0.0.1:8000")),
        ("http://runtime", Endpoint("http", "runtime", 80, "", "runtime")),
        ("https://runtime", Endpoint("https", "runtime", 443, "", "runtime")),
        (
            "https://h.example:8443/v1/",
            Endpoint("https", "h.example", 8443, "/v1", "h.example:8443"),
        ),
        ("http://[::1]:9000/a/b", Endpoint("http", "::1", 9000, "/a/b", "[::1]:9000")),
        ("unix:/run/vllm/a.sock", Endpoint("unix", path="/run/vllm/a.sock")),
        ("unix:///run/vllm/a.sock", Endpoint("unix", path="/run/vllm/a.sock")),
    ],
)
def test_accepted_forms(value: str, expected: Endpoint) -> None:
    assert parse_endpoint(value) == expected
    assert endpoint_problem(value) is None


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("ftp://x:21", "scheme 'ftp'"),
        ("runtime:8000", "scheme 'runtime:8000'"),
        ("http://user:pw@h:1", "credentials"),
        ("http://:8000", "no host"),
        ("http://h:port", "port is not a number"),
        ("http://h:70000", "port is not a number"),
        ("http://h:0", "port is not a number"),
        ("http://h:1/v1?x=1", "query or fragment"),
        ("http://h?x", "query or fragment"),
        ("http://[::1", "not a URL"),
        ("http://h :1", "whitespace"),
        ("unix://host/run/a.sock", "names a host"),
        ("unix:relative.sock", "absolute"),
        ("unix:/run/dir/", "ends in '/'"),
        ("unix:/run/a\0b", "NUL"),
        ("unix:/" + "a" * 107, "107 bytes"),
    ],
)
def test_refused_forms_say_why(value: str, reason: str) -> None:
    with pytest.raises(InvalidEndpoint) as info:
        parse_endpoint(value)
    exc = info.value
    assert reason in exc.reason and repr(value) in str(exc) and ENDPOINT_ACCEPTED in str(exc)
    assert isinstance(exc, ConfigError) and isinstance(exc, ValueError)
    assert endpoint_problem(value) == exc.reason


def test_longest_socket_path_is_accepted() -> None:
    path = "/" + "a" * 106
    assert parse_endpoint("unix:" + path).path == path
