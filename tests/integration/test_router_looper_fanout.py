"""The ratings, remom, fusion and workflows loopers end to end: the Router-mode handlers in our HTTP
server, real stand-in backends (one with a think time), the official openai SDK as the
client; streamed and not, a backend failing mid-loop, the caller's deadline, summed usage,
upstream's ``x-vsr-looper-*`` headers and the per-algorithm counts."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import BaseModel

from tests.support.backends import StandInBackend
from tests.support.router_app import AUTO, Served, routed_stand_ins
from vllm_sr.config.routing import Routing
from vllm_sr.router.chat import ChatRouter
from vllm_sr.wire import DEADLINE_HEADER

NAMES = ("a", "b", "judge", "planner")


def decision(name: str, refs: list[str], algorithm: dict[str, object]) -> dict[str, object]:
    return {
        "name": name,
        "priority": 10,
        "rules": {"operator": "AND", "conditions": [{"type": "keyword", "name": name}]},
        "modelRefs": [{"model": m} for m in refs],
        "algorithm": algorithm,
    }


ROUTING = {
    "signals": {
        "keywords": [
            {"name": n, "operator": "OR", "keywords": [n]}
            for n in ("rate", "mom", "fuse", "vote", "flow")
        ]
    },
    "decisions": [
        decision("rate", ["a", "b"], {"type": "ratings", "ratings": {"max_concurrent": 1}}),
        decision(
            "mom",
            ["a", "b", "judge"],
            {
                "type": "remom",
                "remom": {
                    "breadth_schedule": [2],
                    "model_distribution": "round_robin",
                    "synthesis_model": "judge",
                    "min_successful_responses": 1,
                    "include_intermediate_responses": True,
                    "temperature": 0.6,
                },
            },
        ),
        decision(
            "fuse",
            ["a"],
            {
                "type": "fusion",
                "fusion": {
                    "model": "judge",
                    "analysis_models": ["a", "b"],
                    "include_analysis": False,
                    "include_intermediate_responses": True,
                },
            },
        ),
        decision(
            "vote",
            ["a", "b"],
            {"type": "fusion", "fusion": {"model": "judge", "on_error": "fail"}},
        ),
        decision(
            "flow",
            ["a", "b", "planner"],
            {
                "type": "workflows",
                "workflows": {
                    "mode": "dynamic",
                    "template": "micro_agent",
                    "planner": {"model": "planner", "max_completion_tokens": 256},
                    "final": {"model": "b"},
                    "max_steps": 2,
                    "max_parallel": 2,
                    "on_error": "skip",
                },
            },
        ),
    ],
}
PLAN = {
    "steps": [
        {"id": "solve", "role": "worker", "models": ["a", "b"], "prompt": "Solve it."},
        {"id": "check", "role": "verifier", "models": ["a"], "access_list": ["solve:1:b"]},
    ],
    "final": {"prompt": "Give the answer."},
}


@dataclass
class Stack:
    backends: dict[str, StandInBackend]
    chat: ChatRouter
    served: Served
    client: openai.AsyncOpenAI


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with routed_stand_ins(NAMES, Routing.model_validate(ROUTING), default="judge") as r:
        yield Stack(r.backends, r.chat, r.served, r.served.client())


async def ask(
    stack: Stack, text: str, headers: dict[str, str] | None = None
) -> tuple[ChatCompletion, Mapping[str, str]]:
    raw = await stack.client.chat.completions.with_raw_response.create(
        model=AUTO, messages=[{"role": "user", "content": text}], extra_headers=headers
    )
    return raw.parse(), raw.headers


async def ask_streamed(
    stack: Stack, text: str
) -> tuple[list[ChatCompletionChunk], Mapping[str, str]]:
    raw = await stack.client.chat.completions.with_raw_response.create(
        model=AUTO,
        messages=[{"role": "user", "content": text}],
        stream=True,
        stream_options={"include_usage": True},
    )
    return [c async for c in raw.parse()], raw.headers


def streamed_text(chunks: list[ChatCompletionChunk]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def extra(obj: BaseModel) -> dict[str, object]:
    """The fields the SDK's model does not declare (the loopers' traces, a choice's model)."""
    return dict(obj.model_extra or {})


