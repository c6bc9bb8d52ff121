"""Router Learning on real sockets: the Router-mode handlers in our HTTP server, real stand-in
OpenAI-compatible backends, the official openai SDK as the client, the learning state on a fake
clock moved by the test. A conversation (``x-session-id`` + ``x-conversation-id``) stays on its
model where a fresh request would switch, moves after ``min_turns_before_switch`` when the new
model wins by the margin (and not when it does not), starts over when idle, is independent of
other conversations, and follows a backend fallback; adaptation's observe mode leaves the model
alone and the learning headers say what happened."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import pytest

from tests.support.backends import StandInBackend
from tests.support.router_app import AUTO, providers_on, serve_routes, start_router
from vllm_sr.clock import FakeClock
from vllm_sr.config.routing import Routing
from vllm_sr.config.schema import GlobalSection
from vllm_sr.router.chat import ChatRouter
from vllm_sr.router.learning.state import LearningState
from vllm_sr.router.metrics import RouterCollector


def keyword_decision(name: str, word: str, refs: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "priority": 10,
        "rules": {"operator": "AND", "conditions": [{"type": "keyword", "name": word}]},
        "modelRefs": [{"model": m} for m in refs],
        **extra,
    }


ROUTING = {
    "signals": {
        "keywords": [
            {"name": w, "operator": "OR", "keywords": [w]} for w in ("alpha", "beta", "gamma")
        ]
    },
    "decisions": [
        keyword_decision("to_a", "alpha", ["a"]),
        keyword_decision("to_b", "beta", ["b"]),
        keyword_decision("b_or_a", "gamma", ["b", "a"]),
    ],
}


def learning(**tuning: Any) -> dict[str, Any]:
    return {
        "enabled": True,
        "adaptation": {"enabled": False},
        "protection": {
            "enabled": True,
            "scope": "conversation",
            "tuning": {
                "idle_timeout_seconds": 300,
                "min_turns_before_switch": 3,
                "switch_margin": 0.05,
                **tuning,
            },
        },
    }


@dataclass
class Stack:
    a: StandInBackend
    b: StandInBackend
    clock: FakeClock
    chat: ChatRouter
    client: openai.AsyncOpenAI
    url: str


@pytest.fixture
async def make_stack() -> AsyncIterator[Callable[..., Any]]:
    cleanups: list[Callable[[], Any]] = []

    async def make(
        learning_block: dict[str, Any],
        routing: dict[str, Any] = ROUTING,
        recipes: dict[str, Any] | None = None,
    ) -> Stack:
        a = await StandInBackend("a").start()
        b = await StandInBackend("b").start()
        providers = providers_on(a, b)
        clock = FakeClock()
        chat = await start_router(
            providers,
            Routing.model_validate(routing),
            global_=GlobalSection.model_validate({"router": {"learning": learning_block}}),
            learning_state=LearningState(clock=clock, seed_source=lambda: 7),
            recipes={k: Routing.model_validate(v) for k, v in (recipes or {}).items()},
            entrypoints={f"{k}-model": k for k in recipes or {}},
        )
        served = await serve_routes(chat.routes(), cancel_on_disconnect=False)

        async def cleanup() -> None:
            await served.close()
            await chat.backends.close()
            await a.stop()
            await b.stop()

        cleanups.append(cleanup)
        return Stack(a, b, clock, chat, served.client(), served.url)

    yield make
    for cleanup in cleanups:
        await cleanup()


class Conversation:
    """One client conversation: its history grows by each question and answer."""

    def __init__(self, st: Stack, session: str | None, conversation: str | None) -> None:
        self.st = st
        self.messages: list[dict[str, Any]] = []
        self.headers = {"x-vsr-debug": "true"}
        if session:
            self.headers["x-session-id"] = session
        if conversation:
            self.headers["x-conversation-id"] = conversation

    async def say(self, text: str) -> Any:
        self.messages.append({"role": "user", "content": text})
        raw = await self.st.client.chat.completions.with_raw_response.create(
            model=AUTO, messages=self.messages, extra_headers=self.headers
        )
        answer = raw.parse()
        self.messages.append({"role": "assistant", "content": answer.choices[0].message.content})
        return raw


def picked(raw: Any) -> tuple[str, str, str]:
    h = raw.headers
    return (
        h["x-vsr-selected-model"],
        h.get("x-vsr-learning-actions", ""),
        h.get("x-vsr-learning-reasons", ""),
    )


async def test_a_conversation_stays_on_its_model_then_switches_after_min_turns(
    make_stack: Callable[..., Any],
) -> None:
    st = await make_stack(learning())
    fresh = Conversation(st, None, None)
    assert picked(await fresh.say("beta"))[0] == "b"  # a fresh beta goes to b
    talk = Conversation(st, "s1", "c1")
    first = await talk.say("alpha please")
    assert picked(first) == (
        "a",
        "protection=establish_baseline",
        "protection=new_conversation",
    )
    assert first.headers["x-vsr-learning-methods"] == "protection"
    assert first.headers["x-vsr-learning-scopes"] == "protection=conversation"
    assert first.headers["x-vsr-session-phase"] == "user_turn"
    for _ in range(2):  # turns 2 and 3: fewer than 3 turns behind them, held on a
        raw = await talk.say("beta now")
        assert picked(raw) == ("a", "protection=hold_current", "protection=hard_lock=min_turns")
        assert raw.headers["x-vsr-selected-decision"] == "to_b"
    # turn 4: b wins by far more than the margin
    assert picked(await talk.say("beta again")) == (
        "b",
        "protection=allow_switch",
        "protection=switch_allowed",
    )
    # the backends saw it: a answered turns 1-3, b turn 4
    assert [r.body["model"] for r in st.a.received] == ["a"] * 3
    assert len(st.b.received) == 2
    # /metrics: protection's actions by decision
    families = {f.name: f for f in RouterCollector(lambda: st.chat).collect()}
    samples = {
        (s.labels["decision"], s.labels["action"]): s.value
        for s in families["vllm_sr_router_learning_actions"].samples
    }
    assert samples[("to_b", "hold_current")] == 2
    assert samples[("to_b", "allow_switch")] == 1
    inventory = st.chat.inventory()["learning"]
    assert inventory["conversations"] == 1 and inventory["store"] == "local"
    assert {"decision": "to_b", "method": "protection", "action": "allow_switch", "count": 1} in (
        inventory["actions"]
    )


async def test_without_the_margin_the_conversation_stays(make_stack: Callable[..., Any]) -> None:
    st = await make_stack(learning(min_turns_before_switch=1))
    talk = Conversation(st, "s1", "c1")
    assert picked(await talk.say("alpha"))[0] == "a"
    # b_or_a prefers b, but a is one of its models at nearly b's score: not worth a switch
    for _ in range(3):
        assert picked(await talk.say("gamma")) == (
            "a",
            "protection=hold_current",
            "protection=switch_margin_not_met",
        )
    assert picked(await Conversation(st, "s1", "c2").say("gamma"))[0] == "b"


async def test_an_idle_conversation_starts_over(make_stack: Callable[..., Any]) -> None:
    st = await make_stack(learning())
    talk = Conversation(st, "s1", "c1")
    await talk.say("alpha")
    st.clock.advance(299)
    assert picked(await talk.say("beta"))[0] == "a"
    st.clock.advance(300)
    assert picked(await talk.say("beta")) == (
        "b",
        "protection=establish_baseline",
        "protection=idle_reset",
    )


async def test_conversations_are_independent(make_stack: Callable[..., Any]) -> None:
    st = await make_stack(learning())
    one, two = Conversation(st, "s1", "c1"), Conversation(st, "s1", "c2")
    other_session = Conversation(st, "s2", "c1")
    await one.say("alpha")
    assert picked(await two.say("beta"))[0] == "b"
    assert picked(await other_session.say("beta"))[0] == "b"
    assert picked(await one.say("beta"))[0] == "a"
    assert picked(await two.say("alpha"))[0] == "b"
    # no conversation id: conversation scope has no identity, routing as without learning
    lone = await Conversation(st, "s1", None).say("alpha")
    assert picked(lone) == ("a", "protection=suppress_sampling", "protection=missing_identity")


async def test_session_scope_keeps_the_session_on_its_model(
    make_stack: Callable[..., Any],
) -> None:
    block = learning(min_turns_before_switch=0)
    block["protection"]["scope"] = "session"
    st = await make_stack(block)
    await Conversation(st, "s1", "c1").say("alpha")
    # a new conversation of the same session: still on a
    raw = await Conversation(st, "s1", "c9").say("beta")
    assert picked(raw) == ("a", "protection=hold_current", "protection=session_scope_protect")
    assert raw.headers["x-vsr-learning-scopes"] == "protection=session"


async def test_a_backend_fallback_moves_the_conversation(make_stack: Callable[..., Any]) -> None:
    st = await make_stack(learning())
    talk = Conversation(st, "s1", "c1")
    await talk.say("alpha")
    st.a.fault = "503"  # protection holds a; a fails; the decision's b answers
    raw = await talk.say("beta")
    assert raw.headers["x-vsr-selected-model"] == "b"
    assert raw.headers["x-vsr-backend-fallback"] == "a:http_503"
    assert raw.headers["x-vsr-learning-actions"] == "protection=hold_current"
    st.a.fault = None
    for backend in st.chat.backends.models["a"]:
        backend.health.record_success()  # a's health check passes again
    # the conversation is on b now (the model that answered), still within min turns
    assert picked(await talk.say("alpha")) == (
        "b",
        "protection=hold_current",
        "protection=hard_lock=min_turns",
    )


async def test_adaptation_observe_and_bypass_leave_the_model(
    make_stack: Callable[..., Any],
) -> None:
    routing = {
        "signals": ROUTING["signals"],
        "decisions": [
            keyword_decision("watch", "alpha", ["a", "b"], adaptations={"mode": "observe"}),
            keyword_decision("hard", "beta", ["b", "a"], adaptations={"mode": "bypass"}),
        ],
    }
    block = learning()
    block["adaptation"] = {"enabled": True}
    st = await make_stack(block, routing)
    for i in range(3):
        raw = await Conversation(st, "s", f"w{i}").say("alpha")
        assert raw.headers["x-vsr-selected-model"] == "a"
        assert raw.headers["x-vsr-learning-methods"] == "adaptation,protection"
        assert raw.headers["x-vsr-learning-actions"] == "adaptation=observe,protection=observe"
        raw = await Conversation(st, "s", f"h{i}").say("beta")
        assert raw.headers["x-vsr-selected-model"] == "b"
        assert raw.headers["x-vsr-learning-actions"] == "adaptation=bypass,protection=bypass"


async def test_adaptation_apply_tries_each_unobserved_model(make_stack: Callable[..., Any]) -> None:
    routing = {
        "signals": ROUTING["signals"],
        "decisions": [keyword_decision("ab", "alpha", ["a", "b"])],
    }
    block = learning()
    block["adaptation"] = {"enabled": True}
    st = await make_stack(block, routing)
    seen = []
    for i in range(2):  # a model never observed is tried first (seeded sampling orders them)
        raw = await Conversation(st, "s", f"c{i}").say("alpha")
        seen.append(raw.headers["x-vsr-selected-model"])
        assert "adaptation=cold_start" in raw.headers["x-vsr-learning-reasons"]
    assert sorted(seen) == ["a", "b"]
    raw = await Conversation(st, "s", "c2").say("alpha")  # both observed now
    assert "cold_start" not in raw.headers["x-vsr-learning-reasons"]
    # without debug, no learning headers (upstream shows them only under x-vsr-debug)
    raw = await st.client.chat.completions.with_raw_response.create(
        model=AUTO, messages=[{"role": "user", "content": "alpha"}]
    )
    assert "x-vsr-learning-methods" not in raw.headers


async def test_eval_says_learning_decides_at_execution(make_stack: Callable[..., Any]) -> None:
    """Upstream's /api/v1/eval: a decision whose model learning may change (apply mode) is
    ``execution_required`` with no selected model; bypass decisions keep static's preview."""
    routing = {
        "signals": ROUTING["signals"],
        "decisions": [
            keyword_decision("learned", "alpha", ["a", "b"]),
            keyword_decision("hard", "beta", ["b"], adaptations={"mode": "bypass"}),
        ],
    }
    st = await make_stack(learning(), routing)
    async with aiohttp.ClientSession() as s:
        for text, status, model in (
            ("alpha", "execution_required", None),
            ("beta", "selected", "b"),
        ):
            async with s.post(st.url + "/api/v1/eval", json={"text": text}) as r:
                doc = await r.json()
            assert doc["selection_status"] == status, doc
            assert doc.get("selected_model") == model


