"""A backend's chat SSE stream as the Responses API's event stream (upstream's
``processor_res_body_streaming_response_api.go``), translated chunk by chunk as it passes.

Each event is ``event: <type>`` and ``data: <json>`` (with ``type`` inside, no
``sequence_number``, as upstream). With the first output: ``response.created`` and
``response.in_progress`` (the Response, ``in_progress``, no output). Text: the message item's
``response.output_item.added``, ``response.content_part.added``, then one
``response.output_text.delta`` per chunk's ``delta.content``. ``delta.reasoning_content``: a
``reasoning`` item and ``response.reasoning_text.delta``; ``delta.tool_calls``: a
``function_call`` item each and ``response.function_call_arguments.delta``. At the chat's
``data: [DONE]`` (or the stream's normal end): the ``.done`` events of every item
(``response.output_text.done``, ``response.content_part.done``,
``response.function_call_arguments.done``, ``response.output_item.done``) and
``response.completed`` with the whole Response and its usage. No chat chunk and no
``[DONE]`` reaches the caller. A stream that breaks gets no ``response.completed`` (and is not
stored).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from vllm_sr.jsontypes import JsonObject, json_object
from vllm_sr.router.responses.translate import (
    Turn,
    call_item,
    message_item,
    new_id,
    reasoning_item,
    usage_of,
)

CONTENT_TYPE = "text/event-stream"


@dataclass
class _Item:
    id: str
    index: int
    text: str = ""
    refusal: str = ""


@dataclass
class _Call:
    """A tool call as its stream's deltas add up."""

    id: str = ""
    name: str = ""
    arguments: str = ""

    def to_json(self) -> JsonObject:
        return {"id": self.id, "function": {"name": self.name, "arguments": self.arguments}}


