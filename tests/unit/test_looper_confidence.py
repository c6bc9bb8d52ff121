"""The confidence looper: upstream's fragment, its block's checks, scores from logprobs, and
the runner's loop (escalation, threshold, on_error, deadline, summed usage, headers, SSE)."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_sr.config.routing_looper import ConfidenceSettings, confidence_problems
from vllm_sr.errors import DeadlineExceeded, Unavailable
from vllm_sr.router.looper.confidence import ordered, parse_size, run_confidence, score

FRAGMENT = (
    Path(__file__).parents[1] / "fixtures/upstream/fragments/algorithm/looper/confidence.yaml"
)


def answer(
    model: str, logprob: float, rival: float | None = None, tokens: int = 3
) -> dict[str, Any]:
    top = [{"token": "x", "logprob": logprob}]
    if rival is not None:
        top.append({"token": "y", "logprob": rival})
    content = [{"token": "x", "logprob": logprob, "top_logprobs": top}] * tokens
    return {
        "id": f"c-{model}",
        "created": 1,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": f"from {model}"},
                "logprobs": {"content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": tokens, "total_tokens": 10 + tokens},
    }


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_upstream_fragment_parses_and_passes_checks() -> None:
    block = yaml.safe_load(FRAGMENT.read_text())["algorithm"]["confidence"]
    assert confidence_problems(("algorithm", "confidence"), block) == []
    settings = ConfidenceSettings.from_block(block)
    assert settings.confidence_method == "hybrid"
    assert settings.threshold == 0.72
    assert settings.escalation_order == "small_to_large"


REFERENCE = Path(__file__).parents[1] / "fixtures/upstream/config.yaml"


def test_upstream_reference_block_is_refused_only_for_tool_call_args() -> None:
    doc = yaml.safe_load(REFERENCE.read_text())
    blocks = [
        d["algorithm"]["confidence"]
        for d in doc["routing"]["decisions"]
        if (d.get("algorithm") or {}).get("type") == "confidence"
    ]
    assert blocks
    problems = confidence_problems(("a",), blocks[0])
    assert [str(p) for p in problems] == [
        str(p) for p in problems if "token_filter 'tool_call_args'" in str(p)
    ]
    assert len(problems) == 1
    block = {**blocks[0], "token_filter": "all"}
    settings = ConfidenceSettings.from_block(block)
    assert (settings.logprob_weight, settings.margin_weight) == (0.65, 0.35)


@pytest.mark.parametrize(
    ("field", "value", "accepted"),
    [
        ("confidence_method", "vibes", "avg_logprob, margin, hybrid, self_verify"),
        ("escalation_order", "random", "size, small_to_large, declared, cost, automix"),
        ("on_error", "retry", "skip, fail"),
        ("token_filter", "alpha", "all, tool_call_args"),
        ("cost_quality_tradeoff", -0.1, "a number within 0-1"),
        ("threshold", 1.5, "a number within 0-1"),
        ("threshold", "high", "a number within 0-1"),
    ],
)
def test_bad_block_names_field_value_and_accepted(field: str, value: Any, accepted: str) -> None:
    problems = confidence_problems(("algorithm", "confidence"), {field: value})
    assert len(problems) == 1
    text = str(problems[0])
    assert field in text and repr(value) in text and accepted in text


def test_hybrid_weights_and_verifier_rules() -> None:
    base = ("a",)
    bad_sum = {"confidence_method": "hybrid", "hybrid_weights": {"logprob_weight": 0.9}}
    (only,) = confidence_problems(base, bad_sum)
    assert "logprob_weight=0.9 and margin_weight=0.5" in str(only) and "sum to 1" in str(only)
    wrong_method = {"confidence_method": "margin", "hybrid_weights": {"logprob_weight": 0.5}}
    (only,) = confidence_problems(base, wrong_method)
    assert "hybrid_weights" in str(only) and "'margin'" in str(only)
    (only,) = confidence_problems(base, {"verifier_server_url": "http://v:1"})
    assert "verifier_server_url" in str(only) and "automix_entailment" in str(only)
    # upstream accepts these; vllm-sr refuses them by name
    for key, value in (("confidence_method", "self_verify"), ("escalation_order", "automix")):
        (only,) = confidence_problems(base, {key: value})
        assert key in str(only) and repr(value) in str(only) and "not supported" in str(only)


def test_escalation_orders() -> None:
    sizes = {"big": parse_size("70B"), "small": parse_size("8b"), "tiny": parse_size("350m")}
    prices = {"big": 3.0, "small": 0.1}
    models = ["big", "odd", "small", "tiny"]

    def order(kind: str) -> list[str]:
        settings = ConfidenceSettings(escalation_order=kind)  # type: ignore[arg-type]
        return ordered(models, settings, sizes.get, prices.get)

    assert order("declared") == models
    assert order("size") == order("small_to_large") == ["tiny", "small", "big", "odd"]
    assert order("cost") == ["small", "big", "odd", "tiny"]
    assert parse_size("huge") is None


def test_unknown_key_is_refused_with_accepted_names() -> None:
    problems = confidence_problems(("a",), {"treshold": 0.5})
    assert (
        len(problems) == 1 and "'treshold'" in str(problems[0]) and "threshold" in str(problems[0])
    )


def test_scores() -> None:
    sure = answer("m", math.log(0.9), math.log(0.05))["choices"][0]["logprobs"]["content"]

    def by(method: str, **kw: Any) -> float | None:
        return score(sure, ConfidenceSettings(confidence_method=method, **kw))  # type: ignore[arg-type]

    assert by("avg_logprob") == pytest.approx(0.9)
    assert by("margin") == pytest.approx(0.85)
    assert by("hybrid") == pytest.approx(0.875)
    assert by("hybrid", logprob_weight=1.0, margin_weight=0.0) == pytest.approx(0.9)
    assert score([], ConfidenceSettings()) is None


def run(models: list[str], answers: dict[str, Any], **kw: Any) -> Any:
    calls: list[tuple[str, dict[str, Any]]] = []
    clock = kw.pop("clock", Clock())
    think = kw.pop("think", 0.0)

    async def call(model: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        calls.append((model, body))
        clock.now += think
        got = answers[model]
        if isinstance(got, Exception):
            raise got
        return model, json.loads(json.dumps(got))

    settings = ConfidenceSettings(**kw.pop("settings", {}))
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    result = asyncio.run(run_confidence(call, models, body, settings, clock, **kw))
    return result, calls


def test_escalates_until_confident_and_sums_usage() -> None:
    answers = {
        "small": answer("small", math.log(0.3)),
        "mid": answer("mid", math.log(0.95)),
        "large": answer("large", math.log(0.99)),
    }
    result, calls = run(["small", "mid", "large"], answers, settings={"threshold": 0.9})
    assert [m for m, _ in calls] == ["small", "mid"]
    assert all(b["stream"] is False and b["logprobs"] is True for _, b in calls)
    assert result.model == "mid" and result.iterations == 2
    assert result.usage == {"prompt_tokens": 20, "completion_tokens": 6, "total_tokens": 26}
    # the caller did not ask for logprobs: the final answer carries none
    assert "logprobs" not in result.final_body()["choices"][0]
    headers = result.headers()
    assert headers["x-vsr-looper-models-used"] == "small,mid"
    assert headers["x-vsr-looper-total-tokens"] == "26"
    assert headers["x-vsr-looper-algorithm"] == "confidence"


def test_no_confident_answer_keeps_the_last() -> None:
    answers = {m: answer(m, math.log(0.2)) for m in ("a", "b")}
    result, calls = run(["b", "a"], answers, settings={"threshold": 0.5})
    assert [m for m, _ in calls] == ["b", "a"]
    assert result.model == "a" and result.iterations == 2


def test_on_error_skip_and_fail() -> None:
    answers: dict[str, Any] = {"a": Unavailable("down"), "b": answer("b", math.log(0.9))}
    result, _ = run(["a", "b"], answers)
    assert result.model == "b" and result.models_used == ["b"]
    with pytest.raises(Unavailable):
        run(["a", "b"], answers, settings={"on_error": "fail"})
    with pytest.raises(Unavailable):
        run(["a"], answers)


def test_deadline_bounds_the_loop_on_a_fake_clock() -> None:
    answers = {m: answer(m, math.log(0.2)) for m in ("a", "b", "c")}
    result, calls = run(
        ["a", "b", "c"], answers, think=2.0, deadline=3.0, settings={"threshold": 0.9}
    )
    assert [m for m, _ in calls] == ["a", "b"]
    assert result.model == "b" and result.latency_s == pytest.approx(4.0)
    with pytest.raises(DeadlineExceeded):
        run(["a"], answers, deadline=0.0)


def test_final_sse_streams_the_final_answer_with_summed_usage() -> None:
    answers = {"a": answer("a", math.log(0.2)), "b": answer("b", math.log(0.99))}
    result, _ = run(["a", "b"], answers, settings={"threshold": 0.5})
    events = [e for e in result.final_sse().decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "from b"
    assert chunks[-1]["usage"]["total_tokens"] == 26


def test_an_integer_past_a_floats_range_is_a_problem_not_a_crash() -> None:
    """YAML reads a 400-digit literal as an int; float() of it raises OverflowError."""
    problems = confidence_problems(("a",), {"threshold": 10**400})
    assert [p.path for p in problems] == [("a", "threshold")]
