"""The ratings, remom and fusion loopers (and workflows' checks): upstream's fragments and
reference blocks, the blocks' checks (field, value, accepted), remom's model distribution and
synthesis prompt, and the loops on a fake call and a fake clock (quorum, round timeout, the
caller's deadline, on_error, summed usage, the final answer and its trace)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml

from vllm_sr.config.looper_fanout_settings import (
    FusionSettings,
    RatingsSettings,
    RemomSettings,
    WorkflowsSettings,
)
from vllm_sr.config.routing_base import NOT_SUPPORTED
from vllm_sr.config.routing_looper import looper_block_problems
from vllm_sr.errors import DeadlineExceeded, Unavailable
from vllm_sr.jsontypes import JsonObject
from vllm_sr.router.looper.fanout import fan_out, last_user_text, round_timeout
from vllm_sr.router.looper.fusion import parse_analysis, run_fusion
from vllm_sr.router.looper.ratings import run_ratings
from vllm_sr.router.looper.remom import distribute, run_remom, synthesis_prompt
from vllm_sr.router.looper.workflows import checked_plan, parse_plan, run_workflows

FIXTURES = Path(__file__).parents[1] / "fixtures/upstream"
ENDPOINT = "http://localhost:8899/v1/chat/completions"


def fragment(kind: str) -> object:
    doc = yaml.safe_load((FIXTURES / f"fragments/algorithm/looper/{kind}.yaml").read_text())
    return doc["algorithm"][kind]


def answer(model: str, text: str, tokens: int = 1) -> JsonObject:
    return {
        "id": f"c-{model}",
        "created": 7,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": tokens, "total_tokens": 10 + tokens},
    }


class FakeCall:
    """Answers "<model>: <last user text>"; ``fail`` models raise; ``hold`` models wait for
    their event; every call is recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, JsonObject]] = []
        self.fail: set[str] = set()
        self.hold: dict[str, asyncio.Event] = {}
        self.replies: dict[str, str] = {}
        self.answered: list[str] = []
        self.running = 0
        self.most = 0

    async def __call__(self, model: str, body: JsonObject) -> tuple[str, JsonObject]:
        self.calls.append((model, body))
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            if model in self.hold:
                await self.hold[model].wait()
            await asyncio.sleep(0)
            if model in self.fail:
                raise Unavailable(f"{model} is down", model=model)
            text = self.replies.get(model, f"{model}: {last_user_text(body)}")
            self.answered.append(model)
            return model, answer(model, text)
        finally:
            self.running -= 1


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def never(_: float) -> None:
    await asyncio.Event().wait()


async def at_once(_: float) -> None:
    return None


BODY: JsonObject = {
    "model": "auto",
    "messages": [{"role": "user", "content": "why is the sky blue"}],
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "stream": True,
}


# -- the blocks ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["ratings", "remom", "fusion"])
def test_upstream_fragments_pass_and_run(kind: str) -> None:
    refs = ["qwen3-8b", "qwen3-32b"]
    assert looper_block_problems(("a", kind), kind, fragment(kind), refs, ENDPOINT) == []


def test_fragment_settings() -> None:
    remom = RemomSettings.from_block(fragment("remom"))
    assert remom.breadth_schedule == (3, 2) and remom.model_distribution == "round_robin"
    assert remom.round_timeout_seconds == 120 and remom.min_successful_responses == 2
    assert remom.max_completion_tokens == 1024 and remom.include_intermediate_responses is False
    assert RemomSettings.from_block(None).breadth_schedule == (4,)  # upstream's default block
    fusion = FusionSettings.from_block(fragment("fusion"))
    assert fusion.model == "qwen3-32b" and fusion.analysis_models == ("qwen3-8b", "qwen3-32b")
    assert fusion.min_successful_responses == 1 and fusion.temperature == 0.2
    assert RatingsSettings.from_block(fragment("ratings")) == RatingsSettings(3, "skip")


def test_workflows_fragment_passes_and_parses() -> None:
    block = fragment("workflows")
    refs = ["qwen-coordinator", "a"]
    assert looper_block_problems(("w",), "workflows", block, refs, ENDPOINT) == []
    settings = WorkflowsSettings.from_block(block)
    assert settings.mode == "dynamic" and settings.planner_model == "qwen-coordinator"
    assert settings.max_steps == 6 and settings.max_parallel == 3 and settings.on_error == "skip"
    assert WorkflowsSettings.from_block({}).on_error == "fail"  # upstream's default