def dig(value: object, *path: str | int) -> object:
    """``value[path[0]][path[1]]...`` through JSON objects and lists."""
    for key in path:
        if isinstance(key, int):
            assert isinstance(value, list), value
            value = value[key]
        else:
            assert isinstance(value, dict), value
            value = value[key]
    return value


def column(value: object, key: str) -> list[object]:
    """``[item[key] for item in value]`` of a JSON list of objects."""
    assert isinstance(value, list), value
    return [dig(item, key) for item in value]


def content(parsed: ChatCompletion) -> str:
    return parsed.choices[0].message.content or ""


def tokens(parsed: ChatCompletion) -> int:
    assert parsed.usage is not None
    return parsed.usage.total_tokens


async def test_ratings_answers_one_choice_per_model(stack: Stack) -> None:
    parsed, headers = await ask(stack, "rate this")
    assert [c.message.content for c in parsed.choices] == ["a got: rate this", "b got: rate this"]
    assert [extra(c)["model"] for c in parsed.choices] == ["a", "b"]
    assert headers["x-vsr-looper-algorithm"] == "ratings"
    assert headers["x-vsr-looper-models-used"] == "a,b"
    assert headers["x-vsr-looper-iterations"] == "2"
    assert headers["x-vsr-looper-total-tokens"] == "4" and tokens(parsed) == 4
    assert stack.chat.stats.looper_runs[("ratings", "ok")] == 1
    assert stack.chat.stats.looper_calls[("ratings", "b")] == 1


async def test_ratings_streamed_and_with_a_failing_model(stack: Stack) -> None:
    stack.backends["b"].fault = "503"
    chunks, headers = await ask_streamed(stack, "rate this")
    text = streamed_text(chunks)
    # b's own failure falls back to the default model (judge), as any chat does
    assert text == "a got: rate this"
    assert headers["x-vsr-looper-models-used"] == "a,judge"
    assert [c.usage.total_tokens for c in chunks if c.usage] == [4]


async def test_remom_rounds_then_synthesis(stack: Stack) -> None:
    stack.backends["b"].fault, stack.backends["b"].slow_s = "slow", 1.5  # a think time
    parsed, headers = await ask(stack, "mom question")
    text = content(parsed)
    # the final round: the synthesis model, asked to synthesise round 1's answers
    assert text.startswith("judge got: You are given a problem and a list of reference")
    assert "Original Problem:\nmom question" in text
    assert headers["x-vsr-looper-model"] == "judge"
    assert headers["x-vsr-looper-algorithm"] == "remom"
    rounds = extra(parsed)["reasoning_mom_responses"]
    assert column(rounds, "round") == [1, 2]
    # round 1 ends at its quorum of one usable answer: the other call is cancelled
    first = dig(rounds, 0, "responses")
    assert first == [
        {
            "model": "a",
            "content": "a got: mom question",
            "compacted_content": "a got: mom question",
            "token_count": 4,
        }
    ]
    assert "Reference 1 (a):\na got: mom question" in text
    assert int(headers["x-vsr-looper-latency-ms"]) < 1500
    sent = stack.backends["judge"].received[-1].body
    assert sent["temperature"] == 0.6 and sent["stream"] is False
    assert int(headers["x-vsr-looper-iterations"]) == 2
    assert tokens(parsed) == 4


async def test_remom_streamed_with_a_backend_failing_mid_loop(stack: Stack) -> None:
    stack.backends["judge"].fault = "503"  # the synthesis round fails (and so does fallback)
    chunks, headers = await ask_streamed(stack, "mom question")
    text = streamed_text(chunks)
    # on_error skip: the last good round's longest answer stands
    assert text in ("a got: mom question", "b got: mom question")
    assert headers["x-vsr-looper-algorithm"] == "remom"


