"""Backend fallback before the first byte: when the chosen model's backend fails before any
byte of its answer reached the caller (it cannot be reached or resets the connection, answers
429 or 5xx, or its stream fails before its first chunk), the chat goes to the decision's next
``modelRefs`` entry (decision order) with a healthy backend, then to ``default_model``, while
the caller's deadline (``X-Request-Timeout-Ms``) lasts. Never after a byte went out: a stream
that breaks later just ends, as before.

Only routed chats whose decision matched fall back (a chat naming a model asked for that model;
a chat no decision matched is already on ``default_model``). The answer's
``x-vsr-selected-model`` is the model that answered; ``x-vsr-backend-fallback`` lists the ones
that failed as ``model:reason`` (reasons: ``connect``, ``reset``, ``http_<status>``,
``stream_first_chunk``, ``deadline``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_sr.router.route import RouteResult

H_BACKEND_FALLBACK = "x-vsr-backend-fallback"


def candidates(
    result: RouteResult, default_model: str, healthy: Callable[[str], bool]
) -> list[tuple[str, Any]]:
    """(model, modelRef) in the order they are tried: the chosen one first."""
    out: list[tuple[str, Any]] = [(result.model, result.model_ref)]
    if not result.routed or result.decision is None:
        return out
    seen = {result.model}
    for ref in result.decision_refs:
        if ref.model not in seen and healthy(ref.model):
            out.append((ref.model, ref))
            seen.add(ref.model)
    if default_model not in seen and healthy(default_model):
        out.append((default_model, None))
    return out


def failure_header(failed: list[tuple[str, str]]) -> str:
    return ",".join(f"{model}:{reason}" for model, reason in failed)
