"""A cached answer: one ``chat.completion`` document, whether the backend answered in JSON or
streamed it. :class:`AnswerRecorder` watches a proxied answer (it is the backends' tap) and
yields the document only for an answer that may be cached: status 200, complete (a stream that
ended with every choice finished and ``data: [DONE]``), with at least one choice, none of them
cut off by ``finish_reason: length``. :func:`replay_sse` turns a document back into an SSE
stream for a streaming caller."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from vllm_sr.jsontypes import JsonObject, json_object

MAX_RECORD_BYTES = 8 << 20  # answers larger than this are not cached


class AnswerRecorder:
    """The backends' ``AnswerTap``: collects the answer; :meth:`document` says what to cache."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.raw: bytes | None = None
        self._buffer = bytearray()
        self._finished = False
        self._too_large = False

    # -- the tap -------------------------------------------------------------------------------
    def whole(self, status: int, body: bytes) -> None:
        self.status, self.raw = status, body

    def chunk(self, data: bytes) -> None:
        self.status = 200
        if len(self._buffer) + len(data) > MAX_RECORD_BYTES:
            self._too_large = True
            return
        self._buffer += data

    def finish(self) -> None:
        self._finished = True

    # -- the result ------------------------------------------------------------------------------
    def document(self) -> JsonObject | None:
        """The answer as a chat.completion when it may be cached, else None."""
        if self.status != 200 or self._too_large:
            return None
        if self.raw is not None:
            try:
                doc = json_object(json.loads(self.raw))
            except ValueError:
                return None
            return doc if doc is not None and _cacheable(doc) else None
        if not self._finished:
            return None
        doc = assemble_sse(bytes(self._buffer))
        return doc if doc is not None and _cacheable(doc) else None


def _cacheable(doc: JsonObject) -> bool:
    if "error" in doc:
        return False
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices:
        return False
    return all(
        isinstance(c, dict) and c.get("finish_reason") not in (None, "length") for c in choices
    )


@dataclass
class _ToolCall:
    id: str | None = None
    name: str = ""
    arguments: str = ""

    def to_json(self) -> JsonObject:
        out: JsonObject = {"type": "function"}
        if self.id is not None:
            out["id"] = self.id
        out["function"] = {"name": self.name, "arguments": self.arguments}
        return out


@dataclass
class _Choice:
    """One choice as its stream's deltas add up."""

    role: object = "assistant"
    content: str = ""
    reasoning: str = ""
    tool_calls: dict[int, _ToolCall] = field(default_factory=dict)
    finish_reason: object = None

    def merge(self, choice: JsonObject) -> None:
        delta = json_object(choice.get("delta")) or {}
        if delta.get("role"):
            self.role = delta["role"]
        content = delta.get("content")
        if isinstance(content, str):
            self.content += content
        reasoning = delta.get("reasoning_content")
        if isinstance(reasoning, str):
            self.reasoning += reasoning
        calls = delta.get("tool_calls")
        for raw in calls if isinstance(calls, list) else []:
            call = json_object(raw) or {}
            slot = self.tool_calls.setdefault(_index(call), _ToolCall())
            call_id = call.get("id")
            if call_id:
                slot.id = str(call_id)
            fn = json_object(call.get("function")) or {}
            name, arguments = fn.get("name"), fn.get("arguments")
            slot.name += name if isinstance(name, str) else ""
            slot.arguments += arguments if isinstance(arguments, str) else ""
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]

    def to_json(self, index: int) -> JsonObject:
        message: JsonObject = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i].to_json() for i in sorted(self.tool_calls)]
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        return {"index": index, "message": message, "finish_reason": self.finish_reason}


def _index(part: JsonObject) -> int:
    index = part.get("index", 0)
    return int(index) if isinstance(index, int | float | str) else 0


def assemble_sse(raw: bytes) -> JsonObject | None:
    """An OpenAI SSE stream -> the chat.completion it amounts to; None when it is not whole
    (no ``[DONE]``, a chunk that is not JSON, an error event)."""
    choices: dict[int, _Choice] = {}
    head: JsonObject = {}
    usage: object = None
    done = False
    for block in raw.decode("utf-8", "replace").split("\n\n"):
        for line in block.splitlines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                continue
            try:
                chunk = json_object(json.loads(data))
            except ValueError:
                return None
            if chunk is None or "error" in chunk:
                return None
            head = head or {k: chunk.get(k) for k in ("id", "created", "model")}
            if chunk.get("usage"):
                usage = chunk["usage"]
            parts = chunk.get("choices")
            for part in parts if isinstance(parts, list) else []:
                c = json_object(part) or {}
                choices.setdefault(_index(c), _Choice()).merge(c)
    if not done or not choices:
        return None
    doc: JsonObject = {
        **head,
        "object": "chat.completion",
        "choices": [choices[i].to_json(i) for i in sorted(choices)],
    }
    if usage is not None:
        doc["usage"] = usage
    return doc


def as_hit(doc: JsonObject) -> JsonObject:
    """The cached document as a fresh answer: its own id and time."""
    return {**doc, "id": f"chatcmpl-cache-{int(time.time() * 1000)}", "created": int(time.time())}


def replay_sse(doc: JsonObject) -> bytes:
    """A chat.completion as an SSE stream: per choice a chunk with its role and content (and
    tool calls), then one with its finish reason, then ``data: [DONE]``."""
    base: JsonObject = {k: doc.get(k) for k in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk"
    events: list[JsonObject] = []
    choices = doc.get("choices")
    for raw in choices if isinstance(choices, list) else []:
        c = json_object(raw) or {}
        message = json_object(c.get("message")) or {}
        delta: JsonObject = {"role": message.get("role", "assistant")}
        if message.get("content") is not None:
            delta["content"] = message["content"]
        if message.get("reasoning_content"):
            delta["reasoning_content"] = message["reasoning_content"]
        calls = message.get("tool_calls")
        if calls and isinstance(calls, list):
            delta["tool_calls"] = [
                {"index": i, **(json_object(call) or {})} for i, call in enumerate(calls)
            ]
        index = c.get("index", 0)
        events.append(
            {**base, "choices": [{"index": index, "delta": delta, "finish_reason": None}]}
        )
        events.append(
            {
                **base,
                "choices": [{"index": index, "delta": {}, "finish_reason": c.get("finish_reason")}],
            }
        )
    lines = [f"data: {json.dumps(e, ensure_ascii=False)}\n\n".encode() for e in events]
    return b"".join(lines) + b"data: [DONE]\n\n"
