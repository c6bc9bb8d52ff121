"""A message's text (vllm_sr/router/message_text.py): one walk, each reader's rule. The same
content read by every rule shows where upstream's readers differ."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_sr.router.message_text import (
    CHAT,
    EVAL,
    FINGERPRINT,
    QUESTION,
    SYSTEM,
    TextRule,
    message_text,
)

MIXED: list[Any] = [
    {"type": "text", "text": "a"},
    {"type": "input_text", "text": "b"},
    {"text": "c"},  # untyped
    {"type": " TEXT ", "text": "d"},  # eval trims and lower-cases the type
    {"type": "text", "text": ""},
    {"type": "image_url", "image_url": {"url": "data:"}},
    {"type": ["odd"], "text": "e"},  # an unhashable type is no text type
    "not a part",
]


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (CHAT, "a c"),
        (EVAL, "a b c d e"),
        (QUESTION, "a\n"),
        (SYSTEM, "a\nb\nc"),
        (FINGERPRINT, "a b c d   e"),
    ],
)
def test_each_rule_reads_the_same_parts_its_own_way(rule: TextRule, expected: str) -> None:
    assert message_text(MIXED, rule) == expected


@pytest.mark.parametrize("rule", [CHAT, EVAL, QUESTION, SYSTEM, FINGERPRINT])
def test_a_string_is_its_own_text_and_other_shapes_have_none(rule: TextRule) -> None:
    assert message_text("hello", rule) == "hello"
    assert message_text(None, rule) == "" and message_text(3, rule) == ""


def test_one_part_object_counts_only_for_eval() -> None:
    part = {"type": "text", "text": "x"}
    assert message_text(part, EVAL) == "x"
    assert message_text(part, CHAT) == "" and message_text(part, FINGERPRINT) == ""


def test_fingerprint_stringifies_what_it_finds() -> None:
    assert message_text([{"text": None}, {"text": 5}, {}], FINGERPRINT) == "None 5 "
