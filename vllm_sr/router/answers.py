"""What Router mode's answers carry: upstream's ``x-vsr-*`` headers for a routed chat, and the
JSON error answer (with Retry-After when retrying helps). See vllm_sr/router/chat.py for what
each header means."""

from __future__ import annotations

from vllm_sr import httpserver, jsonbody
from vllm_sr.errors import InvalidRequest
from vllm_sr.jsontypes import JsonObject
from vllm_sr.router.families import DEBUG_HEADER_WORD
from vllm_sr.router.reasoning import reasoning_enabled
from vllm_sr.router.route import RouteResult

H_DECISION = "x-vsr-selected-decision"
H_MODEL = "x-vsr-selected-model"
H_CONFIDENCE = "x-vsr-selected-confidence"
H_ALGORITHM = "x-vsr-selected-algorithm"
H_REASONING = "x-vsr-selected-reasoning"
H_SIGNALS = "x-vsr-matched-signals"
H_FALLBACK = "x-vsr-routing-fallback"
H_UNKNOWN = "x-vsr-unknown-signals"
H_DEBUG = "x-vsr-debug"
H_RECIPE = "x-vsr-selected-recipe"
H_CONTEXT_TOKENS = "x-vsr-context-token-count"


class ModelNotAvailable(InvalidRequest):
    """A chat naming a model that is neither an auto name nor a configured model: upstream
    answers 400 ``model "X" is not available`` (an ``invalid_request_error``)."""

    code = "model_not_found"

    def to_json(self) -> JsonObject:
        doc: JsonObject = super().to_json()
        error = doc["error"]
        assert isinstance(error, dict)  # VllmSrError.to_json's shape
        error["type"] = "invalid_request_error"
        return doc


error_response = httpserver.error_response  # the one error answer (vllm_sr.wire)


def parse_chat(raw: bytes) -> JsonObject:
    body: JsonObject = jsonbody.parse_json(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest(
            f"model: expected a model name (a string), got {model!r}; see GET /v1/models"
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages: expected a non-empty list of messages")
    return body


def is_debug(headers: dict[str, str]) -> bool:
    return headers.get(H_DEBUG, "").strip().lower() == "true"


def answer_headers(result: RouteResult, *, debug: bool = False) -> dict[str, str]:
    headers = {H_MODEL: result.model, H_SIGNALS: ",".join(result.matched_signals)}
    if result.decision is not None:
        headers[H_DECISION] = result.decision
        headers[H_CONFIDENCE] = f"{result.confidence or 0.0:.4f}"
    if result.routed:
        headers[H_ALGORITHM] = result.method
        headers[H_RECIPE] = result.recipe
    if result.fallback is not None:
        headers[H_FALLBACK] = result.fallback
    if result.unknown:
        headers[H_UNKNOWN] = ",".join(result.unknown_signals)
    if debug:
        families: dict[str, list[str]] = {}
        for sig in result.matched_signals:
            kind, _, name = sig.partition(":")
            if kind in DEBUG_HEADER_WORD:
                families.setdefault(DEBUG_HEADER_WORD[kind], []).append(name)
        for family, names in families.items():
            headers[f"x-vsr-matched-{family}"] = ",".join(names)
        headers[H_REASONING] = "on" if reasoning_enabled(result.model_ref) else "off"
        if result.context_tokens is not None:
            headers[H_CONTEXT_TOKENS] = str(result.context_tokens)
    return headers
