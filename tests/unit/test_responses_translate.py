"""The Responses API translator: a request -> the chat the backend gets (input as a string or
items, instructions and their inheritance along a chain, the chain's turns in order, the
sampling fields, function tools in both shapes), a chat answer -> the Response object, and the
chat SSE stream -> the Responses event stream (at any cut of the backend's bytes)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vllm_sr.errors import InvalidRequest
from vllm_sr.router.responses.events import StreamTranslator, translate_whole
from vllm_sr.router.responses.translate import Turn, from_chat, parse_request, to_chat


def req(**body: Any) -> Any:
    return parse_request(json.dumps({"model": "vllm-sr/auto", **body}).encode())


def turn_of(**body: Any) -> Turn:
    return Turn.start(req(**body), [], 1_700_000_000.0)


def stored(rid: str, user: str, answer: str, **extra: Any) -> dict[str, Any]:
    """A record as the API stores one (input items and output items)."""
    t = Turn.start(req(input=user, **extra), [], 0.0)
    doc = from_chat(t, chat_doc(answer))
    return {**t.record(doc), "id": rid}


def chat_doc(text: str, **message: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "backend-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, **message},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
    }


# -- the request --------------------------------------------------------------------------------


def test_a_string_input_is_one_user_message_and_instructions_a_system_one() -> None:
    body = to_chat(req(input="What is 2 + 2?", instructions="Be a math tutor."), [])
    assert body["model"] == "vllm-sr/auto"
    assert body["messages"] == [
        {"role": "system", "content": "Be a math tutor."},
        {"role": "user", "content": "What is 2 + 2?"},
    ]
    assert "stream" not in body


def test_an_empty_string_input_is_one_empty_user_message() -> None:
    assert to_chat(req(input=""), [])["messages"] == [{"role": "user", "content": ""}]


def test_input_items_keep_roles_and_join_text_parts() -> None:
    items = [
        {"role": "developer", "content": "dev rule"},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "first"}, {"type": "input_text", "text": "second"}]},
        {"role": "assistant", "content": "earlier answer"},
        {"role": "user", "content": [{"type": "input_text", "text": "look"},
                                     {"type": "input_image", "image_url": "http://x/i.png"}]},
    ]  # fmt: skip
    assert to_chat(req(input=items), [])["messages"] == [
        {"role": "system", "content": "dev rule"},
        {"role": "user", "content": "first second"},
        {"role": "assistant", "content": "earlier answer"},
        {"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "http://x/i.png"}}]},
    ]  # fmt: skip


def test_function_calls_and_their_outputs_become_tool_messages() -> None:
    items = [
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ]
    messages = to_chat(req(input=items), [])["messages"]
    assert messages[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
        ],
    }
    assert messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}


def test_sampling_fields_tools_and_stream_carry_over() -> None:
    flat = {"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}}
    nested = {"type": "function", "function": {"name": "g", "parameters": {}}}
    body = to_chat(
        req(input="hi", temperature=0.2, top_p=0.9, max_output_tokens=50, stream=True,
            tools=[flat, nested], tool_choice={"type": "function", "name": "f"},
            metadata={"k": "v"}),
        [],
    )  # fmt: skip
    assert body["temperature"] == 0.2 and body["top_p"] == 0.9 and body["max_tokens"] == 50
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["tools"] == [
        {"type": "function", "function": {"name": "f", "description": "d",
                                          "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "g", "parameters": {}}},
    ]  # fmt: skip
    assert body["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert body["metadata"] == {"k": "v"}


def test_a_chain_sends_every_turn_in_order_with_the_latest_instructions() -> None:
    history = [
        stored("resp_1", "turn one", "answer one", instructions="old rule"),
        stored("resp_2", "turn two", "answer two", instructions="new rule"),
        stored("resp_3", "turn three", "answer three"),
    ]
    assert to_chat(req(input="turn four"), history)["messages"] == [
        {"role": "system", "content": "new rule"},
        {"role": "user", "content": "turn one"},
        {"role": "assistant", "content": "answer one"},
        {"role": "user", "content": "turn two"},
        {"role": "assistant", "content": "answer two"},
        {"role": "user", "content": "turn three"},
        {"role": "assistant", "content": "answer three"},
        {"role": "user", "content": "turn four"},
    ]
    # the request's own instructions win over the chain's
    assert to_chat(req(input="x", instructions="mine"), history)["messages"][0] == {
        "role": "system",
        "content": "mine",
    }


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, ["input", "required"]),
        ({"input": 5}, ["input: 5", "accepted"]),
        ({"input": []}, ["input", "non-empty"]),
        ({"input": "x", "model": 3}, ["model", "accepted"]),
        ({"input": "x", "store": "yes"}, ["store", "true or false"]),
        ({"input": "x", "temperature": "hot"}, ["temperature", "a number"]),
        ({"input": "x", "max_output_tokens": 0}, ["max_output_tokens", "positive"]),
        ({"input": "x", "tools": [{"type": "web_search"}]}, ["tools[0]", "web_search",
                                                              "supported: function"]),
        ({"input": [{"type": "item_reference", "id": "x"}]}, ["input[0].type", "item_reference"]),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
         ["input[0].content[0]", "input_file"]),
        ({"input": [{"role": "robot", "content": "x"}]}, ["input[0].role", "robot"]),
    ],
)  # fmt: skip
def test_a_request_that_cannot_be_translated_is_a_400_naming_the_field(
    body: dict[str, Any], words: list[str]
) -> None:
    with pytest.raises(InvalidRequest) as err:
        req(**body)
    assert err.value.http_status == 400
    for word in words:
        assert word in err.value.message, err.value.message


# -- the answer ----------------------------------------------------------------------------------


def test_a_chat_answer_is_a_response_object() -> None:
    t = turn_of(input="hi", instructions="rule", metadata={"k": "v"}, previous_response_id="resp_p")
    doc = from_chat(t, chat_doc("hello there"))
    assert doc["id"] == t.response_id and doc["id"].startswith("resp_") and len(doc["id"]) == 29
    assert doc["object"] == "response" and doc["status"] == "completed"
    assert doc["created_at"] == 1_700_000_000 and doc["model"] == "backend-model"
    assert doc["output_text"] == "hello there"
    (item,) = doc["output"]
    assert item["type"] == "message" and item["role"] == "assistant"
    assert item["id"].startswith("item_") and item["status"] == "completed"
    assert item["content"] == [{"type": "output_text", "text": "hello there", "annotations": []}]
    assert doc["usage"]["input_tokens"] == 7 and doc["usage"]["output_tokens"] == 3
    assert doc["usage"]["total_tokens"] == 10
    assert doc["previous_response_id"] == "resp_p" and doc["instructions"] == "rule"
    assert doc["metadata"] == {"k": "v"} and doc["store"] is True
    assert doc["conversation_id"].startswith("conv_")


def test_tool_calls_and_reasoning_become_items() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
    doc = from_chat(turn_of(input="x"), chat_doc("", tool_calls=[call], reasoning_content="hmm"))
    kinds = [i["type"] for i in doc["output"]]
    assert kinds == ["reasoning", "function_call"]
    assert doc["output"][1]["call_id"] == "call_1" and doc["output"][1]["name"] == "f"
    assert doc["output"][1]["arguments"] == '{"a":1}' and doc["output_text"] == ""


def test_the_conversation_id_follows_the_chain() -> None:
    first = stored("resp_1", "a", "b")
    t = Turn.start(req(input="c"), [first], 0.0)
    assert t.conversation_id == first["conversation_id"]
    assert Turn.start(req(input="c", conversation_id="conv_mine"), [first], 0).conversation_id == (
        "conv_mine"
    )


# -- the stream ----------------------------------------------------------------------------------


def sse(model: str, delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    chunk = {"id": "c", "object": "chat.completion.chunk", "model": model, "choices": [choice]}
    return f"data: {json.dumps(chunk)}\n\n".encode()


CHAT_STREAM = (
    sse("m1", {"role": "assistant", "content": "Hel"})
    + sse("m1", {"content": "lo "})
    + sse("m1", {"content": "world"})
    + sse("m1", {}, "stop")
    + b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":3,'
    b'"total_tokens":7}}\n\n' + b"data: [DONE]\n\n"
)


def events_of(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        event_line, data_line = block.split("\n")
        event, data = event_line.removeprefix("event: "), json.loads(data_line[6:])
        assert data["type"] == event
        out.append((event, data))
    return out


@pytest.mark.parametrize("cut", [1, 7, 64, len(CHAT_STREAM)])
def test_a_chat_stream_becomes_the_responses_event_stream_at_any_cut(cut: int) -> None:
    t = turn_of(input="hi", stream=True, store=False)
    translator = StreamTranslator(t)
    raw = b"".join(
        translator.chunk(CHAT_STREAM[i : i + cut]) for i in range(0, len(CHAT_STREAM), cut)
    )
    raw += translator.finish()
    assert b"chat.completion.chunk" not in raw and b"[DONE]" not in raw
    assert b"sequence_number" not in raw
    events = events_of(raw)
    assert [e for e, _ in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    created = events[0][1]["response"]
    assert created["status"] == "in_progress" and created["output"] == []
    assert created["id"] == t.response_id and created["store"] is False
    assert [d["delta"] for e, d in events if e == "response.output_text.delta"] == [
        "Hel", "lo ", "world"]  # fmt: skip
    assert events[3][1]["part"] == {"type": "output_text", "text": "", "annotations": []}
    done = events[-1][1]["response"]
    assert done["status"] == "completed" and done["output_text"] == "Hello world"
    assert done["model"] == "m1" and done["usage"]["total_tokens"] == 7
    assert done["output"][0]["content"][0]["annotations"] == []
    assert translator.completed == done


def test_a_streamed_tool_call_and_a_stream_without_done() -> None:
    t = turn_of(input="x", stream=True)
    translator = StreamTranslator(t)
    calls = [
        {
            "index": 0,
            "id": "call_9",
            "type": "function",
            "function": {"name": "f", "arguments": ""},
        },
        {"index": 0, "function": {"arguments": '{"a"'}},
        {"index": 0, "function": {"arguments": ":1}"}},
    ]
    raw = b"".join(translator.chunk(sse("m", {"tool_calls": [c]})) for c in calls)
    raw += translator.finish()  # the stream ended without data: [DONE]
    events = events_of(raw)
    names = [e for e, _ in events]
    assert names[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert names.count("response.function_call_arguments.delta") == 2
    assert "response.output_text.delta" not in names  # no message item for a tool call alone
    (item,) = events[-1][1]["response"]["output"]
    assert item == {
        "id": item["id"], "type": "function_call", "call_id": "call_9", "name": "f",
        "arguments": '{"a":1}', "status": "completed"}  # fmt: skip


def test_an_empty_answer_still_completes_with_its_message() -> None:
    events, completed = translate_whole(
        turn_of(input="x"), sse("m", {}, "stop") + b"data: [DONE]\n\n"
    )
    assert completed is not None and completed["output_text"] == ""
    assert [e for e, _ in events_of(events)][-1] == "response.completed"
    assert completed["output"][0]["content"] == [
        {"type": "output_text", "text": "", "annotations": []}
    ]
