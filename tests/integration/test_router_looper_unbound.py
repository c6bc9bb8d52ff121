"""A looper decision as v0.4's built-in bundle writes it (no modelRefs; workflows mode dynamic
with no ``planner.model``), end to end: the Router-mode handlers on our HTTP server, real
stand-in provider models, the openai SDK. The looper runs over the provider models the chat
admits (a card whose context window is too small is passed over), in the providers' order,
the first of them planning; with fewer admitted than ``minimum_candidates`` the chat goes to
the default model as a plain chat."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping

import pytest

from tests.support.backends import StandInBackend
from tests.support.router_app import AUTO, RoutedStandIns, routed_stand_ins
from vllm_sr.config.routing import Routing

ORDER = ("tiny", "b", "a")  # the providers' order; a is the default model


def v04_agent(name: str, minimum: int) -> dict[str, object]:
    """A decision shaped like mom-v1's ``accuracy`` recipe's ``agent`` before binding."""
    return {
        "name": name,
        "priority": 10,
        "rules": {"operator": "AND", "conditions": [{"type": "keyword", "name": name}]},
        "algorithm": {
            "type": "workflows",
            "minimum_candidates": minimum,
            "workflows": {
                "mode": "dynamic",
                "template": "micro_agent",
                "max_steps": 3,
                "max_parallel": 2,
                "min_successful_responses": 2,
                "on_error": "skip",
                "planner": {"max_completion_tokens": 512},
                "final": {},
                "include_intermediate_responses": False,
            },
        },
    }


ROUTING = {
    "candidate_requirements": {"context": "known_limits"},
    "modelCards": [{"name": "tiny", "context_window_size": 2}],
    "signals": {
        "keywords": [{"name": n, "operator": "OR", "keywords": [n]} for n in ("agent", "crowd")]
    },
    "decisions": [v04_agent("agent", 2), v04_agent("crowd", 3)],
}
PLAN = {
    "steps": [{"id": "solve", "role": "worker", "models": ["a", "b"], "prompt": "Solve it."}],
    "final": {"prompt": "Give the answer."},
}


Stack = RoutedStandIns


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with routed_stand_ins(ORDER, Routing.model_validate(ROUTING), default="a") as r:
        yield r


async def ask(stack: Stack, text: str) -> tuple[str, Mapping[str, str]]:
    raw = await stack.served.client().chat.completions.with_raw_response.create(
        model=AUTO, messages=[{"role": "user", "content": text}]
    )
    parsed = raw.parse()
    return parsed.choices[0].message.content or "", raw.headers


def prompts(backend: StandInBackend) -> list[str]:
    return [str(r.body["messages"][-1]["content"]) for r in backend.received]  # type: ignore[index]


async def test_an_unbound_workflows_decision_runs_over_the_admitted_provider_models(
    stack: Stack,
) -> None:
    b = stack.backends["b"]
    b.reply = json.dumps(PLAN)  # b is the first admitted model: it plans
    answer, headers = await ask(stack, "agent: why is the sky blue at noon?")
    assert headers["x-vsr-selected-decision"] == "agent"
    assert headers["x-vsr-looper-algorithm"] == "workflows"
    # the planner b, the step's two workers, then the final synthesis by the planner
    assert headers["x-vsr-looper-models-used"] == "b,a"
    assert headers["x-vsr-looper-iterations"] == "4"
    planned = b.received[0].body
    assert planned["response_format"] == {"type": "json_object"}
    assert planned["max_completion_tokens"] == 512
    assert "Available worker models, and the only worker models you may use:\nb\na\n" in str(
        planned["messages"][-1]["content"]  # type: ignore[index]
    )
    assert prompts(stack.backends["a"]) and all(
        p.startswith('Router Flow step "solve" (worker).') for p in prompts(stack.backends["a"])
    )
    assert prompts(b)[-1].startswith("You are the Router Flow final synthesizer.")
    assert answer == json.dumps(PLAN)  # b's reply, as the final synthesis
    assert stack.backends["tiny"].received == []  # its context window is too small
    assert stack.chat.stats.looper_runs[("workflows", "ok")] == 1


async def test_too_few_admitted_models_send_the_chat_to_the_default_model(stack: Stack) -> None:
    answer, headers = await ask(stack, "crowd: why is the sky blue at noon?")
    assert headers["x-vsr-selected-decision"] == "crowd"
    assert "x-vsr-looper-algorithm" not in headers
    assert headers["x-vsr-selected-model"] == "a"
    assert prompts(stack.backends["a"]) == ["crowd: why is the sky blue at noon?"]
    assert stack.backends["b"].received == [] and stack.backends["tiny"].received == []
    assert answer.startswith("a got:")
    assert stack.chat.stats.looper_runs == {}
