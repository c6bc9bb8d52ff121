"""The one wire vocabulary: the error answer, its Retry-After rule, the deadline header."""

from __future__ import annotations

import json

import pytest

from vllm_sr import wire
from vllm_sr.errors import (
    ConfigError,
    DeadlineExceeded,
    InvalidRequest,
    MethodNotAllowed,
    NotReady,
    Overloaded,
    Unavailable,
    WorkerFailed,
)
from vllm_sr.httpserver import error_response


def test_retry_after_rounds_up_never_below_one() -> None:
    assert wire.error_headers(Overloaded("full", retry_after_s=0.2))["Retry-After"] == "1"
    assert wire.error_headers(Overloaded("full", retry_after_s=1.01))["Retry-After"] == "2"
    assert wire.error_headers(Unavailable("none", retry_after_s=2.5))["Retry-After"] == "3"
    assert wire.error_headers(Unavailable("none"))["Retry-After"] == "1"
    assert wire.error_headers(NotReady("loading"))["Retry-After"] == "1"


def test_errors_that_do_not_ask_for_a_later_retry_carry_no_retry_after() -> None:
    for exc in (WorkerFailed("gone"), DeadlineExceeded("late"), InvalidRequest("bad")):
        assert "Retry-After" not in wire.error_headers(exc)


def test_the_one_error_answer_as_the_server_renders_it() -> None:
    resp = error_response(MethodNotAllowed("no", allowed=["GET", "HEAD"]))
    assert resp.status == 405 and resp.headers["Allow"] == "GET, HEAD"
    doc = json.loads(resp.body)
    assert doc["error"]["code"] == "method_not_allowed" and doc["error"]["retryable"] is False
    resp = error_response(Overloaded("full", retry_after_s=4.2))
    assert resp.status == 429 and resp.headers["Retry-After"] == "5"
    assert json.loads(resp.body)["error"]["retryable"] is True


def test_config_error_lists_every_problem() -> None:
    doc = wire.error_document(ConfigError("2 problems", ["a: bad", "b: worse"]))
    assert doc["error"]["details"]["problems"] == ["a: bad", "b: worse"]
    assert "details" not in wire.error_document(ConfigError("one"))["error"]


def test_deadline_header() -> None:
    assert wire.deadline_ms(None) is None
    assert wire.deadline_ms("250.5") == 250.5
    for bad in ("0", "-5", "nan", "inf", "soon", ""):
        with pytest.raises(InvalidRequest, match=f"{wire.DEADLINE_HEADER}.*got '{bad}'"):
            wire.deadline_ms(bad)
    assert wire.deadline_header_value(0.0) == "1"
    assert wire.deadline_header_value(1.2345) == "1234"