def test_upstream_reference_blocks_pass() -> None:
    doc = yaml.safe_load((FIXTURES / "config.yaml").read_text())
    seen = set()
    for d in doc["routing"]["decisions"]:
        kind = (d.get("algorithm") or {}).get("type")
        if kind in ("ratings", "remom", "fusion", "workflows"):
            refs = [r["model"] for r in d["modelRefs"]]
            assert looper_block_problems(("x",), kind, d["algorithm"][kind], refs, ENDPOINT) == []
            seen.add(kind)
    assert seen == {"ratings", "remom", "fusion", "workflows"}


@pytest.mark.parametrize(
    ("kind", "block", "path", "accepted"),
    [
        ("ratings", {"max_concurrent": -1}, ("max_concurrent",), "a whole number >= 1"),
        ("ratings", {"on_error": "retry"}, ("on_error",), "skip, fail"),
        ("ratings", {"bogus": 1}, ("bogus",), "max_concurrent, on_error"),
        ("remom", {"breadth_schedule": []}, ("breadth_schedule",), "a non-empty list"),
        ("remom", {"breadth_schedule": [2, 0]}, ("breadth_schedule", 1), "a whole number >= 1"),
        (
            "remom",
            {"breadth_schedule": [2], "model_distribution": "random"},
            ("model_distribution",),
            "weighted, equal, round_robin, first_only",
        ),
        (
            "remom",
            {"breadth_schedule": [2], "compaction_strategy": "head"},
            ("compaction_strategy",),
            "full, last_n_tokens",
        ),
        ("remom", {"breadth_schedule": [2], "temperature": -1}, ("temperature",), "a number >= 0"),
        (
            "remom",
            {"breadth_schedule": [2], "max_completion_tokens": 0},
            ("max_completion_tokens",),
            "a whole number >= 1",
        ),
        (
            "remom",
            {"breadth_schedule": [2], "synthesis_model": "zz"},
            ("synthesis_model",),
            "one of the decision's modelRefs: a, b",
        ),
        ("fusion", {"round_timeout_seconds": -5}, ("round_timeout_seconds",), ">= 1"),
        ("fusion", {"include_analysis": "yes"}, ("include_analysis",), "true or false"),
        (
            "fusion",
            {"analysis_overrides": [{"model": "a"}, {"model": "a"}]},
            ("analysis_overrides", 1, "model"),
            "each model once",
        ),
        ("fusion", {"grounding": {"policy": "drop"}}, ("grounding", "policy"), "weight"),
        ("fusion", {"grounding": {"min_score": 2}}, ("grounding", "min_score"), "0-1"),
        ("workflows", {"mode": "loop"}, ("mode",), "static, dynamic"),
        (
            "workflows",
            {"mode": "dynamic", "roles": [{"name": "r", "models": ["a"]}]},
            ("roles",),
            "no roles with mode dynamic",
        ),
        ("workflows", {"mode": "static"}, ("roles",), "a non-empty list of roles"),
        (
            "workflows",
            {"mode": "static", "roles": [{"name": "r", "models": ["zz"]}]},
            ("roles", 0, "models", 0),
            "one of the decision's modelRefs",
        ),
    ],
)
def test_bad_blocks_name_field_value_and_accepted(
    kind: str, block: JsonObject, path: tuple[str | int, ...], accepted: str
) -> None:
    problems = looper_block_problems(("b",), kind, block, ["a", "b"], "")
    assert [p.path for p in problems] == [("b", *path)]
    assert accepted in problems[0].message and "accepted: " in problems[0].message


def test_refusals_by_name_only_when_the_looper_runs() -> None:
    grounding = {"grounding": {"enabled": True}}
    template = {"breadth_schedule": [2], "synthesis_template": "{{range .ReferenceResponses}}"}
    for kind, block in (("fusion", grounding), ("remom", template)):
        assert looper_block_problems(("b",), kind, block, [], "") == []
        (refused,) = looper_block_problems(("b",), kind, block, [], ENDPOINT)
        assert NOT_SUPPORTED in refused.message
    plain = {"breadth_schedule": [2], "synthesis_template": "Fuse: {{.OriginalContent}}"}
    assert looper_block_problems(("b",), "remom", plain, [], ENDPOINT) == []


# -- remom's pieces --------------------------------------------------------------------------


