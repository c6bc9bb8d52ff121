"""The context signal's token count, as upstream estimates it without a tokenizer
(``pkg/classification/request_context_estimate.go``, ``context_classifier.go``).

The count is ``max(ceil(bytes(context text) / 4), floor)``: the context text is the non-user
texts and the current user text, space-joined; the floor walks the whole chat request and adds
``ceil(text bytes / 4)`` + structured JSON bytes at one token per byte (tool schemas, tool-call
arguments, tool results, non-text parts, ``tool_choice``, ``function_call``,
``response_format``) + 8192 per image + 4 per message + 8 per tool call, tool result and tool
definition + the requested output (``max_completion_tokens``, else ``max_tokens``).

Upstream measures structured values by their raw bytes in the request; here they are measured
in their compact JSON form (no spaces, UTF-8 unescaped), which is the raw form of a compact
client's body. Upstream can also learn a bytes-per-token ratio from provider usage; vllm-sr
keeps the fixed 4 (upstream's cold start).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

BYTES_PER_TOKEN = 4
IMAGE_TOKENS = 8 * 1024
MESSAGE_FRAMING = 4
TOOL_CALL_FRAMING = 8
TOOL_DEFINITION_FRAMING = 8
IMAGE_PART_TYPES = frozenset({"image", "image_url", "input_image"})
TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})
# a message's fields counted as text (a non-string one as structured JSON)
MESSAGE_TEXT_FIELDS = ("role", "name", "tool_call_id", "refusal", "reasoning_content")


def ceil_div(value: int, divisor: int) -> int:
    return 0 if value <= 0 else 1 + (value - 1) // divisor


def text_tokens(text: str) -> int:
    """Upstream's byte heuristic: ceil(UTF-8 bytes / 4)."""
    return ceil_div(len(text.encode("utf-8")), BYTES_PER_TOKEN)


def _type_of(part: Mapping[str, object]) -> str:
    kind = part.get("type")
    return kind.strip().lower() if isinstance(kind, str) else ""


class _Estimate:
    def __init__(self) -> None:
        self.text_bytes = 0
        self.structured_bytes = 0
        self.images = 0
        self.framing = 0
        self.output_reserve = 0

    def structured(self, value: object) -> None:
        if value is None:
            return
        raw = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        self.structured_bytes += len(raw.encode("utf-8"))

    def text(self, value: object) -> None:
        if value is None:
            return
        if isinstance(value, str):
            self.text_bytes += len(value.encode("utf-8"))
        else:
            self.structured(value)

    def message(self, msg: object) -> None:
        self.framing += MESSAGE_FRAMING
        if not isinstance(msg, Mapping):
            self.structured(msg)
            return
        for key in MESSAGE_TEXT_FIELDS:
            value = msg.get(key)
            if value is not None:  # most are absent: no call for them
                self.text(value)
        role = msg.get("role")
        role_name = role.strip().lower() if isinstance(role, str) else ""
        if role_name in ("tool", "function"):
            self.tool_result(msg.get("content"))
        else:
            self.content(msg.get("content"))
        calls = msg.get("tool_calls")
        if calls is not None:
            self.tool_calls(calls)
        function = msg.get("function_call")
        if function is not None:
            self.function_call(function)

    def tool_result(self, content: object) -> None:
        self.framing += TOOL_CALL_FRAMING
        if content is None:
            return
        if not isinstance(content, list):
            if isinstance(content, Mapping) and _type_of(content) in IMAGE_PART_TYPES:
                self.images += 1
            else:
                self.structured(content)
            return
        for part in content:
            if isinstance(part, Mapping) and _type_of(part) in IMAGE_PART_TYPES:
                self.images += 1
            else:
                self.structured(part)

    def content(self, content: object) -> None:
        if content is None:
            return
        if isinstance(content, str):
            self.text_bytes += len(content.encode("utf-8"))
        elif isinstance(content, Mapping):
            self.part(content)
        elif isinstance(content, list):
            for part in content:
                self.part(part)
        else:
            self.structured(content)

    def part(self, part: object) -> None:
        if not isinstance(part, Mapping):
            self.structured(part)
            return
        kind = _type_of(part)
        if kind in IMAGE_PART_TYPES:
            self.images += 1
        elif kind in TEXT_PART_TYPES and "text" in part:
            self.text(part["text"])
        else:
            self.structured(part)

    def tool_calls(self, calls: object) -> None:
        if calls is None:
            return
        if not isinstance(calls, list):
            self.structured(calls)
            return
        for call in calls:
            self.framing += TOOL_CALL_FRAMING
            if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
                self.structured(call)  # malformed: counted once, as upstream
                continue
            function = call["function"]
            self.text(call.get("id"))
            self.text(call.get("type"))
            self.text(call.get("tool_call_id"))
            self.text(function.get("name"))
            self.structured(function.get("arguments"))

    def function_call(self, function: object) -> None:
        if function is None:
            return
        if not isinstance(function, Mapping):
            self.structured(function)
            return
        self.framing += TOOL_CALL_FRAMING
        self.text(function.get("name"))
        self.structured(function.get("arguments"))

    def definitions(self, defs: object) -> None:
        if defs is None:
            return
        if not isinstance(defs, list):
            self.structured(defs)
            return
        for definition in defs:
            self.framing += TOOL_DEFINITION_FRAMING
            self.structured(definition)

    def output(self, *values: object) -> None:
        for value in values:
            if value is None:
                continue
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                self.output_reserve = value
            else:
                self.structured(value)  # malformed: counted as structured, as upstream
            return

    def floor(self) -> int:
        return (
            ceil_div(self.text_bytes, BYTES_PER_TOKEN)
            + self.structured_bytes
            + IMAGE_TOKENS * self.images
            + self.framing
            + self.output_reserve
        )


def request_token_floor(body: Mapping[str, object]) -> int:
    """The conservative token floor of a chat-completions request body (see the module doc)."""
    est = _Estimate()
    messages = body.get("messages")
    if isinstance(messages, list):
        for msg in messages:
            est.message(msg)
    else:
        est.structured(messages)
    for key in ("tools", "functions"):
        defs = body.get(key)
        if defs is not None:  # usually absent: no call for them
            est.definitions(defs)
    for key in ("tool_choice", "function_call", "response_format"):
        value = body.get(key)
        if value is not None:
            est.structured(value)
    est.output(body.get("max_completion_tokens"), body.get("max_tokens"))
    return est.floor()


def context_token_count(context_text: str, floor: int) -> int:
    """The context signal's count: the text estimate, raised to the request floor."""
    return max(text_tokens(context_text), floor)
