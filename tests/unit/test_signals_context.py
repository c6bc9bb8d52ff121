"""The context signal: upstream's token counts (K/M forms), its request token estimate (bytes,
structured JSON, images, framing, output reserve) and the inclusive band, on upstream's
``context/long-context.yaml`` fragment and upstream's own estimator cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from vllm_sr.config.routing_signals import Signals
from vllm_sr.config.signal_families import ContextSignal, parse_token_count
from vllm_sr.router.context_estimate import (
    IMAGE_TOKENS,
    MESSAGE_FRAMING,
    request_token_floor,
)
from vllm_sr.router.deterministic import DeterministicSignals
from vllm_sr.router.request_view import RequestView

FRAGMENTS = Path(__file__).parents[1] / "fixtures" / "upstream" / "fragments" / "signal"


def fragment(path: str) -> Signals:
    """An upstream fragment's ``routing.signals``, loaded unchanged."""
    doc = yaml.safe_load((FRAGMENTS / path).read_text())
    return Signals.model_validate(doc["routing"]["signals"])


@pytest.mark.parametrize(
    ("raw", "count"),
    [
        ("32K", 32000),
        ("256k", 256000),
        (" 1.5M ", 1_500_000),
        ("0.5K", 500),
        (100, 100),
        ("", 0),
        (None, 0),
        ("1e3", 1000),
        ("7.9", 7),
    ],
)
def test_token_counts_parse_as_upstream(raw: object, count: int) -> None:
    assert parse_token_count(raw) == count  # type: ignore[arg-type]


@pytest.mark.parametrize("raw", ["32KB", "lots", "K", "1,000", True])
def test_an_unparsable_count_is_a_load_error_naming_the_value(raw: object) -> None:
    with pytest.raises(ValidationError, match="token count"):
        ContextSignal.model_validate({"name": "c", "min_tokens": raw, "max_tokens": "1K"})


def view(context_text: str, floor: int = 0) -> RequestView:
    return RequestView(text=context_text, context_text=context_text, context_floor=floor)


def test_long_context_fragment_band_is_inclusive() -> None:
    signals = fragment("context/long-context.yaml")
    (rule,) = signals.context
    assert (rule.min_count, rule.max_count) == (32000, 256000)
    sigs = DeterministicSignals(signals)
    key = ("context", "long_context")
    for tokens, matched in [(31999, False), (32000, True), (256000, True), (256001, False)]:
        report = sigs.report(view("x" * (4 * tokens)))
        assert report.context_tokens == tokens
        assert report.results[key].matched is matched
        assert report.results[key].value is None  # upstream records no value for context
    # The floor raises a short text into the band (tool schemas, images...).
    assert sigs.evaluate(view("short", floor=40000))[key].matched


def test_omitted_max_matches_only_an_empty_request_as_upstream() -> None:
    sigs = DeterministicSignals(Signals(context=[ContextSignal(name="big", min_tokens="1K")]))
    assert not sigs.evaluate(view("x" * 40000))[("context", "big")].matched
    sigs = DeterministicSignals(Signals(context=[ContextSignal(name="none")]))
    assert sigs.evaluate(view(""))[("context", "none")].matched


def test_text_estimate_is_ceil_of_utf8_bytes_over_four() -> None:
    assert view("abcde").context_tokens() == 2
    assert view("中文").context_tokens() == 2  # 6 bytes
    assert view("").context_tokens() == 0


# Upstream's estimator cases (request_context_estimate_test.go), restated.


def test_plain_text_floor() -> None:
    floor = request_token_floor(
        {"model": "auto", "messages": [{"role": "user", "content": "hello"}]}
    )
    assert floor == 3 + MESSAGE_FRAMING  # ceil(len("user" + "hello") / 4) + 4


def test_tool_arguments_count_as_their_raw_json_string() -> None:
    arguments = '{"ticket":90071992547409931234567890123456789}'
    body = {
        "messages": [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"function": {"name": "lookup", "arguments": arguments}}],
            }
        ]
    }
    text_tokens = -(-len("assistant" + "lookup") // 4)
    assert request_token_floor(body) == (
        text_tokens + len(json.dumps(arguments)) + MESSAGE_FRAMING + 8
    )


def test_image_uses_a_fixed_budget_whatever_its_payload() -> None:
    def body(payload: str) -> dict[str, object]:
        return {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "hi"},
                        {
                            "type": "image_url",
                            "image_url": {"url": f"data:image/png;base64,{payload}"},
                        },
                    ],
                }
            ]
        }

    small = request_token_floor(body("AAA"))
    assert small == request_token_floor(body("PRIVATE" * 20000))
    assert small == IMAGE_TOKENS + 2 + MESSAGE_FRAMING  # ceil(len("user" + "hi") / 4) = 2


def test_output_reserve_prefers_max_completion_tokens_and_counts_once() -> None:
    base = {"messages": [{"role": "user", "content": "ok"}]}
    plain = request_token_floor(base)
    assert request_token_floor({**base, "max_tokens": 4096, "max_completion_tokens": 2048}) == (
        plain + 2048
    )
    assert request_token_floor({**base, "max_tokens": 4096}) == plain + 4096
    # Malformed: counted as structured bytes instead ("1.5" is 3 bytes).
    assert request_token_floor({**base, "max_tokens": 1.5}) == plain + 3


def test_tool_definitions_and_results_are_structured_bytes_plus_framing() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    base = {"messages": [{"role": "user", "content": "ok"}]}
    with_tool = request_token_floor({**base, "tools": [tool]})
    compact = len(json.dumps(tool, separators=(",", ":")))
    assert with_tool == request_token_floor(base) + compact + 8
    result = {"messages": [{"role": "tool", "tool_call_id": "c1", "content": "42 degrees"}]}
    # role + tool_call_id are text; the tool's content is structured ("\"42 degrees\"").
    assert request_token_floor(result) == (
        -(-len("tool" + "c1") // 4) + len('"42 degrees"') + MESSAGE_FRAMING + 8
    )


def test_chat_view_counts_non_user_and_current_user_text_not_prior_turns() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "S" * 40},
            {"role": "user", "content": "P" * 4000},
            {"role": "assistant", "content": "A" * 40},
            {"role": "tool", "content": "T" * 4000},
            {"role": "user", "content": "U" * 40},
        ]
    }
    v = RequestView.from_chat(body, {})
    assert v.context_text == " ".join(["S" * 40, "A" * 40, "U" * 40])
    # ... but the floor counts everything (prior turn, tool result), so it wins.
    assert v.context_tokens() == v.context_floor > (4000 // 4) + 4000