def test_distribution() -> None:
    refs = [("a", 3.0), ("b", 1.0), ("c", 0.0)]
    weighted = distribute(RemomSettings(model_distribution="weighted"), 4, refs)
    assert sorted(weighted) == ["a", "a", "a", "b"]
    # 5 calls at 3:1 -> 3.75 and 1.25: the largest remainder gets the fifth
    assert sorted(distribute(RemomSettings(), 5, refs)) == ["a", "a", "a", "a", "b"]
    equal = distribute(RemomSettings(model_distribution="equal"), 4, refs)
    assert sorted(equal) == ["a", "a", "b", "c"]
    assert distribute(RemomSettings(model_distribution="round_robin"), 4, refs) == [
        "a",
        "b",
        "c",
        "a",
    ]
    assert distribute(RemomSettings(model_distribution="first_only"), 2, refs) == ["a", "a"]
    # no weights: equal
    assert sorted(distribute(RemomSettings(), 3, [("a", 0.0), ("b", 0.0)])) == ["a", "a", "b"]


def test_synthesis_prompt_compacts_and_shows_reasoning() -> None:
    settings = RemomSettings(compaction_strategy="last_n_tokens", compaction_tokens=2)
    prompt = synthesis_prompt(settings, "Q", [{"model": "a", "content": "0123456789"}])
    assert "Original Problem:\nQ\n\nReference Responses:\n\nReference 1 (a):\n23456789\n" in prompt
    with_reasoning = RemomSettings(include_reasoning=True)
    prompt = synthesis_prompt(
        with_reasoning, "Q", [{"model": "a", "content": "", "reasoning": "think"}]
    )
    assert "Reference 1 (a):\n\nReasoning:\nthink\n\nAnswer:\n\n\n" in prompt
    assert prompt.endswith("comprehensive solution with clear reasoning.")


# -- the round -------------------------------------------------------------------------------


async def test_fan_out_quorum_cancels_the_rest_and_limits_concurrency() -> None:
    call = FakeCall()
    call.hold["slow"] = asyncio.Event()
    jobs: list[tuple[str, JsonObject]] = [("a", BODY), ("slow", BODY), ("b", BODY)]
    done = await fan_out(
        call, jobs, max_concurrent=3, quorum=2, on_error="skip", timeout_s=None, sleep=never
    )
    assert [a.model for a in done.answers] == ["a", "b"] and not done.cut_short
    call2 = FakeCall()
    await fan_out(call2, jobs[:1] * 4, max_concurrent=2, quorum=4, on_error="skip", timeout_s=None)
    assert call2.most == 2 and len(call2.calls) == 4


async def test_fan_out_timeout_and_on_error() -> None:
    call = FakeCall()
    call.hold["slow"] = asyncio.Event()
    jobs: list[tuple[str, JsonObject]] = [("a", BODY), ("slow", BODY)]
    done = await fan_out(
        call, jobs, max_concurrent=2, quorum=2, on_error="skip", timeout_s=5.0, sleep=at_once
    )
    assert done.cut_short == "timeout" and [a.model for a in done.answers] == ["a"]
    call.fail.add("a")
    call.hold.clear()
    done = await fan_out(
        call, jobs, max_concurrent=2, quorum=2, on_error="skip", timeout_s=None, sleep=never
    )
    assert done.failures == [("a", "a is down")] and [a.model for a in done.answers] == ["slow"]
    with pytest.raises(Unavailable):
        await fan_out(
            call, jobs, max_concurrent=2, quorum=2, on_error="fail", timeout_s=None, sleep=never
        )


def test_round_timeout_is_the_sooner_of_round_and_deadline() -> None:
    clock = Clock()
    assert round_timeout(120, None, clock) == (120, "timeout")
    assert round_timeout(0, None, clock) == (None, "deadline")
    assert round_timeout(120, clock.now + 30, clock) == (30, "deadline")
    assert round_timeout(10, clock.now + 30, clock) == (10, "timeout")
    with pytest.raises(DeadlineExceeded):
        round_timeout(10, clock.now, clock)


# -- the loops -------------------------------------------------------------------------------


async def test_ratings_one_choice_per_model_and_failures() -> None:
    call, clock = FakeCall(), Clock()
    call.fail.add("b")
    loop = await run_ratings(call, ["a", "b", "c"], BODY, RatingsSettings(), clock)
    body = loop.final_body()
    assert [c["model"] for c in body["choices"]] == ["a", "c"]
    assert body["model"] == "a,c" and loop.model == "c"
    assert loop.iterations == 3 and body["usage"]["total_tokens"] == 22
    # the internal calls are tool-free and not streamed
    assert all("tools" not in b and b["stream"] is False for _, b in call.calls)
    sse = loop.final_sse().decode()
    assert sse.count('"model": "a"') == 3 and sse.endswith("data: [DONE]\n\n")
    call.fail.update({"a", "c"})
    with pytest.raises(Unavailable, match="every model failed"):
        await run_ratings(call, ["a", "b", "c"], BODY, RatingsSettings(), clock)
    with pytest.raises(Unavailable):
        await run_ratings(call, ["a", "b"], BODY, RatingsSettings(on_error="fail"), clock)


