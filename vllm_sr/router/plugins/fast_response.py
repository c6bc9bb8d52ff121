"""The ``fast_response`` plugin: the decision's canned ``message`` as the answer, no backend
called (upstream's ``X/processor_req_body_memory.go``): always 200, a ``chat.completion`` with
id ``chatcmpl-fast-<unix seconds>``, ``model: router``, finish reason ``stop`` and zero usage,
or the same as SSE chunks and ``data: [DONE]`` for a streaming caller."""

from __future__ import annotations

import json
import time

from vllm_sr.jsontypes import JsonObject
from vllm_sr.router.cache.answer import replay_sse

H_FAST = "x-vsr-fast-response"


def fast_document(message: str, now: float | None = None) -> JsonObject:
    created = int(time.time() if now is None else now)
    return {
        "id": f"chatcmpl-fast-{created}",
        "object": "chat.completion",
        "created": created,
        "model": "router",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": message},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def fast_body(message: str, *, stream: bool) -> tuple[bytes, str]:
    """(the answer's bytes, its content type)."""
    doc = fast_document(message)
    if stream:
        return replay_sse(doc), "text/event-stream"
    return json.dumps(doc, ensure_ascii=False).encode(), "application/json"
