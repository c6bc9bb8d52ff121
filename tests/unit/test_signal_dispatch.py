"""The signal processes' pure parts: where a chat's CPU-bound step runs (the dispatch's rule),
the wire's frames, the failure mapping, the host setting and its automatic size."""

from __future__ import annotations

import pytest

from vllm_sr.config.service import ServiceSettings
from vllm_sr.errors import ConfigError
from vllm_sr.router.cpu_signals import ViewFields
from vllm_sr.router.request_view import RequestView
from vllm_sr.router.route import SignalRun
from vllm_sr.router.signal_dispatch import (
    ALONE_MIN_CHARS,
    DEFAULT_MIN_CHARS,
    ROOM_JOBS,
    SignalDispatch,
    SignalJob,
    SignalProcessFailed,
)
from vllm_sr.router.signal_proc_wire import FrameError, FrameReader, encode
from vllm_sr.router.signal_step import signals_lost
from vllm_sr.router.signals import SignalResult
from vllm_sr.supervisor.service import signal_process_count
from vllm_sr.supervisor.signal_procs import auto_count


class LiveConnection:
    def __init__(self) -> None:
        self.alive = True
        self.inflight = 0


def dispatch_with(live: bool, busy: int) -> SignalDispatch:
    dispatch = SignalDispatch()
    if live:
        dispatch.add(LiveConnection())  # type: ignore[arg-type]
    dispatch.busy = busy
    return dispatch


def test_an_idle_loop_keeps_a_short_chat_even_a_heavy_one() -> None:
    dispatch = dispatch_with(live=True, busy=1)  # this chat alone
    assert not dispatch.takes(100, heavy=True)
    assert not dispatch.takes(ALONE_MIN_CHARS - 1, heavy=True)
    assert dispatch.takes(ALONE_MIN_CHARS, heavy=False)  # it would hold the loop for ms
    assert (dispatch.on_loop, dispatch.handed_off) == (2, 1)


def test_with_other_chats_heavy_or_long_steps_go_to_a_process() -> None:
    dispatch = dispatch_with(live=True, busy=3)
    assert dispatch.takes(16, heavy=True)  # language or pii
    assert not dispatch.takes(DEFAULT_MIN_CHARS - 1, heavy=False)  # keywords on a short text
    assert dispatch.takes(DEFAULT_MIN_CHARS, heavy=False)


def test_answers_go_along_only_while_a_process_has_room() -> None:
    dispatch = dispatch_with(live=True, busy=10)
    conn = dispatch.connections[0]
    assert dispatch.has_room()  # nothing in flight
    conn.inflight = ROOM_JOBS + 1  # type: ignore[misc]  # backlogged: read on the loop
    assert not dispatch.has_room()
    spare = LiveConnection()
    dispatch.add(spare)  # type: ignore[arg-type]
    assert dispatch.has_room()  # another process is free
    spare.alive = False  # type: ignore[misc]
    assert not dispatch.has_room()  # a dead one has no room


def test_no_live_process_keeps_everything_on_the_loop() -> None:
    dispatch = dispatch_with(live=False, busy=10)
    assert not dispatch.takes(ALONE_MIN_CHARS * 4, heavy=True)
    assert dispatch.on_loop == 1


async def test_running_with_no_process_fails_typed_and_counted() -> None:
    dispatch = SignalDispatch()
    with pytest.raises(SignalProcessFailed) as caught:
        await dispatch.run(SignalJob(1, ViewFields.of(RequestView(text="hi"))))
    assert caught.value.reason == "died"
    assert dispatch.failures == {"died": 1}


def test_a_lost_step_leaves_its_signals_unknown_by_the_process_failure() -> None:
    run = SignalRun()
    run.results[("keyword", "code")] = SignalResult(True, 1.0)  # a stale value is overwritten
    keys = {("keyword", "code"), ("language", "es"), ("language", "zh")}
    signals_lost(run, keys, SignalProcessFailed("gone", reason="died"))
    assert all(not run.results[k].matched for k in keys)
    unknown = run.unknown()
    assert set(unknown) == keys
    assert {u.reason for u in unknown.values()} == {"unavailable"}
    assert all(u.detail.startswith("signal_process_died") for u in unknown.values())
    later = SignalRun()
    signals_lost(later, {("keyword", "code")}, SignalProcessFailed("late", reason="timeout"))
    assert later.unknown()[("keyword", "code")].reason == "timeout"
    broke = SignalRun()
    signals_lost(broke, {("keyword", "code")}, SignalProcessFailed("boom", reason="error"))
    assert broke.unknown()[("keyword", "code")].reason == "failed"


def test_frames_arrive_whole_across_reads() -> None:
    data = encode(("ok", 1, {"a": 1.5})) + encode(("ready", 42))
    reader = FrameReader()
    assert reader.feed(data[:3]) == []
    assert reader.feed(data[3:10]) == []
    assert reader.feed(data[10:]) == [("ok", 1, {"a": 1.5}), ("ready", 42)]


def test_a_frame_over_the_cap_is_refused() -> None:
    with pytest.raises(FrameError, match="over the"):
        FrameReader().feed(b"\xff\xff\xff\xff")


def test_auto_size_is_half_the_budget_within_one_to_four() -> None:
    assert [auto_count(n) for n in (1, 2, 3, 8, 64)] == [1, 1, 1, 4, 4]
    assert signal_process_count(0) == 0 and signal_process_count(3) == 3
    assert 1 <= signal_process_count("auto") <= 4


def test_the_setting_takes_auto_or_a_count_and_names_what_it_accepts() -> None:
    assert ServiceSettings().signal_processes == "auto"
    assert ServiceSettings(signal_processes=0).signal_processes == 0
    with pytest.raises(ValueError, match=r"accepted: auto, or 0\.\.64"):
        ServiceSettings(signal_processes=65)
    with pytest.raises((ValueError, ConfigError)):
        ServiceSettings(signal_processes="many")  # type: ignore[arg-type]
