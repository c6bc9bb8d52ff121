"""RequestView: the texts and facts the signals see, from a chat body and from an eval payload,
as upstream extracts them."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_sr.errors import InvalidRequest
from vllm_sr.router.context_estimate import request_token_floor
from vllm_sr.router.request_view import RequestView

CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def test_text_is_the_last_user_message_with_text() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "second"},
                    {"text": "part"},
                    {"type": "image_url", "image_url": {"url": "u"}},
                ],
            },
            {"role": "tool", "content": "tool output"},
            {"role": "user", "content": ""},
        ]
    }
    v = RequestView.from_chat(body, {"X-Authz-User-Id": "ann"})
    assert v.text == v.current_user_text == "second part"
    assert v.prior_user_texts == ("first",)
    assert v.non_user_texts == ("be brief", "ok")  # tool messages excluded
    assert v.context_text == "be brief ok second part"
    assert v.headers == {"x-authz-user-id": "ann"}
    assert v.has_assistant_reply
    f = v.facts
    assert (f.user_messages, f.assistant_messages, f.system_messages, f.tool_messages) == (
        3,
        1,
        1,
        1,
    )
    assert f.image_parts == 1 and f.last_role == "user" and f.last_user_after_tool_result


def test_without_user_text_the_non_user_texts_stand_in() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "classify this"},
            {"role": "developer", "content": "carefully"},
        ]
    }
    v = RequestView.from_chat(body, {})
    assert v.text == "classify this carefully"
    assert v.current_user_text == ""
    assert v.facts.has_developer_message


def test_chat_roles_are_exact_and_odd_shapes_are_ignored() -> None:
    body = {
        "messages": [
            {"role": "User", "content": "x"},
            "junk",
            {"content": "y"},
            {"role": "user", "content": {"type": "text", "text": "object"}},
        ]
    }
    v = RequestView.from_chat(body, {})
    assert v.text == "" and v.facts.user_messages == 1
    assert RequestView.from_chat({"messages": "nope"}, {}).text == ""


def test_assistant_tool_calls_and_tool_results() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [CALL, CALL]},
            {"role": "tool", "content": "1"},
        ],
        "tools": [{"type": "function"}],
        "functions": [{"name": "g"}, {"name": "h"}],
    }
    f = RequestView.from_chat(body, {}).facts
    assert (f.assistant_tool_calls, f.tool_results, f.tool_definitions) == (2, 1, 3)
    assert f.active_tool_loop and f.last_message_tool_result


# -- eval -----------------------------------------------------------------------------------


def test_eval_text_only() -> None:
    v = RequestView.from_eval({"text": "  hello there  ", "tools": [{"type": "function"}]})
    assert v.text == v.context_text == "hello there"
    assert v.current_user_text == "  hello there  "
    assert (v.facts.user_messages, v.facts.tool_definitions, v.facts.last_role) == (1, 1, "user")
    assert v.context_floor == request_token_floor(
        {
            "messages": [{"role": "user", "content": "  hello there  "}],
            "tools": [{"type": "function"}],
        }
    )


def test_eval_messages_take_precedence_and_are_read_like_upstreams_eval() -> None:
    payload = {
        "text": "ignored",
        "messages": [
            {"role": " System ", "content": "  rules  "},
            {"role": "user", "content": [{"type": "input_text", "text": " hi "}]},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}}
                ],
            },
        ],
    }
    v = RequestView.from_eval(payload)
    assert v.text == "hi"  # the image-only turn keeps the previous user text
    assert v.current_user_text == " hi "
    assert v.non_user_texts == ("rules",)
    assert v.context_text == "rules hi"
    assert (v.facts.user_messages, v.facts.system_messages, v.facts.image_parts) == (2, 1, 1)


def test_eval_text_fills_in_when_messages_carry_none() -> None:
    payload = {"text": "the question", "messages": [{"role": "tool", "content": "42"}]}
    v = RequestView.from_eval(payload)
    assert v.text == "the question" and v.current_user_text == "the question"
    assert v.facts.tool_messages == 1
    assert v.context_floor == request_token_floor(
        {"messages": [*payload["messages"], {"role": "user", "content": "the question"}]}
    )


def test_eval_metadata_alone_is_enough() -> None:
    v = RequestView.from_eval({"metadata": {"tier": "gold"}})
    assert v.metadata == {"tier": "gold"} and v.text == ""


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({}, "text"),
        ({"text": ""}, "text"),
        ({"text": 3}, "text"),
        ({"messages": {"role": "user"}}, "messages"),
        ({"messages": ["hi"]}, "messages[0]"),
        ({"text": "x", "metadata": {"k": 1}}, "metadata.k"),
        ({"text": "x", "metadata": []}, "metadata"),
        ({"text": "x", "tools": {}}, "tools"),
    ],
)
def test_eval_bad_payloads_are_400s_naming_the_field(payload: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        RequestView.from_eval(payload)
    assert err.value.details["field"] == field