async def test_remom_rounds_synthesis_and_usage() -> None:
    call, clock = FakeCall(), Clock()
    settings = RemomSettings.from_block(
        {
            "breadth_schedule": [2, 1],
            "model_distribution": "round_robin",
            "synthesis_model": "s",
            "temperature": 0.5,
            "max_completion_tokens": 64,
            "include_intermediate_responses": True,
        }
    )
    loop = await run_remom(call, [("a", 0.0), ("b", 0.0), ("s", 0.0)], BODY, settings, clock)
    assert [m for m, _ in call.calls] == ["a", "b", "a", "s"]
    round2 = call.calls[2][1]
    prompt = round2["messages"][-1]["content"]  # type: ignore[index]
    assert "Original Problem:\nwhy is the sky blue" in prompt and "a: why is the sky blue" in prompt
    assert round2["temperature"] == 0.5 and round2["max_completion_tokens"] == 64
    assert loop.model == "s" and loop.iterations == 4
    assert loop.final_body()["usage"]["total_tokens"] == 44
    rounds = loop.final_body()["reasoning_mom_responses"]
    assert [r["breadth"] for r in rounds] == [2, 1, 1]
    assert loop.models_used == ["a", "b", "s"]


async def test_remom_failed_round_falls_back_or_fails() -> None:
    call, clock = FakeCall(), Clock()
    call.fail.add("s")
    settings = RemomSettings.from_block({"breadth_schedule": [2], "synthesis_model": "s"})
    call.replies["b"] = "a much longer answer from b"
    loop = await run_remom(call, [("a", 0.0), ("b", 0.0), ("s", 0.0)], BODY, settings, clock)
    # skip: the final round failed; the longest answer of the last good round stands
    assert loop.final_body()["choices"][0]["message"]["content"] == "a much longer answer from b"
    failing = RemomSettings.from_block(
        {"breadth_schedule": [2], "synthesis_model": "s", "on_error": "fail"}
    )
    with pytest.raises(Unavailable):
        await run_remom(call, [("a", 0.0), ("b", 0.0), ("s", 0.0)], BODY, failing, clock)
    call.fail.update({"a", "b"})
    with pytest.raises(Unavailable, match="round 1"):
        await run_remom(call, [("a", 0.0), ("b", 0.0), ("s", 0.0)], BODY, settings, clock)


async def test_remom_round_timeout_on_a_fake_clock_keeps_the_quorum_short_round() -> None:
    call, clock = FakeCall(), Clock()
    call.hold["b"] = asyncio.Event()
    settings = RemomSettings.from_block({"breadth_schedule": [2], "round_timeout_seconds": 9})
    asked: list[float] = []

    async def sleep(seconds: float) -> None:
        asked.append(seconds)
        while "a" not in call.answered:  # the timer fires once a has answered; b never does
            await asyncio.sleep(0)

    loop = await run_remom(call, [("a", 0.0), ("b", 0.0)], BODY, settings, clock, None, sleep)
    # round 1 is cut at its timeout with a's answer (b cancelled); the final round of one
    # call goes to the first modelRef (equal spread of 1)
    assert asked == [9, 9]
    assert [m for m, _ in call.calls] == ["a", "b", "a"]
    assert loop.model == "a" and loop.iterations == 2


