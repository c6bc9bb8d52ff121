"""A cached answer: one ``chat.completion`` document, whether the backend answered in JSON or
streamed it. :class:`AnswerRecorder` watches a proxied answer (it is the backends' tap) and
yields the document only for an answer that may be cached: status 200, complete (a stream that
ended with every choice finished and ``data: [DONE]``), with at least one choice, none of them
cut off by ``finish_reason: length``. :func:`replay_sse` turns a document back into an SSE
stream for a streaming caller."""

from __future__ import annotations

import json
import time
from typing import Any

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
    def document(self) -> dict[str, Any] | None:
        """The answer as a chat.completion when it may be cached, else None."""
        if self.status != 200 or self._too_large:
            return None
        if self.raw is not None:
            try:
                doc = json.loads(self.raw)
            except ValueError:
                return None
            return doc if _cacheable(doc) else None
        if not self._finished:
            return None
        doc = assemble_sse(bytes(self._buffer))
        return doc if doc is not None and _cacheable(doc) else None


def _cacheable(doc: Any) -> bool:
    if not isinstance(doc, dict) or "error" in doc:
        return False
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices:
        return False
    return all(
        isinstance(c, dict) and c.get("finish_reason") not in (None, "length") for c in choices
    )


def assemble_sse(raw: bytes) -> dict[str, Any] | None:
    """An OpenAI SSE stream -> the chat.completion it amounts to; None when it is not whole
    (no ``[DONE]``, a chunk that is not JSON, an error event)."""
    choices: dict[int, dict[str, Any]] = {}
    head: dict[str, Any] = {}
    usage: Any = None
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
                chunk = json.loads(data)
            except ValueError:
                return None
            if not isinstance(chunk, dict) or "error" in chunk:
                return None
            head = head or {k: chunk.get(k) for k in ("id", "created", "model")}
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk.get("choices") or []:
                _merge(choices.setdefault(int(c.get("index", 0)), _blank()), c)
    if not done or not choices:
        return None
    out = []
    for index in sorted(choices):
        c = choices[index]
        message: dict[str, Any] = {"role": c["role"], "content": c["content"]}
        if c["tool_calls"]:
            message["tool_calls"] = [c["tool_calls"][i] for i in sorted(c["tool_calls"])]
        if c["reasoning"]:
            message["reasoning_content"] = c["reasoning"]
        out.append({"index": index, "message": message, "finish_reason": c["finish_reason"]})
    doc = {**head, "object": "chat.completion", "choices": out}
    if usage is not None:
        doc["usage"] = usage
    return doc


def _blank() -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "reasoning": "",
        "tool_calls": {},
        "finish_reason": None,
    }


def _merge(acc: dict[str, Any], choice: dict[str, Any]) -> None:
    delta = choice.get("delta") or {}
    if delta.get("role"):
        acc["role"] = delta["role"]
    if isinstance(delta.get("content"), str):
        acc["content"] += delta["content"]
    if isinstance(delta.get("reasoning_content"), str):
        acc["reasoning"] += delta["reasoning_content"]
    for call in delta.get("tool_calls") or []:
        slot = acc["tool_calls"].setdefault(
            int(call.get("index", 0)),
            {"type": "function", "function": {"name": "", "arguments": ""}},
        )
        if call.get("id"):
            slot["id"] = call["id"]
        fn = call.get("function") or {}
        slot["function"]["name"] += fn.get("name") or ""
        slot["function"]["arguments"] += fn.get("arguments") or ""
    if choice.get("finish_reason"):
        acc["finish_reason"] = choice["finish_reason"]


def as_hit(doc: dict[str, Any]) -> dict[str, Any]:
    """The cached document as a fresh answer: its own id and time."""
    return {**doc, "id": f"chatcmpl-cache-{int(time.time() * 1000)}", "created": int(time.time())}


def replay_sse(doc: dict[str, Any]) -> bytes:
    """A chat.completion as an SSE stream: per choice a chunk with its role and content (and
    tool calls), then one with its finish reason, then ``data: [DONE]``."""
    base = {k: doc.get(k) for k in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk"
    events = []
    for c in doc.get("choices") or []:
        message = c.get("message") or {}
        delta: dict[str, Any] = {"role": message.get("role", "assistant")}
        if message.get("content") is not None:
            delta["content"] = message["content"]
        if message.get("reasoning_content"):
            delta["reasoning_content"] = message["reasoning_content"]
        if message.get("tool_calls"):
            delta["tool_calls"] = [
                {"index": i, **call} for i, call in enumerate(message["tool_calls"])
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
