"""v0.4's routing preview envelope (vllm_sr/router/preview.py): what it accepts and refuses is
checked against upstream's own validator from the 0.4.0 wheel
(tests/fixtures/upstream/v0.4/preview/routing_preview.py), and each refusal names the field,
the value and what is accepted."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from vllm_sr.router.eval import EvalError
from vllm_sr.router.preview import PreviewContext, parse_body, parse_preview

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "upstream" / "v0.4" / "preview"


def upstream_validator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "upstream_routing_preview", FIXTURES / "routing_preview.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


UPSTREAM = upstream_validator()
TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look one up."}}

ACCEPTED: list[dict[str, Any]] = [
    {"text": "hello"},
    {"text": "hi", "model": "vllm-sr/auto", "options": {"trace": True}},
    {"messages": [{"role": "user", "content": "hi"}]},
    {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "look"}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
            {"role": "tool", "tool_call_id": "c1", "content": "42", "name": "lookup"},
            {"role": "assistant", "content": "x", "refusal": None, "reasoning_content": "y"},
        ]
    },
    {"text": "x", "tools": [TOOL], "tool_choice": "required"},
    {"text": "x", "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "a"}}},
    {"text": "x", "functions": [{"name": "f"}], "function_call": "auto"},
    {"text": "x", "response_format": {"type": "json_object"}, "max_tokens": 10},
    {"text": "x", "max_completion_tokens": 5},
    {"text": "x", "metadata": {f"k{i}": "v" for i in range(32)}},
    {"text": "x", "metadata": {"k" * 128: "v" * 1024}},
    {
        "text": "x",
        "options": {
            "return_probabilities": True,
            "confidence_threshold": 0.5,
            "include_explanation": False,
        },
    },
    {"text": "x", "preview_context": {"session_id": "s", "conversation_id": "c"}},
    {"text": "x", "preview_context": {"sampling_seed": -(2**63)}},
    {"text": "x", "preview_context": {"sampling_seed": 2**63 - 1}},
]

REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"text": "x", "stream": True}, "field stream: unknown field"),
    ({"text": 3}, "field text: got 3 (number); accepted: a string"),
    ({"text": "x", "model": ["a"]}, "field model: got"),
    ({"messages": {"role": "user"}}, "field messages: got"),
    ({"messages": [{"role": "user", "content": "x", "extra": 1}]}, "field messages[0].extra"),
    ({"messages": [{"content": "x"}]}, "field messages[0].role: got null (null)"),
    ({"messages": [{"role": "  ", "content": "x"}]}, 'field messages[0].role: got "  "'),
    ({"messages": ["hi"]}, 'field messages[0]: got "hi" (string)'),
    ({"messages": [{"role": "tool", "tool_call_id": 7}]}, "field messages[0].tool_call_id"),
    ({"messages": [{"role": "assistant", "tool_calls": {}}]}, "field messages[0].tool_calls"),
    ({"text": "x", "tools": {"type": "function"}}, "field tools: got"),
    ({"text": "x", "functions": "f"}, "field functions: got"),
    ({"text": "x", "metadata": ["a"]}, "field metadata: got"),
    ({"text": "x", "metadata": {f"k{i}": "v" for i in range(33)}}, "field metadata: 33 entries"),
    ({"text": "x", "metadata": {"": "v"}}, 'field metadata: key ""'),
    ({"text": "x", "metadata": {"k" * 129: "v"}}, "field metadata: key"),
    ({"text": "x", "metadata": {"tier": 1}}, "field metadata.tier: got 1 (number)"),
    ({"text": "x", "metadata": {"k": "v" * 1025}}, "field metadata.k"),
    ({"text": "x", "options": {"tracee": True}}, "field options.tracee: unknown field"),
    ({"text": "x", "options": "trace"}, 'field options: got "trace" (string)'),
    ({"text": "x", "preview_context": {"user": "u"}}, "field preview_context.user"),
    ({"text": "x", "preview_context": []}, "field preview_context: got [] (array)"),
    (
        {"text": "x", "preview_context": {"session_id": "a\nb"}},
        "field preview_context.session_id",
    ),
    (
        {"text": "x", "preview_context": {"conversation_id": "c" * 1025}},
        "field preview_context.conversation_id",
    ),
    (
        {"text": "x", "preview_context": {"sampling_seed": 2**63}},
        "field preview_context.sampling_seed: got 9223372036854775808 (number); accepted: "
        "a signed 64-bit integer",
    ),
    (
        {"text": "x", "preview_context": {"sampling_seed": True}},
        "field preview_context.sampling_seed: got true (boolean)",
    ),
    ({"text": "x", "preview_context": {"sampling_seed": 1.5}}, "sampling_seed: got 1.5"),
]


def upstream_accepts(envelope: dict[str, Any]) -> bool:
    try:
        UPSTREAM.build_preview_request(envelope)
    except (ValueError, TypeError):
        return False
    return True


@pytest.mark.parametrize("envelope", ACCEPTED)
def test_what_upstream_accepts_is_accepted(envelope: dict[str, Any]) -> None:
    assert upstream_accepts(envelope)
    request = parse_preview(envelope)
    assert request.payload == envelope


@pytest.mark.parametrize(("envelope", "named"), REFUSED)
def test_what_upstream_refuses_is_refused_naming_field_value_and_accepted(
    envelope: dict[str, Any], named: str
) -> None:
    assert not upstream_accepts(envelope)
    with pytest.raises(EvalError) as caught:
        parse_preview(envelope)
    assert caught.value.code == "INVALID_INPUT"
    assert caught.value.http_status == 400
    assert named in caught.value.message
    assert "accepted: " in caught.value.message


def test_unknown_fields_list_what_is_accepted() -> None:
    with pytest.raises(EvalError) as caught:
        parse_preview({"text": "x", "temperature": 0.2})
    message = caught.value.message
    assert message.startswith("field temperature: unknown field")
    for name in ("text", "messages", "tools", "tool_choice", "metadata", "options"):
        assert name in message.split("accepted: ")[1]


def test_option_types_are_checked_as_upstreams_decoder_does() -> None:
    # The Go server decodes options into typed fields (bool trace, float threshold): a string
    # there is a 400, although the wheel's Python check looks only at the option names.
    with pytest.raises(EvalError, match=r'field options.trace: got "yes" \(string\); accepted'):
        parse_preview({"text": "x", "options": {"trace": "yes"}})
    with pytest.raises(EvalError, match=r"field options\.confidence_threshold: got true"):
        parse_preview({"text": "x", "options": {"confidence_threshold": True}})


def test_trace_and_context_are_read() -> None:
    assert parse_preview({"text": "x", "options": {"trace": True}}).trace is True
    assert parse_preview({"text": "x", "options": {"trace": False}}).trace is False
    assert parse_preview({"text": "x"}).trace is False
    got = parse_preview(
        {"text": "x", "preview_context": {"session_id": "s1", "sampling_seed": 7}}
    ).context
    assert got == PreviewContext(session_id="s1", conversation_id=None, sampling_seed=7)


def test_the_body_is_a_finite_json_object() -> None:
    assert parse_body(b'{"text": "x", "options": {"confidence_threshold": 0.5}}')["text"] == "x"
    for constant in ("NaN", "Infinity", "-Infinity"):
        raw = f'{{"text": "x", "options": {{"confidence_threshold": {constant}}}}}'.encode()
        with pytest.raises(EvalError, match=f"the body holds {constant}; accepted: finite"):
            parse_body(raw)
        with pytest.raises(ValueError):  # upstream refuses it too (allow_nan=False)
            UPSTREAM.build_preview_request(json.loads(raw))
    with pytest.raises(EvalError, match=r"field request: got \[1\] \(array\)"):
        parse_body(b"[1]")
    with pytest.raises(EvalError, match="not valid JSON"):
        parse_body(b'{"text": ')
    with pytest.raises(EvalError, match="at most 10 MiB"):
        parse_body(b" " * (10 * 1024 * 1024 + 1))
