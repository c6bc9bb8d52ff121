"""``POST /api/v1/routing/preview``: upstream v0.4's request envelope (``IntentRequest``, as the
released CLI checks it in ``cli/routing_preview.py`` and the Go server decodes it strictly).

The envelope is ``/api/v1/eval``'s body made strict: an unknown field anywhere (the request,
a message, ``options``, ``preview_context``) is refused by name, as are values of the wrong type,
over-long metadata and identities, and non-finite numbers. A valid envelope is evaluated by the
same handler and answered with the same document as ``/api/v1/eval`` (vllm_sr/router/eval.py).
Every error is an :class:`~vllm_sr.router.eval.EvalError` (``INVALID_INPUT``, 400) naming the
field, the value and what is accepted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn

from vllm_sr.jsontypes import JsonObject, json_int, json_type
from vllm_sr.router.eval import MAX_EVAL_BODY, EvalError, parse_payload

PREVIEW_PATH = "/api/v1/routing/preview"

PROMPT_FIELDS = ("tools", "functions", "tool_choice", "function_call", "response_format")
REQUEST_FIELDS = (
    "text",
    "messages",
    *PROMPT_FIELDS,
    "model",
    "metadata",
    "options",
    "preview_context",
    "max_tokens",
    "max_completion_tokens",
)
MESSAGE_FIELDS = (
    "role",
    "name",
    "content",
    "tool_calls",
    "tool_call_id",
    "function_call",
    "refusal",
    "reasoning_content",
)
CONTEXT_FIELDS = ("session_id", "conversation_id", "sampling_seed")
OPTION_FIELDS = ("return_probabilities", "confidence_threshold", "include_explanation", "trace")
BOOL_OPTIONS = ("return_probabilities", "include_explanation", "trace")

MAX_METADATA_ENTRIES = 32
MAX_METADATA_KEY_BYTES = 128
MAX_METADATA_VALUE_BYTES = 1024
MAX_IDENTITY_BYTES = 1024
INT64 = (-(2**63), 2**63)


@dataclass(frozen=True)
class PreviewContext:
    """``preview_context``: the session a preview stands for, and a preview-only sampling
    seed. Checked and kept; nothing in vllm-sr's preview depends on them yet (a selector that
    adapts per session answers ``execution_required``)."""

    session_id: str | None = None
    conversation_id: str | None = None
    sampling_seed: int | None = None


@dataclass(frozen=True)
class PreviewRequest:
    payload: JsonObject  # what the eval handler evaluates (the envelope as sent)
    trace: bool  # options.trace
    context: PreviewContext


def _shown(value: object) -> str:
    text = json.dumps(value, allow_nan=True, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def _bad(field: str, value: object, accepted: str) -> EvalError:
    return EvalError(
        "INVALID_INPUT",
        f"field {field}: got {_shown(value)} ({json_type(value)}); accepted: {accepted}",
    )


def _object(value: object, fields: tuple[str, ...], where: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise _bad(where, value, f"an object with fields {', '.join(fields)}")
    for key in value:
        if key not in fields:
            name = f"{where}.{key}" if where != "request" else str(key)
            raise EvalError(
                "INVALID_INPUT",
                f"field {name}: unknown field of the routing preview {where}; "
                f"accepted: {', '.join(fields)}",
            )
    return value


def _refuse_constant(name: str) -> NoReturn:
    raise EvalError("INVALID_INPUT", f"the body holds {name}; accepted: finite JSON numbers only")


def parse_body(raw: bytes) -> JsonObject:
    """The request body as a JSON object (NaN and Infinity refused, as upstream's decoder
    does)."""
    if len(raw) > MAX_EVAL_BODY:
        return parse_payload(raw)  # eval's refusal of the size
    try:
        payload = json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise EvalError("INVALID_INPUT", f"the body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise _bad("request", payload, "a JSON object (the routing preview envelope)")
    return payload


def parse_preview(payload: Mapping[str, object]) -> PreviewRequest:
    """Check the envelope; raises EvalError naming the field, its value and what is accepted."""
    _object(payload, REQUEST_FIELDS, "request")
    for name in ("text", "model"):
        if name in payload and not isinstance(payload[name], str):
            raise _bad(name, payload[name], "a string")
    if "messages" in payload:
        _messages(payload["messages"])
    for name in ("tools", "functions"):
        if name in payload and not isinstance(payload[name], list):
            raise _bad(name, payload[name], "an array of tool definitions")
    if "metadata" in payload:
        _metadata(payload["metadata"])
    trace = False
    if "options" in payload:
        trace = _options(payload["options"])
    context = PreviewContext()
    if "preview_context" in payload:
        context = _context(payload["preview_context"])
    return PreviewRequest(dict(payload), trace, context)


def _messages(messages: object) -> None:
    if not isinstance(messages, list):
        raise _bad("messages", messages, "an array of chat messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        message = _object(message, MESSAGE_FIELDS, where)
        role = message.get("role")
        if not isinstance(role, str) or not role.strip():
            raise _bad(f"{where}.role", role, "a non-empty string (user, assistant, system, ...)")
        for name in ("name", "tool_call_id"):
            if name in message and not isinstance(message[name], str):
                raise _bad(f"{where}.{name}", message[name], "a string")
        if "tool_calls" in message and not isinstance(message["tool_calls"], list):
            raise _bad(f"{where}.tool_calls", message["tool_calls"], "an array of tool calls")


def _metadata(metadata: object) -> None:
    bounds = (
        f"an object of at most {MAX_METADATA_ENTRIES} entries, keys non-empty strings of at "
        f"most {MAX_METADATA_KEY_BYTES} bytes, values strings of at most "
        f"{MAX_METADATA_VALUE_BYTES} bytes"
    )
    if not isinstance(metadata, Mapping):
        raise _bad("metadata", metadata, bounds)
    if len(metadata) > MAX_METADATA_ENTRIES:
        raise EvalError(
            "INVALID_INPUT", f"field metadata: {len(metadata)} entries; accepted: {bounds}"
        )
    for key, value in metadata.items():
        if not key or len(key.encode()) > MAX_METADATA_KEY_BYTES:
            raise EvalError(
                "INVALID_INPUT", f"field metadata: key {_shown(key)}; accepted: {bounds}"
            )
        if not isinstance(value, str) or len(value.encode()) > MAX_METADATA_VALUE_BYTES:
            raise _bad(f"metadata.{key}", value, bounds)


def _options(raw: object) -> bool:
    options = _object(raw, OPTION_FIELDS, "options")
    for name in BOOL_OPTIONS:
        if name in options and not isinstance(options[name], bool):
            raise _bad(f"options.{name}", options[name], "true or false")
    threshold = options.get("confidence_threshold")
    if "confidence_threshold" in options and (
        isinstance(threshold, bool) or not isinstance(threshold, (int, float))
    ):
        raise _bad("options.confidence_threshold", threshold, "a number")
    return options.get("trace") is True


def _identity(context: Mapping[str, object], name: str) -> str | None:
    if name not in context:
        return None
    value = context[name]
    if (
        not isinstance(value, str)
        or len(value.encode()) > MAX_IDENTITY_BYTES
        or any(c in value for c in ("\r", "\n", "\x00"))
    ):
        raise _bad(
            f"preview_context.{name}",
            value,
            f"a string of at most {MAX_IDENTITY_BYTES} bytes without CR, LF or NUL",
        )
    return value


def _context(raw: object) -> PreviewContext:
    context = _object(raw, CONTEXT_FIELDS, "preview_context")
    seed = context.get("sampling_seed")
    if "sampling_seed" in context and (
        isinstance(seed, bool) or not isinstance(seed, int) or not INT64[0] <= seed < INT64[1]
    ):
        raise _bad("preview_context.sampling_seed", seed, "a signed 64-bit integer")
    return PreviewContext(
        session_id=_identity(context, "session_id"),
        conversation_id=_identity(context, "conversation_id"),
        sampling_seed=json_int(seed),
    )