async def test_a_reload_keeps_the_conversations(make_stack: Callable[..., Any]) -> None:
    """The frontend's chat mount: a reload that changes routing keeps Router Learning's state
    (the conversation stays held); turning learning off and on again keeps it too."""
    from vllm_sr.frontend.chat_mount import ChatMount
    from vllm_sr.plan import RouterPlan
    from vllm_sr.pool.directory import PoolDirectory

    st = await make_stack(learning())
    providers = st.chat.router.providers

    def plan(routing: dict[str, Any], block: dict[str, Any]) -> RouterPlan:
        return RouterPlan(
            True,
            (AUTO,),
            providers,
            Routing.model_validate(routing),
            "primary",
            global_=GlobalSection.model_validate({"router": {"learning": block}}),
        )

    mount = ChatMount(PoolDirectory())
    try:
        await mount.update(plan(ROUTING, learning()))
        assert mount.chat is not None
        state = mount.chat.learning.state
        state.memory.record_decision("s1/c1", "a", 0, "to_a")
        more = {**ROUTING, "decisions": [*ROUTING["decisions"], keyword_decision("x", "beta", [])]}
        await mount.update(plan(more, learning()))
        await mount.update(plan(more, {"enabled": False}))
        await mount.update(plan(ROUTING, learning()))
        assert mount.chat.learning.state is state
        snap = state.memory.snapshot("s1/c1")
        assert snap is not None and snap.model == "a"
    finally:
        await mount.close()


