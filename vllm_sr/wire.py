"""The wire vocabulary every server and client of vllm-sr shares: header names, body and time
limits, the caller's deadline header and the one error answer.

The frontend, the workers, Router mode and the control socket all answer errors the same way:
``{"error": {"code", "message", "retryable"}}`` (plus ``details`` when the error has any) with
the error's HTTP status, ``Allow`` on a 405, and ``Retry-After`` on an error that asks the
caller to come back (one rule: the error's ``retry_after_s``, default 1 s, rounded *up* to whole
seconds and never below 1, so a caller is never told to return before the wait is over).

Pure data and functions: no I/O, no server types (``vllm_sr.httpserver`` builds its
``Response`` from these), so any module may import it.
"""

from __future__ import annotations

import json
import math
from typing import Any

from vllm_sr.errors import ConfigError, InvalidRequest, MethodNotAllowed, VllmSrError

# The caller's time budget, in milliseconds left: a caller may send it to the frontend, and the
# frontend sends what is left of it to the worker it forwards to.
DEADLINE_HEADER = "X-Request-Timeout-Ms"
DEADLINE_KEY = DEADLINE_HEADER.lower()  # as the server keys headers
RETRY_HEADER = "X-Vsr-Retried"  # "1; from=primary-0": the answer came from a retry elsewhere
FORWARD_HEADER = "X-Vsr-Forward"  # "1"/"0": whether a forward made the answer (outlier counts)

MAX_BODY_BYTES = 8 * 1024 * 1024  # the frontend's and a worker's request body cap
READ_TIMEOUT_S = 30.0  # a request not whole this long after its first byte is answered 408
CONTROL_MAX_BODY_BYTES = 64 * 1024  # the control socket takes small commands only

JSON_TYPE = "application/json"


def deadline_ms(raw: str | None) -> float | None:
    """The deadline header's value: positive, finite milliseconds, or None when absent.
    Anything else is ``InvalidRequest`` naming the header, the value and what is accepted."""
    if raw is None:
        return None
    try:
        ms = float(raw)
    except ValueError:
        ms = math.nan
    if not math.isfinite(ms) or ms <= 0:
        raise InvalidRequest(
            f"header {DEADLINE_HEADER} must be a positive number of milliseconds "
            f"(for example 1500 or 250.5), got {raw!r}"
        )
    return ms


def deadline_header_value(remaining_s: float) -> str:
    """What is left of a deadline, as the header carries it (whole milliseconds, at least 1)."""
    return f"{max(remaining_s * 1000.0, 1.0):.0f}"


def retry_after_s(exc: VllmSrError) -> float | None:
    """How long the caller should wait before retrying, or None where retrying later is not
    what the error asks (a bad request, a failed worker: the caller decides)."""
    if exc.http_status not in (429, 503):
        return None
    raw = getattr(exc, "retry_after_s", None) or exc.details.get("retry_after_s") or 1.0
    return float(raw)


def retry_after_header(seconds: float) -> str:
    """The one Retry-After rule: whole seconds, rounded up, never below 1."""
    return str(max(1, math.ceil(seconds)))


def error_document(exc: VllmSrError) -> dict[str, Any]:
    """The error as JSON. A config error's problems (each naming its file, line and field)
    travel in ``details.problems``: its message alone only counts them, and a refused reload
    must say what is wrong."""
    doc = exc.to_json()
    if isinstance(exc, ConfigError) and exc.problems != [exc.message]:
        doc["error"].setdefault("details", {})["problems"] = list(exc.problems)
    return doc


def error_body(exc: VllmSrError) -> bytes:
    return json.dumps(error_document(exc)).encode()


def error_headers(exc: VllmSrError) -> dict[str, str]:
    """The headers an error answer carries besides its content type."""
    headers: dict[str, str] = {}
    if isinstance(exc, MethodNotAllowed):
        headers["Allow"] = ", ".join(exc.details["allowed"])
    wait = retry_after_s(exc)
    if wait is not None:
        headers["Retry-After"] = retry_after_header(wait)
    return headers