async def test_fusion_panel_analysis_and_synthesis(stack: Stack) -> None:
    parsed, headers = await ask(stack, "fuse these")
    text = content(parsed)
    assert text.startswith("judge got: You are the Fusion calling model")
    assert "Response 1 (a):\na got: fuse these" in text
    assert "Response 2 (b):\nb got: fuse these" in text
    # the judge's analysis was not JSON: the synthesis goes on without it
    assert "No structured analysis is available" in text
    assert headers["x-vsr-looper-models-used"] == "a,b,judge"
    assert headers["x-vsr-looper-iterations"] == "4"
    assert headers["x-vsr-looper-total-tokens"] == "8" and tokens(parsed) == 8
    trace = extra(parsed)["fusion"]
    assert column(dig(trace, "responses"), "model") == ["a", "b"]
    assert isinstance(trace, dict) and "analysis" not in trace
    judge_calls = [r.body for r in stack.backends["judge"].received]
    assert len(judge_calls) == 2 and all(b["stream"] is False for b in judge_calls)
    assert stack.chat.stats.looper_iterations["fusion"] == 4


async def test_fusion_streams_and_fails_on_error_fail(stack: Stack) -> None:
    chunks, headers = await ask_streamed(stack, "fuse these")
    text = streamed_text(chunks)
    assert text.startswith("judge got: You are the Fusion calling model")
    assert headers["x-vsr-looper-algorithm"] == "fusion"
    assert dig(extra(chunks[0]), "fusion", "judge_model") == "judge"
    # vote: on_error fail, and the panel's b fails with the default model (judge) down too
    stack.backends["b"].fault = "503"
    stack.backends["judge"].fault = "503"
    with pytest.raises(openai.APIStatusError) as err:
        await ask(stack, "vote now")
    assert err.value.status_code >= 500
    assert stack.chat.stats.looper_runs[("fusion", "error")] == 1


async def test_callers_deadline_bounds_the_fusion_panel(stack: Stack) -> None:
    stack.backends["b"].fault, stack.backends["b"].slow_s = "slow", 1.5
    stack.backends["judge"].fault, stack.backends["judge"].slow_s = "slow", 1.5
    with pytest.raises(openai.APIStatusError) as err:
        await ask(stack, "fuse these", {DEADLINE_HEADER: "300"})
    assert err.value.status_code in (503, 504)
    assert stack.chat.stats.looper_runs[("fusion", "error")] == 1


async def test_workflows_plan_steps_and_final(stack: Stack) -> None:
    stack.backends["planner"].reply = json.dumps(PLAN)
    parsed, headers = await ask(stack, "flow: sky color?")
    # the planner was asked for a JSON plan, with upstream's planner prompt
    planned = stack.backends["planner"].received[-1].body
    assert planned["response_format"] == {"type": "json_object"}
    assert planned["max_completion_tokens"] == 256
    assert "You are the Router Flow planner" in planned["messages"][-1]["content"]
    # step "check" reads only b's output of step "solve"
    check = stack.backends["a"].received[-1].body["messages"][-1]["content"]
    assert check.startswith('Router Flow step "check" (verifier).')
    assert "- solve:1:b [b]: b got: Router Flow step" in check
    assert "- solve:0:a [a]" not in check
    text = content(parsed)
    assert text.startswith("b got: You are the Router Flow final synthesizer.")
    assert "Instruction:\nGive the answer." in text
    assert headers["x-vsr-looper-algorithm"] == "workflows"
    assert headers["x-vsr-looper-models-used"] == "planner,a,b"
    assert headers["x-vsr-looper-iterations"] == "5"  # planner, 2 + 1 step calls, final
    assert tokens(parsed) == 10
    assert column(dig(extra(parsed), "flow", "steps"), "id") == ["solve", "check"]
    assert stack.chat.stats.looper_runs[("workflows", "ok")] == 1


async def test_workflows_streamed_with_an_unreadable_plan_and_a_failing_worker(
    stack: Stack,
) -> None:
    stack.backends["a"].fault = "503"  # fails mid-loop; the fallback model (judge) answers
    chunks, headers = await ask_streamed(stack, "flow: sky color?")
    text = streamed_text(chunks)
    # the planner's answer is not JSON: on_error skip runs upstream's fallback plan
    assert text.startswith("b got: You are the Router Flow final synthesizer.")
    assert "Step fallback_solve (worker):" in text
    assert headers["x-vsr-looper-algorithm"] == "workflows"
    assert dig(extra(chunks[0]), "flow", "plan", "steps", 0, "id") == "fallback_solve"
    assert [c.usage.total_tokens for c in chunks if c.usage] == [8]
