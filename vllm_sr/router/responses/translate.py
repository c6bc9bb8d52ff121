"""A Responses API request <-> a chat completion (upstream's ``responseapi/translator.go``).

A request becomes one chat: the instructions as a system message (unset: the most recent
instructions of the chain it continues), the chain's turns (each response's input items, then
its output items), then this request's input; ``temperature``, ``top_p``, ``max_output_tokens``
(as ``max_tokens``), function ``tools``, ``tool_choice`` and ``metadata`` carry over, and a
streamed request asks for the usage chunk. The chat's answer becomes a Response object: each
choice's text as a ``message`` item with one ``output_text`` part, its tool calls as
``function_call`` items, its ``reasoning_content`` as a ``reasoning`` item.

What a request cannot be translated without losing something is a 400 naming the field and
what is accepted (a tool other than a function, an ``item_reference``, a file part), where
upstream drops it silently.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field

from vllm_sr import jsonbody
from vllm_sr.errors import InvalidRequest
from vllm_sr.jsontypes import JsonObject, json_object
from vllm_sr.router.responses.store import Record

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = ("input_text", "output_text", "text")


def new_id(prefix: str) -> str:
    """Upstream's ids: ``resp_``, ``item_``, ``conv_`` and 24 random hex digits."""
    return prefix + secrets.token_hex(12)


def _obj(value: object) -> JsonObject:
    """``value`` when it is a JSON object, else an empty one."""
    return json_object(value) or {}


def _items(value: object) -> list[object]:
    """``value`` when it is a JSON array, else an empty one."""
    return value if isinstance(value, list) else []


def _bad(field_: str, got: object, accepted: str) -> InvalidRequest:
    shown = json.dumps(got)[:200] if not isinstance(got, str) else repr(got[:200])
    return InvalidRequest(f"{field_}: {shown} is not accepted; accepted: {accepted}")


@dataclass
class ResponsesRequest:
    """A ``POST /v1/responses`` body, checked. Fields upstream ignores are ignored here too."""

    model: str
    input: list[JsonObject]  # the input items as stored (each with an id and a status)
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    tools: list[JsonObject] = field(default_factory=list)
    tool_choice: object = None
    metadata: dict[str, str] | None = None
    conversation_id: str | None = None


