"""Screens of vllm-sr-top at 80x24 and 160x48: healthy, degraded with an ejected replica, and
disconnected. The app talks to the real control server (on a thread of its own) with a fake
backend behind it; clock, host, uptime, socket path and the number of polls are fixed, so the
screens are the same on every run. Update with ``pytest tests/tui --snapshot-update``."""

from __future__ import annotations

import fcntl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from vllm_sr_top.app import VllmSrTop
from vllm_sr_top.widgets import Banner, EventsPane

from tests.support.control_fake import FakeBackend
from tests.tui.harness import (
    LiveControl,
    ServerThread,
    load,
    make_app,
    make_backend,
    until,
)
from vllm_sr import events as ev
from vllm_sr.backoff import Backoff
from vllm_sr.clock import FakeClock

# A fixed path, so that the disconnected banner (which names it) is the same on every run.
SNAP_SOCKET = Path("/tmp/vllm-sr-top-snap/control.sock")
SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((160, 48), id="160x48")]
SnapCompare = Callable[..., bool]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def server(clock: FakeClock) -> Iterator[ServerThread]:
    # Another test session on this machine (the path is fixed) waits its turn, not fails.
    SNAP_SOCKET.parent.mkdir(exist_ok=True)
    with (SNAP_SOCKET.parent / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield from _serve(clock)


def _serve(clock: FakeClock) -> Iterator[ServerThread]:
    backend = make_backend(
        clock, {"primary": ["cuda:0", "cuda:1", "cuda:2"], "classifier": ["cpu"]}
    )
    for rid in ("primary-0", "primary-1", "primary-2"):
        backend.events.publish(ev.REPLICA_READY, **backend.who(rid), pid=backend.replica(rid).pid)
        clock.advance(4)
    backend.events.publish(ev.POOL_PUBLISHED, generation=1, deployments=["primary", "classifier"])
    with ServerThread(LiveControl(backend, SNAP_SOCKET)) as thread:
        yield thread


def _app(clock: FakeClock) -> VllmSrTop:
    # A long backoff: the disconnected screen shows the first retry's countdown, unmoved.
    return make_app(SNAP_SOCKET, clock, backoff=Backoff(30.0, 30.0))


async def _settle(pilot: Pilot[Any], server: ServerThread, polls: int) -> None:
    """Runs ``polls`` refreshes with changing traffic, then waits for every event."""
    app = pilot.app
    assert isinstance(app, VllmSrTop)
    await until(pilot, lambda: app.polls >= 1, "the first inventory")
    backend: FakeBackend = server.live.backend
    for seed in range(polls):
        server.call(lambda s=seed: load(backend, seed=s % 4))  # type: ignore[misc]
        await app.poll_once()
    last = server.call(lambda: backend.events.last_seq)
    pane = app.query_one(EventsPane)
    await until(pilot, lambda: pane.last_seq == last, "the event stream to catch up")


@pytest.mark.parametrize("size", SIZES)
def test_healthy(
    snap_compare: SnapCompare, server: ServerThread, clock: FakeClock, size: Any
) -> None:
    async def run_before(pilot: Pilot[Any]) -> None:
        await _settle(pilot, server, polls=12)

    assert snap_compare(_app(clock), terminal_size=size, run_before=run_before)


def _degrade(backend: FakeBackend, clock: FakeClock) -> None:
    """primary-1 timed out three times in a row and is ejected; primary-2 restarted once."""
    ejected = backend.replica("primary-1")
    ejected.consecutive_timeouts, ejected.ejections = 3, 2
    ejected.ejected_until = clock.monotonic() + 42  # the pool's clock
    backend.events.publish(
        ev.REPLICA_EJECTED,
        **backend.who(ejected.id),
        pid=ejected.pid,
        timeouts=3,
        duration_ms=60000,
        reason="timeouts",
    )
    clock.advance(3)
    backend.events.publish(
        ev.REPLICA_EJECTION_WITHHELD, deployment="primary", replica="primary-0",
        rule="max_ejection_percent",
    )  # fmt: skip
    restarted = backend.replica("primary-2")
    restarted.restarts, restarted.pid = 1, 41_234
    backend.events.publish(
        ev.REPLICA_RESTARTED, **backend.who(restarted.id), pid=41_234, restarts=1, backoff_s=0.5
    )


@pytest.mark.parametrize("size", SIZES)
def test_degraded_with_an_ejected_replica(
    snap_compare: SnapCompare, server: ServerThread, clock: FakeClock, size: Any
) -> None:
    async def run_before(pilot: Pilot[Any]) -> None:
        await _settle(pilot, server, polls=6)
        server.call(lambda: _degrade(server.live.backend, clock))
        await _settle(pilot, server, polls=6)
        await pilot.press("j")  # the ejected replica selected

    assert snap_compare(_app(clock), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES)
def test_disconnected(
    snap_compare: SnapCompare, server: ServerThread, clock: FakeClock, size: Any
) -> None:
    async def run_before(pilot: Pilot[Any]) -> None:
        app = pilot.app
        assert isinstance(app, VllmSrTop)
        await _settle(pilot, server, polls=8)
        # Paused while the service goes away, so the one failed refresh that follows is made
        # on a fresh connection (not on one the server was closing): the same reason each run.
        await pilot.press("p")
        server.run(server.live.stop())
        await until(pilot, lambda: not app._online.is_set(), "the stream to end")
        await pilot.press("p")
        banner = app.query_one(Banner)
        await until(pilot, lambda: banner.has_class("-disconnected"), "the banner")

    assert snap_compare(_app(clock), terminal_size=size, run_before=run_before)