class StreamTranslator:
    """The backends' stream rewrite for one Responses request: ``chunk`` takes what the
    backend sent (any cut of its SSE bytes) and returns the events to send; ``finish`` the
    rest. ``completed`` is the final Response once ``response.completed`` went out."""

    content_type = CONTENT_TYPE

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self.headers: dict[str, str] = {}  # set before the answer begins
        self.model = turn.request.model
        self.completed: JsonObject | None = None
        self._pending = b""
        self._started = False
        self._next = 0
        self._message: _Item | None = None
        self._reasoning: _Item | None = None
        self._calls: dict[int, _Item] = {}
        self._call_meta: dict[int, _Call] = {}
        self._usage: JsonObject | None = None

    # -- the rewrite ----------------------------------------------------------------------------
    def chunk(self, data: bytes) -> bytes:
        self._pending += data.replace(b"\r\n", b"\n")
        blocks = self._pending.split(b"\n\n")
        self._pending = blocks.pop()  # an event not whole yet
        out: list[bytes] = []
        for block in blocks:
            self._block(block, out)
        return b"".join(out)

    def finish(self) -> bytes:
        out: list[bytes] = []
        if self._pending.strip():
            self._block(self._pending, out)
        self._pending = b""
        if self.completed is None:
            self._complete(out)
        return b"".join(out)

    # -- one SSE event of the chat ------------------------------------------------------------
    def _block(self, block: bytes, out: list[bytes]) -> None:
        for line in block.decode("utf-8", "replace").split("\n"):
            if not line.startswith("data:") or self.completed is not None:
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                self._complete(out)
                continue
            try:
                doc = json_object(json.loads(data))
            except ValueError:
                continue
            if doc is not None:
                self._chat_chunk(doc, out)

    def _chat_chunk(self, doc: JsonObject, out: list[bytes]) -> None:
        model = doc.get("model")
        if isinstance(model, str) and model:
            self.model = model
        if doc.get("usage"):
            self._usage = usage_of(doc["usage"])
        choices = doc.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            delta = json_object(choice.get("delta")) if isinstance(choice, dict) else None
            if delta is None:
                continue
            reasoning = delta.get("reasoning_content")
            if isinstance(reasoning, str) and reasoning:
                item = self._reasoning_item(out)
                item.text += reasoning
                self._emit(out, "response.reasoning_text.delta", **_at(item), delta=reasoning)
            text = delta.get("content")
            if isinstance(text, str) and text:
                item = self._message_item(out)
                item.text += text
                self._emit(out, "response.output_text.delta", **_at(item), delta=text)
            refusal = delta.get("refusal")
            if isinstance(refusal, str) and refusal:
                item = self._message_item(out)
                item.refusal += refusal
                self._emit(out, "response.refusal.delta", **_at(item), delta=refusal)
            calls = delta.get("tool_calls")
            for call in calls if isinstance(calls, list) else []:
                if isinstance(call, dict):
                    self._tool_call(call, out)

    def _tool_call(self, call: JsonObject, out: list[bytes]) -> None:
        raw_index = call.get("index", 0)
        index = int(raw_index) if isinstance(raw_index, int | float | str) else 0
        meta = self._call_meta.setdefault(index, _Call())
        fn = json_object(call.get("function")) or {}
        if call.get("id"):
            meta.id = str(call["id"])
        name, arguments = fn.get("name"), fn.get("arguments")
        meta.name += name if isinstance(name, str) else ""
        if index not in self._calls:
            self._calls[index] = self._open(
                out, lambda i: call_item(i, "in_progress", meta.to_json())
            )
        item = self._calls[index]
        arguments = arguments if isinstance(arguments, str) else ""
        if arguments:
            meta.arguments += arguments
            self._emit(
                out,
                "response.function_call_arguments.delta",
                item_id=item.id,
                output_index=item.index,
                delta=arguments,
            )

    # -- items opening ----------------------------------------------------------------------------
    def _start(self, out: list[bytes]) -> None:
        if self._started:
            return
        self._started = True
        begun = self.turn.response("in_progress", self.model, [])
        self._emit(out, "response.created", response=begun)
        self._emit(out, "response.in_progress", response=begun)

    def _take_index(self) -> int:
        self._next += 1
        return self._next - 1

    def _open(self, out: list[bytes], shown: Callable[[str], JsonObject]) -> _Item:
        """A new output item at the next index, announced as ``shown(its id)`` (the response's
        own start first, once)."""
        self._start(out)
        item = _Item(new_id("item_"), self._take_index())
        self._emit(out, "response.output_item.added", output_index=item.index, item=shown(item.id))
        return item

    def _message_item(self, out: list[bytes]) -> _Item:
        if self._message is None:
            item = self._message = self._open(out, lambda i: message_item(i, "in_progress", ""))
            part = {"type": "output_text", "text": "", "annotations": []}
            self._emit(out, "response.content_part.added", **_at(item), part=part)
        return self._message

    def _reasoning_item(self, out: list[bytes]) -> _Item:
        if self._reasoning is None:
            self._reasoning = self._open(out, lambda i: reasoning_item(i, "in_progress", ""))
        return self._reasoning

    # -- the end ---------------------------------------------------------------------------------
    def _complete(self, out: list[bytes]) -> None:
        if self._message is None and not self._calls:
            self._message_item(out)  # an answer with nothing in it still has its message
        self._start(out)
        done: list[tuple[int, JsonObject]] = []
        if (item := self._reasoning) is not None:
            self._emit(out, "response.reasoning_text.done", **_at(item), text=item.text)
            final = reasoning_item(item.id, "completed", item.text)
            self._emit(out, "response.output_item.done", output_index=item.index, item=final)
            done.append((item.index, final))
        if (item := self._message) is not None:
            final = message_item(item.id, "completed", item.text, item.refusal)
            if item.text:
                self._emit(out, "response.output_text.done", **_at(item), text=item.text)
            if item.refusal:
                self._emit(out, "response.refusal.done", **_at(item), refusal=item.refusal)
            parts = final["content"]
            assert isinstance(parts, list)  # message_item's shape
            self._emit(out, "response.content_part.done", **_at(item), part=parts[0])
            self._emit(out, "response.output_item.done", output_index=item.index, item=final)
            done.append((item.index, final))
        for index in sorted(self._calls):
            item, meta = self._calls[index], self._call_meta[index]
            final = call_item(item.id, "completed", meta.to_json())
            self._emit(
                out,
                "response.function_call_arguments.done",
                item_id=item.id,
                output_index=item.index,
                arguments=final["arguments"],
            )
            self._emit(out, "response.output_item.done", output_index=item.index, item=final)
            done.append((item.index, final))
        output = [entry for _, entry in sorted(done, key=lambda pair: pair[0])]
        self.completed = self.turn.response("completed", self.model, output, self._usage)
        self._emit(out, "response.completed", response=self.completed)

    @staticmethod
    def _emit(out: list[bytes], event: str, **payload: object) -> None:
        data = json.dumps({"type": event, **payload}, ensure_ascii=False)
        out.append(f"event: {event}\ndata: {data}\n\n".encode())


def _at(item: _Item) -> JsonObject:
    return {"item_id": item.id, "output_index": item.index, "content_index": 0}


def translate_whole(turn: Turn, sse: bytes) -> tuple[bytes, JsonObject | None]:
    """A whole chat SSE body (a cached answer replayed, a fast_response) as the event stream
    -> (the events, the completed Response)."""
    translator = StreamTranslator(turn)
    events = translator.chunk(sse) + translator.finish()
    return events, translator.completed
