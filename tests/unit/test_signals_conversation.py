"""The conversation signal on upstream's ``conversation/agentic-shape.yaml`` fragment: the counts
a chat's messages give, the tool-loop state, exists vs count, and the load-time rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from vllm_sr.config.routing_signals import Signals
from vllm_sr.config.signal_families import ConversationSignal
from vllm_sr.router.deterministic import DeterministicSignals, conversation_count
from vllm_sr.router.request_view import ConversationFacts, RequestView

FRAGMENTS = Path(__file__).parents[1] / "fixtures" / "upstream" / "fragments" / "signal"


def fragment(path: str) -> Signals:
    """An upstream fragment's ``routing.signals``, loaded unchanged."""
    doc = yaml.safe_load((FRAGMENTS / path).read_text())
    return Signals.model_validate(doc["routing"]["signals"])


def agentic() -> DeterministicSignals:
    return DeterministicSignals(fragment("conversation/agentic-shape.yaml"))


def matched(body: dict[str, Any]) -> set[str]:
    out = agentic().evaluate(RequestView.from_chat(body, {}))
    return {name for (_, name), r in out.items() if r.matched}


TOOL = {"type": "function", "function": {"name": "f", "parameters": {}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def test_a_single_question_matches_nothing() -> None:
    assert matched({"messages": [{"role": "user", "content": "hi"}]}) == set()


def test_multi_turn_counts_user_messages_even_empty_ones() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "answer"},
            {"role": "user", "content": ""},
        ]
    }
    assert matched(body) == {"multi_turn_user"}


def test_developer_message_and_tool_definitions() -> None:
    body = {
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": "x"},
        ],
        "tools": [TOOL, TOOL],
        "functions": [{"name": "g"}],
    }
    assert matched(body) == {"has_developer_message", "tool_heavy"}


def test_an_open_tool_loop_then_a_completed_cycle() -> None:
    calling = {
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
        ]
    }
    assert matched(calling) == {"active_tool_use", "current_tool_loop"}  # calls > results
    answered = {
        "messages": [
            *calling["messages"],
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ]
    }
    assert matched(answered) == {"active_tool_use", "completed_tool_cycle", "current_tool_loop"}
    closed = {
        "messages": [
            *answered["messages"],
            {"role": "assistant", "content": "Sunny."},
            {"role": "user", "content": "thanks"},
        ]
    }
    assert matched(closed) == {"active_tool_use", "completed_tool_cycle", "multi_turn_user"}


def test_a_user_turn_right_after_a_tool_result_keeps_the_loop_active() -> None:
    body = {
        "messages": [
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "content": "42"},
            {"role": "user", "content": "go on"},
        ]
    }
    assert "current_tool_loop" in matched(body)


def test_values_are_recorded_for_unmatched_rules_too() -> None:
    out = agentic().evaluate(
        RequestView.from_chat({"messages": [{"role": "user", "content": "x"}]}, {})
    )
    res = out[("conversation", "multi_turn_user")]
    assert (res.matched, res.confidence, res.value) == (False, 0.0, 1.0)
    assert out[("conversation", "current_tool_loop")].value == 0.0


def test_only_wanted_rules_are_evaluated() -> None:
    view = RequestView.from_chat({"messages": [{"role": "user", "content": "x"}]}, {})
    out = agentic().evaluate(view, {("conversation", "tool_heavy"), ("keyword", "k")})
    assert set(out) == {("conversation", "tool_heavy")}


def rule(source: dict[str, str], feature: str = "count", **predicate: float) -> ConversationSignal:
    doc: dict[str, Any] = {"name": "r", "feature": {"type": feature, "source": source}}
    if predicate:
        doc["predicate"] = predicate
    return ConversationSignal.model_validate(doc)


def test_role_counts_as_upstream() -> None:
    facts = ConversationFacts(
        user_messages=2,
        assistant_messages=2,
        system_messages=1,
        tool_messages=3,
        has_developer_message=True,
    )
    assert conversation_count(rule({"type": "message", "role": "non_user"}), facts) == 2 + 1 + 3 + 1
    assert conversation_count(rule({"type": "message"}), facts) == 2 + 2 + 1 + 3 + 1
    assert conversation_count(rule({"type": "message", "role": "developer"}), facts) == 1


def test_image_parts_in_user_messages() -> None:
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this"},
                    {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                    {"type": "input_image", "image_url": "data:image/png;base64,AAA"},
                ],
            }
        ]
    }
    facts = RequestView.from_chat(body, {}).facts
    assert conversation_count(rule({"type": "image_content"}), facts) == 2


def test_an_empty_role_means_every_message_as_upstream() -> None:
    facts = ConversationFacts(user_messages=1, assistant_messages=1)
    assert conversation_count(rule({"type": "message", "role": ""}), facts) == 2
    assert rule({"type": "tool_definition", "role": ""}).feature.source.role is None


def test_count_without_predicate_always_matches() -> None:
    sigs = DeterministicSignals(Signals(conversation=[rule({"type": "tool_definition"})]))
    assert sigs.evaluate(RequestView(text=""))[("conversation", "r")].matched


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            {"feature": {"type": "exists", "source": {"type": "message"}}, "predicate": {"gt": 1}},
            "does not accept a predicate",
        ),
        (
            {"feature": {"type": "count", "source": {"type": "tool_definition", "role": "user"}}},
            "only valid with feature.source.type message",
        ),
        (
            {"feature": {"type": "count", "source": {"type": "message", "role": "robot"}}},
            "'user', 'assistant'",
        ),
        ({"feature": {"type": "density", "source": {"type": "message"}}}, "'count' or 'exists'"),
        ({"feature": {"type": "count", "source": {"type": "turns"}}}, "'message'"),
    ],
)
def test_load_rules_as_upstream(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as err:
        ConversationSignal.model_validate({"name": "r", **doc})
    assert message in str(err.value)
