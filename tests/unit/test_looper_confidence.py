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

from vllm_sr.errors import DeadlineExceeded, Unavailable
from vllm_sr.router.looper.confidence import ConfidenceSettings, confidence_problems, score
from vllm_sr.router.looper.runner import run_confidence

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
    settings = ConfidenceSettings(**block)
    assert settings.confidence_method == "hybrid"
    assert settings.threshold == 0.72


@pytest.mark.parametrize(
    ("field", "value", "accepted"),
    [
        ("confidence_method", "vibes", "avg_logprob, margin, hybrid"),
        ("escalation_order", "random", "small_to_large, large_to_small"),
        ("on_error", "retry", "skip, fail"),
        ("threshold", 1.5, "a number within 0-1"),
        ("threshold", "high", "a number within 0-1"),
    ],
)
def test_bad_block_names_field_value_and_accepted(field: str, value: Any, accepted: str) -> None:
    problems = confidence_problems(("algorithm", "confidence"), {field: value})
    assert len(problems) == 1
    text = str(problems[0])
    assert field in text and repr(value) in text and accepted in text


def test_unknown_key_is_refused_with_accepted_names() -> None:
    problems = confidence_problems(("a",), {"treshold": 0.5})
    assert (
        len(problems) == 1 and "'treshold'" in str(problems[0]) and "threshold" in str(problems[0])
    )


def test_scores() -> None:
    sure = answer("m", math.log(0.9), math.log(0.05))["choices"][0]["logprobs"]["content"]
    assert score(sure, "avg_logprob") == pytest.approx(0.9)
    assert score(sure, "margin") == pytest.approx(0.85)
    assert score(sure, "hybrid") == pytest.approx(0.875)
    assert score([], "hybrid") is None


def run(models: list[str], answers: dict[str, Any], **kw: Any) -> Any:
    calls: list[tuple[str, dict[str, Any]]] = []
    clock = kw.pop("clock", Clock())
    think = kw.pop("think", 0.0)

    async def call(model: str, body: dict[str, Any]) -> dict[str, Any]:
        calls.append((model, body))
        clock.now += think
        got = answers[model]
        if isinstance(got, Exception):
            raise got
        return json.loads(json.dumps(got))

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


def test_large_to_small_and_no_confident_answer_keeps_the_last() -> None:
    answers = {m: answer(m, math.log(0.2)) for m in ("a", "b")}
    result, calls = run(["a", "b"], answers, settings={"escalation_order": "large_to_small"})
    assert [m for m, _ in calls] == ["b", "a"]
    assert result.model == "a" and result.iterations == 2


def test_on_error_skip_and_fail() -> None:
    answers: dict[str, Any] = {"a": Unavailable("down"), "b": answer("b", math.log(0.1))}
    result, _ = run(["a", "b"], answers)
    assert result.model == "b" and result.models_used == ["b"]
    with pytest.raises(Unavailable):
        run(["a", "b"], answers, settings={"on_error": "fail"})
    with pytest.raises(Unavailable):
        run(["a"], answers)


def test_deadline_bounds_the_loop_on_a_fake_clock() -> None:
    answers = {m: answer(m, math.log(0.2)) for m in ("a", "b", "c")}
    result, calls = run(["a", "b", "c"], answers, think=2.0, deadline=3.0)
    assert [m for m, _ in calls] == ["a", "b"]
    assert result.model == "b" and result.latency_s == pytest.approx(4.0)
    with pytest.raises(DeadlineExceeded):
        run(["a"], answers, deadline=0.0)


def test_final_sse_streams_the_final_answer_with_summed_usage() -> None:
    answers = {"a": answer("a", math.log(0.2)), "b": answer("b", math.log(0.99))}
    result, _ = run(["a", "b"], answers)
    events = [e for e in result.final_sse().decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "from b"
    assert chunks[-1]["usage"]["total_tokens"] == 26