async def test_fusion_panel_analysis_and_trace() -> None:
    call, clock = FakeCall(), Clock()
    call.replies["j"] = json.dumps({"consensus": ["blue"], "contradictions": [], "x": 1})
    settings = FusionSettings.from_block(
        {
            "model": "j",
            "analysis_models": ["a", "b"],
            "analysis_overrides": [{"model": "a", "temperature": 0.1}],
            "temperature": 0.3,
            "max_completion_tokens": 32,
        }
    )
    loop = await run_fusion(call, ["ignored"], BODY, settings, clock)
    panel = {m: b for m, b in call.calls[:2]}
    assert panel["a"]["temperature"] == 0.1 and panel["b"]["temperature"] == 0.3
    assert "tools" not in panel["a"] and panel["a"]["max_completion_tokens"] == 32
    analysis_call, final_call = call.calls[2][1], call.calls[3][1]
    assert "Response 2 (b):\nb: why is the sky blue" in analysis_call["messages"][-1]["content"]  # type: ignore[index]
    # the synthesis keeps the caller's tools and reads the parsed analysis
    assert final_call["tools"] == BODY["tools"] and final_call["stream"] is False
    assert '"consensus": [\n    "blue"\n  ]' in final_call["messages"][-1]["content"]  # type: ignore[index]
    body = loop.final_body()
    assert body["fusion"]["analysis"] == {"consensus": ["blue"], "contradictions": []}
    assert [r["model"] for r in body["fusion"]["responses"]] == ["a", "b"]
    assert loop.iterations == 4 and loop.models_used == ["a", "b", "j"]
    assert body["usage"]["total_tokens"] == 44


async def test_fusion_failures() -> None:
    call, clock = FakeCall(), Clock()
    call.fail.add("a")
    settings = FusionSettings.from_block({"model": "j", "include_analysis": False})
    loop = await run_fusion(call, ["a", "b"], BODY, settings, clock)
    assert loop.final_body()["fusion"]["failed_models"] == [{"model": "a", "error": "a is down"}]
    with pytest.raises(Unavailable):
        await run_fusion(call, ["a", "b"], BODY, FusionSettings(on_error="fail"), clock)
    call.fail = {"j"}
    with pytest.raises(Unavailable, match="final synthesis failed for judge model 'j'"):
        await run_fusion(call, ["a", "b"], BODY, settings, clock)
    call.fail = {"a", "b"}
    with pytest.raises(Unavailable, match="all 2 analysis models failed"):
        await run_fusion(call, ["a", "b"], BODY, settings, clock)


async def test_fusion_deadline_passed_before_the_loop() -> None:
    call, clock = FakeCall(), Clock()
    with pytest.raises(DeadlineExceeded):
        await run_fusion(call, ["a"], BODY, FusionSettings(), clock, deadline=clock.now - 1)
    assert call.calls == []


def test_parse_analysis() -> None:
    assert parse_analysis('```json\n{"consensus": ["x"]}\n```') == {"consensus": ["x"]}
    assert parse_analysis('Sure: {"blind_spots": ["y"]} done') == {"blind_spots": ["y"]}
    assert parse_analysis("no json here") is None


# -- workflows -------------------------------------------------------------------------------

STATIC = {
    "mode": "static",
    "roles": [
        {"name": "Planner", "models": ["a"]},
        {"name": "solver", "models": ["a", "b"], "access_list": []},
        {"name": "critic", "models": ["b"], "access_list": ["solver:0:a"]},
    ],
    "final": {"model": "b"},
    "on_error": "skip",
}


async def test_workflows_static_roles_access_lists_and_final() -> None:
    call, clock = FakeCall(), Clock()
    loop = await run_workflows(call, ["a", "b"], BODY, WorkflowsSettings.from_block(STATIC), clock)
    prompts = [(m, b["messages"][-1]["content"]) for m, b in call.calls]  # type: ignore[index]
    assert prompts[0][1].startswith('Router Flow step "planner" (Planner).\n\nInstruction:\n')
    assert "Break down the request" in prompts[0][1]  # upstream's prompt for the role name
    # solver's access_list [] hides the planner step; critic reads only solver's a
    solver = [p for m, p in prompts if p.startswith('Router Flow step "solver"')]
    assert solver and all("Accessible prior step outputs" not in p for p in solver)
    critic = next(p for m, p in prompts if p.startswith('Router Flow step "critic"'))
    assert "- solver:0:a [a]: a: Router Flow step" in critic and "solver:1:b" not in critic
    assert "Original user request:\nwhy is the sky blue" in critic
    final_model, final_body = call.calls[-1]
    assert final_model == "b" and "Synthesize the role outputs" in str(final_body["messages"])
    assert all("tools" not in b for _, b in call.calls)
    assert loop.model == "b" and loop.iterations == 5  # 4 step calls + the final
    assert loop.final_body()["usage"]["total_tokens"] == 55
    assert [s["id"] for s in loop.final_body()["flow"]["steps"]] == ["planner", "solver", "critic"]


