"""Pure supervisor logic on a fake clock: restart backoff and the reload diff."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.integration.test_supervisor_fake import spec_of
from vllm_sr.backoff import Backoff
from vllm_sr.clock import FakeClock
from vllm_sr.plan import ReplicaSpec
from vllm_sr.supervisor.keeper import OwnedTasks
from vllm_sr.supervisor.reload import diff_plans


def test_restart_backoff_doubles_to_the_cap() -> None:
    b = Backoff(1.0, 60.0, reset_after_s=60.0, clock=FakeClock())
    assert [b.next_delay() for _ in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]


def test_restart_backoff_resets_after_staying_ready() -> None:
    clock = FakeClock()
    b = Backoff(1.0, 60.0, reset_after_s=30.0, clock=clock)
    for _ in range(4):
        b.next_delay()
    b.mark_ready()
    clock.advance(29.9)
    b.mark_down()  # a short run: still a crash loop
    assert b.next_delay() == 16
    b.mark_ready()
    clock.advance(30.0)
    b.mark_down()
    assert b.next_delay() == 1


def test_restart_backoff_refuses_bad_bounds() -> None:
    with pytest.raises(ValueError, match="initial_s"):
        Backoff(0.0, 1.0)
    with pytest.raises(ValueError, match="max_s"):
        Backoff(2.0, 1.0)


def specs(n: int, **kw: Any) -> list[ReplicaSpec]:
    return [spec_of(f"primary-{i}", "primary", i, **kw) for i in range(n)]


def test_diff_keeps_same_identity_and_starts_and_retires_the_rest() -> None:
    running = {s.id: s for s in specs(2)}
    grow = diff_plans(running, specs(3))
    assert [s.id for s in grow.keep] == ["primary-0", "primary-1"]
    assert [s.id for s in grow.start] == ["primary-2"] and grow.retire == []
    shrink = diff_plans({s.id: s for s in specs(3)}, specs(1))
    assert [s.id for s in shrink.keep] == ["primary-0"]
    assert shrink.start == [] and shrink.retire == ["primary-1", "primary-2"]


def test_diff_ignores_env_but_replaces_on_identity_change() -> None:
    running = {s.id: s for s in specs(2)}
    same = diff_plans(running, specs(2, env={"BINDING": "x"}))
    assert not same.changed
    changed = diff_plans(running, specs(2, threads=4))
    assert [s.id for s in changed.start] == ["primary-0", "primary-1"]
    assert changed.retire == ["primary-0", "primary-1"]


def test_a_json_log_line_gives_its_message_as_the_exit_reason() -> None:
    from vllm_sr.supervisor.managed import _message_of

    line = '{"time": 1, "level": "ERROR", "message": "golden check failed: cosine 0.2"}'
    assert _message_of(line) == "golden check failed: cosine 0.2"
    assert _message_of("plain words") == "plain words"
    assert _message_of("{not json") == "{not json"


def test_owned_tasks_are_held_until_they_end_and_the_stop_cancels_all_but_itself() -> None:
    async def main() -> None:
        tasks = OwnedTasks()
        release = asyncio.Event()
        waiting = tasks.start(release.wait(), "waiting")
        done = tasks.start(asyncio.sleep(0), "done")
        await done
        assert tasks.owned() == {waiting}  # an ended task is let go

        async def stop() -> str:
            tasks.cancel_all()
            await asyncio.sleep(0)
            return "stopped"

        stopping = tasks.start(stop(), "stop")
        assert await stopping == "stopped"  # the caller is not cancelled by itself
        assert waiting.cancelled()
        assert tasks.owned() == set()

    asyncio.run(main())
