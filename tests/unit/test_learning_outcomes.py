"""Router Learning's outcome verdicts: the control API's policy (Idempotency-Key, 60 a minute
per principal on a fake clock, Retry-After through the one error answer), the body's
validation, and the ingest (the replay record names decision and model; unknown ids 404; a
repeated key is a duplicate; a verdict on another model than the record's is refused)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from vllm_sr import wire
from vllm_sr.clock import FakeClock
from vllm_sr.config.router_replay import RouterReplayPlugin
from vllm_sr.control.outcome_policy import (
    InvalidIdempotencyKey,
    MissingIdempotencyKey,
    OutcomePolicy,
    RateLimited,
)
from vllm_sr.router.learning.outcomes import (
    IdempotencyKeys,
    LearningOff,
    Outcome,
    OutcomeBody,
    OutcomeInvalid,
    OwnershipMismatch,
    ReplayNotFound,
    ingest,
    normalize,
)
from vllm_sr.router.learning.runtime import RouterLearning
from vllm_sr.router.learning.settings import LearningSettings
from vllm_sr.router.learning.state import LearningState
from vllm_sr.router.plugins.replay import ReplayLog
from vllm_sr.router.replay.store import MemoryReplayStore
from vllm_sr.router.replay.writer import ReplayWriter

# -- the policy ---------------------------------------------------------------------------


def test_a_verdict_needs_an_idempotency_key_of_at_most_256_characters() -> None:
    policy = OutcomePolicy(FakeClock())
    for missing in (None, "", "   "):
        with pytest.raises(MissingIdempotencyKey, match="Idempotency-Key") as info:
            policy.enforce(missing, "uid:1")
        assert info.value.http_status == 400
    with pytest.raises(InvalidIdempotencyKey, match="at most 256 characters, got 257"):
        policy.enforce("k" * 257, "uid:1")
    assert policy.enforce(" k1 ", "uid:1") == ("k1", "operator")  # the source is never asked


def test_sixty_verdicts_a_minute_per_principal_then_429_with_retry_after() -> None:
    clock = FakeClock()
    policy = OutcomePolicy(clock)
    for i in range(60):
        policy.enforce(f"k{i}", "uid:1")
        clock.advance(0.5)  # the first at t=0, the 60th at t=29.5
    with pytest.raises(RateLimited) as info:
        policy.enforce("k60", "uid:1")
    exc = info.value
    assert exc.http_status == 429 and exc.retryable
    assert exc.retry_after_s == pytest.approx(30.0)  # the first leaves the window at t=60
    assert wire.error_headers(exc)["Retry-After"] == "30"
    assert wire.error_document(exc)["error"]["code"] == "rate_limited"
    policy.enforce("k0", "uid:2")  # another principal has its own budget
    clock.advance(29.9)
    with pytest.raises(RateLimited):
        policy.enforce("k60", "uid:1")
    clock.advance(0.1)  # t=60: the first verdict left the window, one more fits
    policy.enforce("k60", "uid:1")
    with pytest.raises(RateLimited):
        policy.enforce("k61", "uid:1")


# -- the body -----------------------------------------------------------------------------


def body(**fields: Any) -> OutcomeBody:
    return OutcomeBody(**{"replay_id": "r1", "target": "model", "verdict": "good_fit", **fields})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"replay_id": " "}, "replay_id is required"),
        ({"target": ""}, "target '': must be one of model, route"),
        ({"verdict": "great"}, "verdict 'great': must be one of good_fit, underpowered"),
        ({"score": 1.5}, "score 1.5: must be between 0.0 and 1.0"),
        ({"score": float("nan")}, "score nan"),
        ({"source": "me"}, "source 'me': must be one of user, agent"),
    ],
)
def test_a_bad_body_names_the_field_and_what_is_accepted(fields: dict, message: str) -> None:
    with pytest.raises(OutcomeInvalid, match=message):
        normalize(body(**fields), "k", "operator")


def test_the_body_is_bounded_and_the_source_is_the_principals() -> None:
    meta = {f"k{i}": "v" for i in range(40)} | {" ": "blank", "long": "x" * 2000}
    got = normalize(body(source="user", target_ref="m" * 600, metadata=meta), "k", "operator")
    assert got.source == "operator" and len(got.target_ref) == 512
    assert len(got.metadata) == 32 and " " not in got.metadata and "long" not in got.metadata


# -- the ingest ---------------------------------------------------------------------------


async def chat_with_record(
    enabled: bool = True, tier: int = 2, recipe: str = "default"
) -> tuple[Any, str]:
    clock = FakeClock()
    log = ReplayLog(ReplayWriter(MemoryReplayStore(clock=clock), clock=clock), clock=clock)
    rec = await log.record(
        RouterReplayPlugin(enabled=True), replay_id="r1", decision="coding", recipe=recipe,
        original_model="auto", selected_model="coder", answered_by="coder",
        matched_signals=(), body=b"{}", stream=False, status=200, latency_ms=5.0,
        path="upstream", response=None,
    )  # fmt: skip
    learning = RouterLearning(LearningSettings(enabled=enabled), LearningState(clock))
    decisions = {(recipe, "coding"): SimpleNamespace(name="coding", tier=tier)}
    return SimpleNamespace(learning=learning, replay=log, decisions=decisions), rec["id"]


def verdict(key: str, replay_id: str = "r1", **fields: Any) -> Outcome:
    return normalize(body(replay_id=replay_id, **fields), key, "operator")


async def test_a_verdict_is_filed_under_the_records_decision_tier_and_model() -> None:
    chat, rid = await chat_with_record()
    got = await ingest(chat, verdict("k1", rid, verdict="underpowered"))
    assert got == {"updated": 1, "recorded": True, "duplicate": False, "model": "coder"}
    exp = chat.learning.state.experience
    assert exp.snapshot("coding", 2, "coder").underpowered == 1
    assert exp._exp[("coding", 2, "coder")].underpowered == 1  # the decision's own key
    assert exp._exp[("_global", 0, "coder")].underpowered == 1  # and overall


async def test_another_recipes_decision_is_kept_apart() -> None:
    chat, rid = await chat_with_record(recipe="agent")
    await ingest(chat, verdict("k1", rid))
    assert chat.learning.state.experience._exp[("agent::coding", 2, "coder")].good_fit == 1


async def test_a_repeated_key_is_a_duplicate_and_changes_nothing() -> None:
    chat, rid = await chat_with_record()
    await ingest(chat, verdict("k1", rid))
    again = await ingest(chat, verdict("k1", rid))
    assert again == {"updated": 0, "recorded": False, "duplicate": True}
    assert chat.learning.state.experience.snapshot("coding", 2, "coder").good_fit == 1
    await ingest(chat, verdict("k2", rid))  # a new key is a new verdict
    assert chat.learning.state.experience.snapshot("coding", 2, "coder").good_fit == 2


async def test_an_unknown_replay_id_is_a_404_naming_it_and_leaves_the_key_unused() -> None:
    chat, rid = await chat_with_record()
    with pytest.raises(ReplayNotFound, match="replay_id 'nope'") as info:
        await ingest(chat, verdict("k1", "nope"))
    assert info.value.http_status == 404 and info.value.code == "replay_not_found"
    assert (await ingest(chat, verdict("k1", rid)))["updated"] == 1  # the key was not spent


async def test_a_verdict_about_another_model_is_refused() -> None:
    chat, rid = await chat_with_record()
    with pytest.raises(OwnershipMismatch, match="selected model is 'coder'") as info:
        await ingest(chat, verdict("k1", rid, target_ref="general"))
    assert info.value.http_status == 409
    assert (await ingest(chat, verdict("k2", rid, target_ref="coder")))["updated"] == 1


async def test_other_targets_go_on_the_record_only() -> None:
    chat, rid = await chat_with_record()
    got = await ingest(chat, verdict("k1", rid, target="route", reason="wrong decision"))
    assert got == {"updated": 0, "recorded": True, "duplicate": False}
    assert chat.learning.state.experience._exp == {}
    (entry,) = (await chat.replay.get(rid))["outcomes"]
    assert entry == {
        "timestamp": entry["timestamp"],
        "source": "operator",
        "target": "route",
        "verdict": "good_fit",
        "reason": "wrong decision",
    }


async def test_a_model_verdict_goes_on_the_record_naming_the_model() -> None:
    chat, rid = await chat_with_record()
    await ingest(chat, verdict("k1", rid, score=0.5, metadata={"ticket": "T-1"}))
    (entry,) = (await chat.replay.get(rid))["outcomes"]
    assert (entry["target_ref"], entry["score"], entry["metadata"]) == (
        "coder",
        0.5,
        {"ticket": "T-1"},
    )


async def test_verdicts_need_router_learning_on() -> None:
    chat, rid = await chat_with_record(enabled=False)
    with pytest.raises(LearningOff, match=r"global\.router\.learning\.enabled: true"):
        await ingest(chat, verdict("k1", rid))


async def test_keys_are_kept_ten_minutes_and_a_second_caller_waits_for_the_first() -> None:
    clock = FakeClock()
    keys = IdempotencyKeys(clock)
    assert await keys.claim("k") is True
    waiter = asyncio.ensure_future(keys.claim("k"))
    await asyncio.sleep(0)
    assert not waiter.done()  # the first is still applying it
    keys.finish("k", applied=True)
    assert await waiter is False  # then it is a duplicate
    clock.advance(599)
    assert await keys.claim("k") is False
    clock.advance(1)
    assert await keys.claim("k") is True and len(keys) == 0  # forgotten after 10 minutes
    waiter = asyncio.ensure_future(keys.claim("k"))
    await asyncio.sleep(0)
    keys.finish("k", applied=False)  # the first failed: the waiter applies it
    assert await waiter is True