async def test_long_ids_are_tracked_by_digest(make_stack: Callable[..., Any]) -> None:
    st = await make_stack(learning())
    talk = Conversation(st, "s" * 2000, "c" * 2000)
    await talk.say("alpha")
    assert picked(await talk.say("beta"))[:2] == ("a", "protection=hold_current")
    state = st.chat.learning.state
    assert len(state.memory) == 1
    (key,) = state.memory.keys()
    assert key.startswith("sha256:") and len(key) == 71


async def test_recipes_keep_their_conversations_apart(make_stack: Callable[..., Any]) -> None:
    """Upstream namespaces learning state by recipe: the same ids through an entrypoint are
    another conversation."""
    st = await make_stack(learning(), recipes={"side": ROUTING})
    talk = Conversation(st, "s1", "c1")
    await talk.say("alpha")
    assert picked(await talk.say("beta"))[0] == "a"  # held
    raw = await st.client.chat.completions.with_raw_response.create(
        model="side-model",
        messages=[{"role": "user", "content": "beta"}],
        extra_headers=talk.headers,
    )
    assert raw.headers["x-vsr-selected-recipe"] == "side"
    assert picked(raw) == ("b", "protection=establish_baseline", "protection=new_conversation")
    assert sorted(st.chat.learning.state.memory.keys()) == ["s1/c1", "side::s1/c1"]


