"""One parser for JSON request bodies (the control API's and the worker's): decode UTF-8, parse,
require an object, and validate it with a pydantic model when given one. Each failure is
``InvalidRequest`` (400) with a message that starts with ``body:`` and says what was wrong (not
UTF-8, not JSON, not an object), or names each field the model refuses by its path.

The body arrives whole: the one server (``vllm_sr.httpserver``) reads it within its size cap and
read timeout, and hands a refusal to the handler as ``Request.error`` instead: 413, or
``RequestTimeout`` (408, the client stalled), which lives here because the clients map the
wire code back to it without importing a server."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar, overload

from pydantic import BaseModel, ValidationError

from vllm_sr.errors import DeadlineExceeded, InvalidRequest

M = TypeVar("M", bound=BaseModel)
Loads = Callable[[str], Any]

__all__ = ["RequestTimeout", "describe", "parse_json"]


class RequestTimeout(DeadlineExceeded):
    """The client stalled while sending its request (HTTP 408; the server is fine)."""

    code = "request_timeout"
    http_status = 408
    retryable = False


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number" if isinstance(value, int | float) else "value")


def describe(exc: ValidationError) -> str:
    """A pydantic refusal as one line naming each field, what was wrong and the value sent."""
    parts = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "body"
        if err["type"] == "extra_forbidden":
            parts.append(f"{field}: unknown field")
        else:
            parts.append(f"{field}: {err['msg']} (got {err.get('input')!r})")
    return "; ".join(parts)


@overload
def parse_json(
    raw: bytes, model: None = None, *, allow_empty: bool = ..., loads: Loads = ...
) -> dict[str, Any]: ...
@overload
def parse_json(raw: bytes, model: type[M], *, allow_empty: bool = ..., loads: Loads = ...) -> M: ...
def parse_json(
    raw: bytes,
    model: type[M] | None = None,
    *,
    allow_empty: bool = False,
    loads: Loads = json.loads,
) -> M | dict[str, Any]:
    """The bytes of a body as a JSON object (or ``model``); ``allow_empty``: no body is ``{}``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"body: not UTF-8 (bad byte at offset {exc.start})") from None
    if allow_empty and not text.strip():
        data: Any = {}
    else:
        try:
            data = loads(text)
        except ValueError as exc:
            raise InvalidRequest(f"body: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InvalidRequest(f"body: expected a JSON object, got {_json_type(data)}")
    if model is None:
        return data
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidRequest(describe(exc)) from None
