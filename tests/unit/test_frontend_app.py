"""Frontend helpers without sockets: the caller's deadline header, error bodies and
Retry-After, reading only ``model`` from a body, the outcome of a worker's status, and Engine
mode's answer to the Router-mode paths."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vllm_sr.errors import InvalidRequest, Overloaded, Unavailable, WorkerFailed
from vllm_sr.frontend.app import Frontend, caller_timeout_ms, error_response, model_of
from vllm_sr.httpserver import Request
from vllm_sr.plan import RouterPlan
from vllm_sr.pool.directory import PoolDirectory
from vllm_sr.pool.exchange import outcome_of, with_model


def body_of(resp: Any) -> dict[str, Any]:
    return dict(json.loads(resp.body))


def request(headers: dict[str, str] | None = None) -> Request:
    """A request as the server hands it over (header names lower-cased)."""
    return Request(
        "POST", "/v1/embeddings", "", {k.lower(): v for k, v in (headers or {}).items()}, b""
    )


def test_timeout_header_is_optional_positive_milliseconds() -> None:
    assert caller_timeout_ms(request()) is None
    req = request({"X-Request-Timeout-Ms": "250"})
    assert caller_timeout_ms(req) == 250.0
    for bad in ("0", "-5", "nan", "inf", "soon"):
        req = request({"X-Request-Timeout-Ms": bad})
        with pytest.raises(InvalidRequest, match=f"got '{bad}'"):
            caller_timeout_ms(req)


def test_overload_and_unavailable_carry_retry_after_in_whole_seconds() -> None:
    resp = error_response(Overloaded("full", retry_after_s=0.2))
    assert resp.status == 429 and resp.headers["Retry-After"] == "1"
    assert body_of(resp)["error"]["code"] == "overloaded"
    resp = error_response(Unavailable("none ready", retry_after_s=2.5))
    assert resp.status == 503 and resp.headers["Retry-After"] == "3"
    resp = error_response(WorkerFailed("gone"))
    assert resp.status == 502 and "Retry-After" not in resp.headers
    assert body_of(resp)["error"] == {"code": "worker_failed", "message": "gone", "retryable": True}


def test_model_field_only() -> None:
    assert model_of(b'{"model": "primary", "input": ["a"]}') == "primary"
    assert model_of(b'{"input": "a"}') is None
    with pytest.raises(InvalidRequest, match="'model' must be a string"):
        model_of(b'{"model": ["x"]}')
    with pytest.raises(InvalidRequest, match="not valid JSON"):
        model_of(b'{"model": ')


def test_worker_status_to_pool_outcome() -> None:
    # A runtime that does not say whether a forward produced its answer (issue 25: only a
    # forward's answer is a success; test_forward_outcomes.py has the worker's own marks).
    assert [outcome_of(s) for s in (200, 400, 404, 413, 429, 500, 503, 504)] == [
        "success",
        "no_forward",
        "no_forward",
        "no_forward",
        "refused",
        "failure",
        "failure",
        "timeout",
    ]


def test_attached_model_rewrite_keeps_the_rest() -> None:
    out = json.loads(with_model(b'{"model": "primary", "input": ["a", "b"], "x": 1}', "remote"))
    assert out == {"model": "remote", "input": ["a", "b"], "x": 1}


class EngineService:
    """What the frontend reads of a service in Engine mode (``serve -e``): no router plan."""

    directory = PoolDirectory()
    admitting = True

    def router_plan(self) -> RouterPlan | None:
        return None


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/responses"),
        ("GET", "/v1/responses/resp_1"),
        ("DELETE", "/v1/responses/resp_1"),
        ("GET", "/v1/responses/resp_1/input_items"),
        ("POST", "/api/v1/eval"),
    ],
)
async def test_engine_mode_answers_a_router_path_naming_that_path(method: str, path: str) -> None:
    frontend = Frontend(EngineService())  # type: ignore[arg-type]
    try:
        body = b'{"model": "auto", "input": "hi"}' if method == "POST" else b""
        answer = await frontend.handle(Request(method, path, "", {}, body))
        assert answer.status == 404
        error = body_of(answer)["error"]
        assert error["code"] == "engine_mode"
        assert error["message"].startswith(f"{path} is not served: it is a Router-mode surface")
        assert "Engine mode (serve -e)" in error["message"]
        if path != "/v1/chat/completions":
            assert "chat completions" not in error["message"]
    finally:
        await frontend.stop()
