"""A signal that could not be evaluated on one request: the question its family depends on was
refused, timed out or failed. As upstream evaluates signals one by one (v0.4: "loading,
timeout, overload or crash all make the signal unknown", ``rules.on_unknown: no_match`` by
default), only the signals that depended on the failed question are unknown; every other
signal, and every decision that does not read an unknown one, is evaluated as usual.

The state is one small value, :class:`Unknown`, carried in the signal's own result
(``SignalResult.unknown``, vllm_sr/router/signals.py); any family's evaluation produces it with
``SignalResult.unknown_because(Unknown(reason, detail))`` in place of a result. What reads it:

- rule leaves (vllm_sr/router/rules.py): an unknown signal does not match (a leaf with
  ``on_error: match`` matches, with confidence 1.0, as upstream's classifier leaves do); so
  ``NOT`` over an unknown signal matches, as upstream's no_match does;
- partitions and projections (vllm_sr/router/signals_projections.py): a partition with an
  unknown member and no matched one adds no default (its default is unknown too), and a
  projection score reading an unknown signal leaves its outputs unknown;
- ``/api/v1/eval``'s ``signal_errors`` (``"type:name": "<reason>: <detail>"``), the chat's
  ``x-vsr-unknown-signals`` header and ``/metrics``' ``vllm_sr_router_unknown_signals_total``
  by family and reason.

``reason`` is one of :data:`REASONS`: ``overloaded`` (the deployment's replicas were full:
429), ``unavailable`` (no replica could take it: 503, not ready, a dead signal process),
``timeout`` (the deadline passed: 504) and ``failed`` (anything else: the worker broke, answered
an error or a malformed answer). ``detail`` says what happened, for people.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from vllm_sr.errors import VllmSrError

log = logging.getLogger("vllm_sr.router")

OVERLOADED = "overloaded"
UNAVAILABLE = "unavailable"
TIMEOUT = "timeout"
FAILED = "failed"
REASONS = (OVERLOADED, UNAVAILABLE, TIMEOUT, FAILED)

# Error codes (vllm_sr/errors.py, the pool's exchange, ``http_<status>`` answers) -> reason.
_REASON_OF_CODE = {
    "overloaded": OVERLOADED,
    "http_429": OVERLOADED,
    "unavailable": UNAVAILABLE,
    "not_ready": UNAVAILABLE,
    "http_503": UNAVAILABLE,
    "deadline_exceeded": TIMEOUT,
    "http_504": TIMEOUT,
}


@dataclass(frozen=True)
class Unknown:
    """Why one signal has no value on one request: ``reason`` (one of :data:`REASONS`) and
    ``detail`` (free text: the error code and message)."""

    reason: str
    detail: str = ""

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ValueError(f"reason: {self.reason!r} is not one of {', '.join(REASONS)}")

    def describe(self) -> str:
        """``<reason>: <detail>`` (eval's ``signal_errors`` value)."""
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


def reason_of(code: str) -> str:
    """An error code (``overloaded``, ``deadline_exceeded``, ``http_503``, ...) -> its reason."""
    return _REASON_OF_CODE.get(code, FAILED)


def unknown_of(code: str, message: str = "") -> Unknown:
    """The unknown state for a question that ended with error ``code`` (and ``message``); the
    detail names the code where it is not the reason itself."""
    reason = reason_of(code)
    named = "" if code == reason else code
    return Unknown(reason, ": ".join(p for p in (named, message) if p))


def unknown_of_error(deployment: str, exc: BaseException) -> Unknown:
    """The unknown state of a deployment's signals after its question raised ``exc`` (its
    exchange, or reading its answer); logged, a bug with its traceback."""
    if isinstance(exc, VllmSrError):
        log.info("routing on %s failed: %s", deployment, exc.message)
        return unknown_of(exc.code, exc.message)
    log.error("routing on %s failed", deployment, exc_info=exc)
    return Unknown(FAILED, f"internal_error: {type(exc).__name__}: {exc}")


class DecisionUnresolved(VllmSrError):
    """v0.4's ``rules.on_unknown: fail_request`` applied: decision ``decision``'s rule tree
    was unknown on this request, so the request fails (upstream's ``DecisionUnresolvedError``,
    503) instead of being routed, even when another decision matched."""

    code = "decision_unresolved"
    http_status = 503
    retryable = True

    def __init__(self, decision: str, applied: dict[str, str] | None = None) -> None:
        super().__init__(
            f"decision {decision!r} could not be resolved because a signal it reads is unknown "
            "on this request (its rules.on_unknown is fail_request)",
            decision=decision,
        )
        self.decision = decision
        self.applied = dict(applied or {})