def test_plan_parse_and_checks() -> None:
    settings = WorkflowsSettings(max_steps=2, max_parallel=1)
    plan = parse_plan('Plan: {"steps": [{"models": ["a", "a"]}], "final": {"model": "b"}}')
    assert plan is not None
    checked = checked_plan(plan, ["a", "b"], settings)
    assert checked.steps[0].id == "step-1" and checked.steps[0].role == "worker"
    assert checked.steps[0].models == ("a",) and checked.final_model == "b"
    assert parse_plan("no plan") is None
    bad = {
        '{"steps": []}': "at least one step",
        '{"steps": [{"models": ["a"]}, {"models": ["a"]}, {"models": ["a"]}]}': "max_steps=2",
        '{"steps": [{"models": ["a", "b"]}]}': "max_parallel=1",
        '{"steps": [{"models": ["zz"]}]}': "outside decision modelRefs",
        '{"steps": [{"id": "x", "models": ["a"], "access_list": ["y"]}]}': "unknown or future",
        '{"steps": [{"models": ["a"]}], "final": {"model": "zz"}}': "final model 'zz'",
    }
    for text, why in bad.items():
        got = parse_plan(text)
        assert got is not None
        with pytest.raises(Unavailable, match=why):
            checked_plan(got, ["a", "b"], settings)


async def test_workflows_dynamic_plan_fallback_and_failures() -> None:
    call, clock = FakeCall(), Clock()
    block = {"mode": "dynamic", "planner": {"model": "p"}, "on_error": "skip", "max_parallel": 1}
    call.replies["p"] = "I would rather chat"
    loop = await run_workflows(call, ["a", "b"], BODY, WorkflowsSettings.from_block(block), clock)
    # skip: an unreadable plan becomes upstream's fallback plan (the first max_parallel workers)
    assert [m for m, _ in call.calls] == ["p", "a", "p"]
    assert loop.final_body()["flow"]["plan"]["steps"][0]["id"] == "fallback_solve"
    assert call.calls[0][1]["response_format"] == {"type": "json_object"}
    failing = WorkflowsSettings.from_block({**block, "on_error": "fail"})
    with pytest.raises(Unavailable, match="returned invalid plan"):
        await run_workflows(call, ["a", "b"], BODY, failing, clock)
    # a final synthesis that fails: skip answers with the last step's last answer
    call.replies["p"] = json.dumps({"steps": [{"models": ["a"]}], "final": {"model": "b"}})
    call.fail.add("b")
    loop = await run_workflows(call, ["a", "b"], BODY, WorkflowsSettings.from_block(block), clock)
    assert loop.model == "a" and "Router Flow step" in str(loop.final_body()["choices"])
    assert loop.final_body()["usage"]["total_tokens"] == 22  # the planner and a, counted once
    with pytest.raises(Unavailable, match="final synthesis failed for model 'b'"):
        await run_workflows(call, ["a", "b"], BODY, failing, clock)
    # a step whose every model fails fails the chat, skip or not
    call.fail = {"a"}
    with pytest.raises(Unavailable, match="step 'step-1'"):
        await run_workflows(call, ["a", "b"], BODY, WorkflowsSettings.from_block(block), clock)


async def test_workflows_dynamic_without_a_planner_model_plans_with_the_first_worker() -> None:
    call, clock = FakeCall(), Clock()
    block = {"mode": "dynamic", "planner": {"max_completion_tokens": 64}, "final": {}}
    assert looper_block_problems(("b",), "workflows", block, [], ENDPOINT) == []
    call.replies["qwen3-8b"] = json.dumps({"steps": [{"models": ["b"]}]})
    settings = WorkflowsSettings.from_block(block)
    loop = await run_workflows(call, ["qwen3-8b", "b"], BODY, settings, clock)
    planner, step, final = call.calls
    assert planner[0] == "qwen3-8b" and planner[1]["max_completion_tokens"] == 64
    assert planner[1]["chat_template_kwargs"] == {"enable_thinking": False}  # by its name
    assert step[0] == "b"
    assert final[0] == "qwen3-8b"  # no final.model nor plan final: the planner synthesizes
    assert loop.models_used == ["qwen3-8b", "b"]
    assert loop.final_body()["flow"]["planner_model"] == "qwen3-8b"


async def test_workflows_deadline_on_a_fake_clock() -> None:
    call, clock = FakeCall(), Clock()
    settings = WorkflowsSettings.from_block(STATIC)
    with pytest.raises(DeadlineExceeded):
        await run_workflows(call, ["a", "b"], BODY, settings, clock, deadline=clock.now)
    assert call.calls == []