def parse_request(raw: bytes) -> ResponsesRequest:
    body = jsonbody.parse_json(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model", model, "a model name (an auto name or a model; GET /v1/models)")
    if body.get("input") is None:
        raise InvalidRequest(
            "input: the 'input' field is required (a string, or a list of input items); a "
            "Responses request uses 'input' where a chat completion uses 'messages'"
        )
    req = ResponsesRequest(model, parse_input(body["input"]))
    req.instructions = _opt_str(body, "instructions")
    req.previous_response_id = _opt_str(body, "previous_response_id")
    req.conversation_id = _opt_str(body, "conversation_id")
    for name in ("store", "stream"):
        value = body.get(name)
        if value is not None and not isinstance(value, bool):
            raise _bad(name, value, "true or false")
        if value is not None:
            setattr(req, name, value)
    req.temperature = _opt_number(body, "temperature")
    req.top_p = _opt_number(body, "top_p")
    cap = body.get("max_output_tokens")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise _bad("max_output_tokens", cap, "a positive integer")
    req.max_output_tokens = cap
    req.tools = parse_tools(body.get("tools"))
    req.tool_choice = body.get("tool_choice")
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise _bad("metadata", metadata, "an object of string values")
        req.metadata = {str(k): str(v) for k, v in metadata.items()}
    return req


def _opt_str(body: JsonObject, name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise _bad(name, value, "a string")
    return value or None


def _opt_number(body: JsonObject, name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(name, value, "a number")
    return value


def parse_input(value: object) -> list[JsonObject]:
    """``input`` as stored items: a string is one user message (an empty string too: upstream
    sends it as one empty user message)."""
    if isinstance(value, str):
        value = [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise _bad("input", value, "a string, or a non-empty list of input items")
    return [_input_item(i, item) for i, item in enumerate(value)]


def _input_item(i: int, raw: object) -> JsonObject:
    where = f"input[{i}]"
    item = json_object(raw)
    if item is None:
        raise _bad(where, raw, "an input item object (a message, function_call or output)")
    kind = item.get("type") or "message"
    out: JsonObject = {"id": item.get("id") or new_id("item_"), "type": kind}
    if kind == "message":
        role = item.get("role") or "user"
        if not isinstance(role, str) or role not in ROLES:
            raise _bad(f"{where}.role", role, ", ".join(ROLES))
        out.update(role=role, content=_content(f"{where}.content", item.get("content")))
    elif kind == "function_call":
        for key in ("call_id", "name", "arguments"):
            if not isinstance(item.get(key), str):
                raise _bad(f"{where}.{key}", item.get(key), "a string")
            out[key] = item[key]
    elif kind == "function_call_output":
        output = item.get("output")
        if not isinstance(item.get("call_id"), str) or not isinstance(output, str):
            raise _bad(where, item, "call_id and output, both strings")
        out.update(call_id=item["call_id"], output=output)
    else:
        raise InvalidRequest(
            f"{where}.type {kind!r} is not supported by vllm-sr; supported: message, "
            "function_call, function_call_output"
        )
    out["status"] = "completed"
    return out


def _content(where: str, content: object) -> list[JsonObject]:
    """Content as parts (OpenAI's stored shape; a string is one ``input_text`` part)."""
    if content is None or isinstance(content, str):
        return [{"type": "input_text", "text": content or ""}]
    if not isinstance(content, list):
        raise _bad(where, content, "a string or a list of content parts")
    parts: list[JsonObject] = []
    for j, raw in enumerate(content):
        part = _obj(raw)
        kind = part.get("type")
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            parts.append({"type": kind, "text": part["text"]})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({k: part[k] for k in ("type", "image_url", "detail") if k in part})
        elif kind == "refusal":
            continue  # an earlier answer's refusal: not sent back to a model
        else:
            raise InvalidRequest(
                f"{where}[{j}]: a part of type {kind!r} is not supported by vllm-sr; "
                "supported: input_text, output_text (with text), input_image (with image_url)"
            )
    return parts


def parse_tools(tools: object) -> list[JsonObject]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _bad("tools", tools, "a list of function tools")
    out: list[JsonObject] = []
    for i, raw in enumerate(tools):
        tool = json_object(raw)
        kind = tool.get("type") if tool is not None else None
        if tool is None or kind != "function":
            raise InvalidRequest(
                f"tools[{i}]: a tool of type {kind!r} is not supported by vllm-sr (the backend "
                "gets a chat completion, which calls functions only); supported: function"
            )
        fn = json_object(tool.get("function")) or tool
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _bad(f"tools[{i}].name", fn.get("name"), "the function's name")
        out.append(tool)
    return out


# -- to the chat ------------------------------------------------------------------------------


def to_chat(req: ResponsesRequest, history: list[Record]) -> JsonObject:
    """The chat completion the backend gets for ``req`` continuing ``history`` (oldest first)."""
    messages: list[JsonObject] = []
    instructions = req.instructions or next(
        (r["instructions"] for r in reversed(history) if r.get("instructions")), None
    )
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for record in history:
        for key in ("input", "output"):
            messages += [m for item in _items(record.get(key)) if (m := _message(_obj(item)))]
    messages += [m for item in req.input if (m := _message(item))]
    body: JsonObject = {"model": req.model, "messages": messages}
    if req.temperature is not None:
        body["temperature"] = req.temperature
    if req.top_p is not None:
        body["top_p"] = req.top_p
    if req.max_output_tokens is not None:
        body["max_tokens"] = req.max_output_tokens
    if req.tools:
        body["tools"] = [_chat_tool(t) for t in req.tools]
    if req.tool_choice is not None:
        body["tool_choice"] = _chat_tool_choice(req.tool_choice)
    if req.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    if req.metadata:
        body["metadata"] = req.metadata
    return body


def _message(item: JsonObject) -> JsonObject | None:
    kind = item.get("type") or "message"
    if kind == "function_call":
        call = {"name": item.get("name", ""), "arguments": item.get("arguments", "")}
        tool_call = {"id": item.get("call_id", ""), "type": "function", "function": call}
        return {"role": "assistant", "content": None, "tool_calls": [tool_call]}
    if kind == "function_call_output":
        return {"role": "tool", "tool_call_id": item.get("call_id", ""), "content": item["output"]}
    if kind != "message":
        return None  # a reasoning item: not sent back
    role = ROLES.get(str(item.get("role") or "user"), "user")
    parts = [p for raw in _items(item.get("content")) if (p := json_object(raw)) is not None]
    if role == "user" and any(p.get("type") == "input_image" for p in parts):
        return {"role": role, "content": [_chat_part(p) for p in parts]}
    texts = [str(p.get("text", "")) for p in parts if p.get("type") in TEXT_PARTS]
    # an answer's parts are one text (upstream concatenates them); a request's, joined by spaces
    joined = "".join(texts) if role == "assistant" else " ".join(texts)
    return {"role": role, "content": joined}


def _chat_part(part: JsonObject) -> JsonObject:
    if part.get("type") == "input_image":
        image: JsonObject = {"url": part["image_url"]}
        if part.get("detail"):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    return {"type": "text", "text": part.get("text", "")}


def _chat_tool(tool: JsonObject) -> JsonObject:
    """A function tool, nested (``function: {...}``) or flat (the Responses shape)."""
    fn = json_object(tool.get("function")) or tool
    out = {k: fn[k] for k in ("name", "description", "parameters", "strict") if k in fn}
    return {"type": "function", "function": out}


def _chat_tool_choice(choice: object) -> object:
    """``auto``/``none``/``required`` as they are; a named function in either shape."""
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


# -- from the chat ----------------------------------------------------------------------------


@dataclass
class Turn:
    """One Responses request in flight: what its Response object says besides the output."""

    request: ResponsesRequest
    response_id: str
    created_at: int
    conversation_id: str

    @classmethod
    def start(cls, req: ResponsesRequest, history: list[Record], now: float) -> Turn:
        """Upstream's conversation id: the request's, else the chain's first, else a new one."""
        conv = req.conversation_id or next(
            (str(r["conversation_id"]) for r in history[:1] if r.get("conversation_id")), None
        )
        return cls(req, new_id("resp_"), int(now), conv or new_id("conv_"))

    def response(
        self,
        status: str,
        model: str,
        output: list[JsonObject],
        usage: JsonObject | None = None,
    ) -> JsonObject:
        """The Response object (upstream's streamed shape, for both answers)."""
        req = self.request
        doc: JsonObject = {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "model": model,
            "status": status,
            "output": output,
            "previous_response_id": req.previous_response_id,
            "conversation_id": self.conversation_id,
            "error": None,
            "incomplete_details": None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "parallel_tool_calls": True,
            "reasoning": {"effort": None, "summary": None},
            "store": req.store,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto" if req.tool_choice is None else req.tool_choice,
            "tools": req.tools,
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
            "metadata": req.metadata or {},
        }
        if status == "completed":
            doc["output_text"] = output_text(output)
        return doc

    def record(self, response: JsonObject) -> Record:
        """What the store keeps: the Response object and this request's input items."""
        return {**response, "input": self.request.input}


def output_text(output: list[JsonObject]) -> str:
    return "".join(
        str(p.get("text", ""))
        for item in output
        if item.get("type") == "message"
        for raw in _items(item.get("content"))
        if (p := _obj(raw)).get("type") == "output_text"
    )


def _count(doc: JsonObject, key: str) -> int:
    value = doc.get(key)
    return int(value) if isinstance(value, int | float | str) and value else 0


def usage_of(chat_usage: object) -> JsonObject | None:
    """A chat ``usage`` in the Responses API's words (None when it counts nothing)."""
    usage = json_object(chat_usage)
    if usage is None:
        return None
    counts = [_count(usage, k) for k in ("prompt_tokens", "completion_tokens")]
    total = _count(usage, "total_tokens")
    if not any(counts) and not total:
        return None
    prompt = _obj(usage.get("prompt_tokens_details"))
    completion = _obj(usage.get("completion_tokens_details"))
    return {
        "input_tokens": counts[0],
        "input_tokens_details": {"cached_tokens": _count(prompt, "cached_tokens")},
        "output_tokens": counts[1],
        "output_tokens_details": {"reasoning_tokens": _count(completion, "reasoning_tokens")},
        "total_tokens": total,
    }


def message_item(item_id: str, status: str, text: str, refusal: str = "") -> JsonObject:
    content: list[object] = []
    if refusal and not text:
        content.append({"type": "refusal", "refusal": refusal})
    elif status == "completed" or text:
        content.append({"type": "output_text", "text": text, "annotations": []})
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def call_item(item_id: str, status: str, call: JsonObject) -> JsonObject:
    fn = _obj(call.get("function"))
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call.get("id", ""),
        "name": fn.get("name", ""),
        "arguments": fn.get("arguments", ""),
        "status": status,
    }


def reasoning_item(item_id: str, status: str, text: str) -> JsonObject:
    content: list[object] = (
        [{"type": "reasoning_text", "text": text}] if status == "completed" else []
    )
    return {"id": item_id, "type": "reasoning", "status": status, "summary": [], "content": content}


def from_chat(turn: Turn, doc: JsonObject) -> JsonObject:
    """A backend's ``chat.completion`` as the Response object of ``turn``."""
    output: list[JsonObject] = []
    for choice in _items(doc.get("choices")):
        msg = _obj(_obj(choice).get("message"))
        reasoning = _text(msg.get("reasoning_content"))
        if reasoning:
            output.append(reasoning_item(new_id("item_"), "completed", reasoning))
        text, refusal = _text(msg.get("content")), _text(msg.get("refusal"))
        if text or refusal:
            output.append(message_item(new_id("item_"), "completed", text, refusal))
        for call in _items(msg.get("tool_calls")):
            output.append(call_item(new_id("item_"), "completed", _obj(call)))
    model = _text(doc.get("model")) or turn.request.model
    return turn.response("completed", model, output, usage_of(doc.get("usage")))


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
