"""One reader for JSON request bodies (the control API's and the worker's): read with a size cap
and a read timeout, decode UTF-8, parse, require an object, and validate it with a pydantic model
when given one. Each failure is a typed error whose message starts with ``body:`` and says what
was wrong: ``RequestTooLarge`` (413), ``RequestTimeout`` (408, the client stalled), and
``InvalidRequest`` (400: not UTF-8, not JSON, not an object, or a field the model refuses,
named by its path)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

from pydantic import BaseModel, ValidationError

from vllm_sr.errors import DeadlineExceeded, InvalidRequest, RequestTooLarge

if TYPE_CHECKING:  # the clients import RequestTimeout from here and need no server library
    from aiohttp import web

M = TypeVar("M", bound=BaseModel)
Loads = Callable[[str], Any]

__all__ = ["RequestTimeout", "describe", "parse_json", "read_json"]


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


@overload
async def read_json(
    request: web.Request,
    model: None = None,
    *,
    max_bytes: int,
    timeout_s: float,
    allow_empty: bool = ...,
    loads: Loads = ...,
) -> dict[str, Any]: ...
@overload
async def read_json(
    request: web.Request,
    model: type[M],
    *,
    max_bytes: int,
    timeout_s: float,
    allow_empty: bool = ...,
    loads: Loads = ...,
) -> M: ...
async def read_json(
    request: web.Request,
    model: type[M] | None = None,
    *,
    max_bytes: int,
    timeout_s: float,
    allow_empty: bool = False,
    loads: Loads = json.loads,
) -> M | dict[str, Any]:
    """Read ``request``'s body (at most ``max_bytes``, within ``timeout_s``) and parse it as
    ``parse_json`` does. The app's ``client_max_size`` should be ``max_bytes``: aiohttp then
    stops a chunked body at the cap instead of buffering it."""
    from aiohttp import web

    length = request.content_length
    if length is not None and length > max_bytes:
        raise RequestTooLarge(f"body: {length} bytes is over the cap of {max_bytes} bytes")
    try:
        # asyncio.timeout, not wait_for: no task per request (this is every request's path).
        async with asyncio.timeout(timeout_s):
            raw = await request.read()
    except TimeoutError:
        raise RequestTimeout(
            f"body: not received within {timeout_s:g} s (the client stalled)"
        ) from None
    except web.HTTPRequestEntityTooLarge:
        raise RequestTooLarge(f"body: over the cap of {max_bytes} bytes") from None
    if len(raw) > max_bytes:
        raise RequestTooLarge(f"body: over the cap of {max_bytes} bytes")
    if model is None:
        return parse_json(raw, allow_empty=allow_empty, loads=loads)
    return parse_json(raw, model, allow_empty=allow_empty, loads=loads)