async def test_a_learning_failure_never_fails_the_chat(
    make_stack: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    st = await make_stack(learning())

    def boom(*args: Any) -> Any:
        raise RuntimeError("a bug in learning")

    st.chat.learning._propose = boom  # type: ignore[method-assign]
    raw = await Conversation(st, "s1", "c1").say("beta")
    assert picked(raw) == ("b", "", "")  # routed as without learning
    assert "Router Learning failed on decision to_b" in caplog.text


async def test_a_responses_chain_is_one_protected_conversation(
    make_stack: Callable[..., Any],
) -> None:
    """/v1/responses goes through the chat's path: its chain, with the identity headers, stays
    on its model like a chat conversation."""
    from vllm_sr.router.responses.api import ResponsesAPI
    from vllm_sr.router.responses.store import MemoryStore

    st = await make_stack(learning())
    clock = FakeClock()
    responses = ResponsesAPI(MemoryStore(ttl_s=600, max_responses=10, clock=clock), clock)
    served = await serve_routes(
        {**st.chat.routes(), **responses.routes(lambda: st.chat)}, cancel_on_disconnect=False
    )
    client = served.client(
        headers={"x-session-id": "s1", "x-conversation-id": "r1", "x-vsr-debug": "true"}
    )
    try:
        first = await client.responses.with_raw_response.create(model=AUTO, input="alpha")
        assert first.headers["x-vsr-selected-model"] == "a"
        second = await client.responses.with_raw_response.create(
            model=AUTO, input="beta", previous_response_id=first.parse().id
        )
        assert picked(second) == ("a", "protection=hold_current", "protection=hard_lock=min_turns")
        assert second.parse().output_text.startswith("a got:")
    finally:
        await served.close()
