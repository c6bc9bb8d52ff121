"""vllm-sr-top through Pilot, against the real control server with a fake backend behind it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from rich.text import Text
from textual import events
from textual.pilot import Pilot
from vllm_sr_top.app import VllmSrTop, build_parser
from vllm_sr_top.model import COLUMNS
from vllm_sr_top.screens import ConfirmScreen, HelpScreen
from vllm_sr_top.widgets import (
    Banner,
    EventsPane,
    HeaderBar,
    MessageLine,
    ReplicaTable,
    RouterPanel,
)

from tests.support.control_fake import StubRouter, sample_adaptive_threads
from tests.tui.harness import HOST, LiveControl, ReadOnlyPolicy, load, make_app, until
from vllm_sr import events as ev
from vllm_sr.clock import FakeClock
from vllm_sr.errors import Conflict
from vllm_sr.supervisor.config_source import ConfigSource

SIZE = (160, 48)


def _text(widget: Any) -> str:
    rendered = widget.render()
    return rendered.plain if isinstance(rendered, Text) else str(rendered)


def _message(app: VllmSrTop) -> str:
    return _text(app.query_one(MessageLine))


def _rows(app: VllmSrTop) -> dict[str, list[str]]:
    """Every visible replica row, by id, as plain cell texts."""
    rows: dict[str, list[str]] = {}
    for table in app.query(ReplicaTable):
        for index in range(table.row_count):
            cells = table.get_row_at(index)
            rows[str(cells[0])] = [c.plain if isinstance(c, Text) else str(c) for c in cells]
    return rows


def _events(app: VllmSrTop) -> list[str]:
    return [strip.text for strip in app.query_one(EventsPane).lines]


async def _started(pilot: Pilot[Any]) -> VllmSrTop:
    app = pilot.app
    assert isinstance(app, VllmSrTop)
    await until(
        pilot, lambda: app.polls >= 1 and bool(app.query(ReplicaTable)), "the first inventory"
    )
    return app


async def test_shows_the_inventory_and_moves_with_keys(live: LiveControl, clock: FakeClock) -> None:
    load(live.backend)
    ejected = live.backend.replica("primary-1")
    ejected.ejections, ejected.consecutive_timeouts = 2, 3
    ejected.ejected_until = clock.monotonic() + 25  # the pool's clock
    app = make_app(live.path, clock)
    async with app.run_test(size=SIZE) as pilot:
        await _started(pilot)
        header = _text(app.query_one(HeaderBar))
        assert f"host {HOST}" in header and "up 1h02m" in header and "v0.1.0" in header
        assert "primary 3/3 degraded" in header and "classifier 1/1 ready" in header
        rows = _rows(app)
        assert set(rows) == {"primary-0", "primary-1", "primary-2", "classifier-0"}
        assert rows["primary-1"][:5] == ["primary-1", "ejected", "██░░░░░░  7/32", "2 (25s)", "3"]
        assert rows["primary-2"][2] == "████░░░░ 14/32"
        pid = str(live.backend.replica("primary-2").pid)
        assert rows["primary-2"][-4:] == ["cpu", "-", pid, "-"]  # no dtype reported, no error
        # The time left of an ejection counts down on the clock between polls.
        clock.advance(10)
        await app._tick()
        assert _rows(app)["primary-1"][3] == "2 (15s)"

        assert app.selected == "primary-0"
        await pilot.press("j", "down")
        assert app.selected == "primary-2"
        await pilot.press("j")  # past the last primary row: into the next deployment
        assert app.selected == "classifier-0"
        await pilot.press("k", "up")
        assert app.selected == "primary-1"
        await pilot.press("tab", "tab")  # through the classifier table to the events pane
        assert isinstance(app.focused, EventsPane)
        await app.poll_once()
        assert isinstance(app.focused, EventsPane)  # a refresh does not take the focus back
        await pilot.press("j")  # back to the table the selection is in (the last one)
        assert isinstance(app.focused, ReplicaTable) and app.selected == "classifier-0"
        # The terminal loses the focus (Textual then un-focuses every widget); keys that
        # still arrive act on the selection all the same.
        app.post_message(events.AppBlur())
        await until(pilot, lambda: app.focused is None, "the blur")
        await pilot.press("k", "e")
        assert isinstance(app.screen, ConfirmScreen) and "primary-2" in app.screen.question
        await pilot.press("n")

        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("x")  # any key closes it
        assert not isinstance(app.screen, HelpScreen)
        assert app.return_code is None
        await pilot.press("ctrl+c")  # quits, as in top (q is pressed in the tmux test)
        assert app.return_code == 0


async def test_each_action_asks_first_then_shows_the_result_or_refusal(
    live: LiveControl, clock: FakeClock
) -> None:
    app = make_app(live.path, clock)
    async with app.run_test(size=SIZE) as pilot:
        await _started(pilot)
        await pilot.press("e")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")  # declined: nothing is sent
        assert not isinstance(app.screen, ConfirmScreen) and "cancelled" in _message(app)
        await pilot.press("d", "escape")
        assert live.backend.commands == []

        # While the service works on an action, the screen stays live.
        live.backend.hold = asyncio.Event()
        await pilot.press("d", "y")
        await until(pilot, lambda: bool(live.backend.commands), "the drain to reach the service")
        assert "drain primary-0: sent, waiting for the service" in _message(app)
        await pilot.press("j", "k")
        assert app.selected == "primary-0"
        live.backend.hold.set()
        await until(pilot, lambda: "drain primary-0: done" in _message(app), "the held drain")
        live.backend.hold = None
        sent: list[tuple[str, str]] = [("drain", "primary-0")]

        async def act(key: str, verb: str, rid: str, state: str) -> None:
            await pilot.press("j")
            assert app.selected == rid
            await pilot.press(key)
            assert isinstance(app.screen, ConfirmScreen) and rid in app.screen.question
            assert len(live.backend.commands) == len(sent)  # nothing before the answer
            # The screen behind the dialog keeps refreshing, and the dialog keeps its focus.
            live.backend.set_traffic(rid, requests_per_s=99.0)
            await app.poll_once()
            await app._tick()
            assert _rows(app)[rid][5] == "99.0" and isinstance(app.screen, ConfirmScreen)
            await pilot.press("y")
            sent.append((verb, rid))
            await until(pilot, lambda: f"{verb} {rid}: done" in _message(app), verb)
            assert [(c.kind, c.replica) for c in live.backend.commands] == sent
            await until(pilot, lambda: _rows(app)[rid][1] == state, f"{rid} {state}")
            await until(pilot, lambda: any(f"replica_{verb}" in e for e in _events(app)), verb)

        # Eject before the drain: the pool never ejects the last replica that serves.
        await act("e", "eject", "primary-1", "ejected")
        await act("d", "drain", "primary-2", "draining")
        await act("R", "restart", "classifier-0", "ready")
        assert _rows(app)["classifier-0"][9] == "1"  # its restart count

        # The service refuses an action (409).
        live.backend.refuse = Conflict("replica classifier-0 is not ejected (state ready)")
        await pilot.press("r", "y")
        await until(pilot, lambda: "refused" in _message(app), "the refusal")
        assert "readmit classifier-0 refused: replica classifier-0 is not ejected" in _message(app)
        assert app.message.has_class("-error")
        assert app.read_only is None  # a refusal of one action is not a loss of rights


async def test_a_read_only_user_sees_the_actions_disabled_and_why(
    live: LiveControl, clock: FakeClock
) -> None:
    await live.stop()
    live.policy = ReadOnlyPolicy()
    await live.start()
    app = make_app(live.path, clock)
    async with app.run_test(size=SIZE) as pilot:
        await _started(pilot)
        # /v1/health says who the caller is, so the actions are off before any is tried.
        await until(pilot, lambda: app.read_only is not None, "the caller's permission")
        assert "may read but not change the service" in (app.read_only or "")
        await pilot.press("d", "y")
        banner = app.query_one(Banner)
        assert banner.has_class("-readonly") and "read-only" in _text(banner)
        assert app.check_action("act", ("eject",)) is None  # greyed out in the footer
        await pilot.press("e")
        assert not isinstance(app.screen, ConfirmScreen)
        assert [c.kind for c in live.backend.commands] == []


async def test_waits_for_the_service_and_reconnects_by_itself(
    live: LiveControl, clock: FakeClock
) -> None:
    await live.stop()
    app = make_app(live.path, clock, interval=0.1)
    async with app.run_test(size=SIZE) as pilot:
        banner = app.query_one(Banner)
        await until(pilot, lambda: banner.has_class("-disconnected"), "the banner")
        assert "connecting" in _text(app.query_one(HeaderBar))
        assert "nothing is serving on" in _text(banner) and "Retrying in 0." in _text(banner)
        await live.start()
        await _started(pilot)
        assert not banner.has_class("-disconnected") and len(_rows(app)) == 4

        await live.stop()
        await until(pilot, lambda: banner.has_class("-disconnected"), "the banner again")
        assert "primary-0" in _rows(app)  # the last data stays on screen
        await until(pilot, lambda: app.attempts >= 3, "several retries")
        live.backend.replica("primary-0").restarts = 7
        await live.start()
        await until(pilot, lambda: app.connected, "the reconnection", timeout=5)
        await until(pilot, lambda: _rows(app)["primary-0"][9] == "7", "fresh data")
        assert not banner.has_class("-disconnected")
        # The event stream resumes too.
        live.backend.events.publish("replica_ejected", deployment="primary", replica="primary-2")
        await until(pilot, lambda: any("primary-2" in e for e in _events(app)), "a new event")


async def test_sort_filter_and_pause(live: LiveControl, clock: FakeClock) -> None:
    load(live.backend)
    app = make_app(live.path, clock)
    async with app.run_test(size=SIZE) as pilot:
        await _started(pilot)
        await pilot.press("s")  # id -> state
        await pilot.press("s")  # state -> in-flight (descending)
        await until(pilot, lambda: app.sort.name == "in-flight", "the sort")
        table = app.query(ReplicaTable).first()
        await until(pilot, lambda: str(table.get_row_at(0)[0]) == "primary-2", "resorting")
        await pilot.press("f")
        await until(pilot, lambda: set(_rows(app)) == {"primary-0", "primary-1", "primary-2"}, "f")
        await pilot.press("f")
        await until(pilot, lambda: set(_rows(app)) == {"classifier-0"}, "the second filter")
        await pilot.press("f")
        await until(pilot, lambda: len(_rows(app)) == 4, "all deployments again")
        await pilot.press("p")
        assert app.query_one(Banner).has_class("-paused")
        live.backend.replica("primary-0").restarts = 5
        polls = app.polls
        app.refresh_now()
        await pilot.pause(0.1)
        assert app.polls == polls and _rows(app)["primary-0"][9] == "0"
        await pilot.press("p")
        await until(pilot, lambda: _rows(app)["primary-0"][9] == "5", "resumed updates")


async def test_64_replicas_update_in_place(live: LiveControl, clock: FakeClock) -> None:
    live.backend.reset({"primary": [f"cuda:{i % 8}" for i in range(64)]}, first_pid=1000)
    load(live.backend)
    app = make_app(live.path, clock)
    async with app.run_test(size=(100, 18)) as pilot:
        await _started(pilot)
        assert len(_rows(app)) == 64
        await pilot.press(*"j" * 8)
        assert app.selected == "primary-8"
        table = app.query(ReplicaTable).first()
        # Alone on screen, the table scrolls under its header rather than the page.
        assert table.scroll_y > 0 and app.deployments.scroll_y == 0
        await pilot.press(*"k" * 3)
        load(live.backend, seed=5)
        await app.poll_once()
        assert app.selected == "primary-5"  # updated in place: the cursor stays
        assert _rows(app)["primary-5"][5] == "20.0" and _rows(app)["primary-63"][5] == "78.0"


async def test_shows_what_each_adaptive_thread_learner_says(
    live: LiveControl, clock: FakeClock
) -> None:
    # What the supervisor does with each worker's /health: the pool's set_adaptive_threads.
    live.backend.set_adaptive_threads("primary-0", sample_adaptive_threads())
    live.backend.set_adaptive_threads("primary-1", sample_adaptive_threads("exploring"))
    app = make_app(live.path, clock)
    async with app.run_test(size=SIZE) as pilot:
        await _started(pilot)
        rows = _rows(app)
        thr = COLUMNS.index("THR")
        assert [rows[r][thr] for r in ("primary-0", "primary-1", "primary-2")] == [
            "1->1",
            "1 (exploring)",
            "1",
        ]
        live.backend.set_adaptive_threads("primary-1", sample_adaptive_threads("retired", "x"))
        await app.poll_once()
        assert _rows(app)["primary-1"][thr] == "1 (retired)"


async def test_router_mode_shows_backends_and_decision_rates(
    live: LiveControl, clock: FakeClock
) -> None:
    start = clock.monotonic()

    def router() -> dict[str, Any]:
        # 5 decisions per second of the fake clock from 4: any two polls see 5.0/s, however
        # many polls the app makes in between (its event stream may ask for one).
        count = {"n": 4 + round(5 * (clock.monotonic() - start))}
        return {
            "backends": [
                {"model": "coder", "url": "http://127.0.0.1:8001/v1", "state": "healthy",
                 "requests_per_s": 1.5, "latency_p50_ms": 10.0, "latency_p99_ms": 30.0,
                 "errors": 0, "last_error": None}
            ],
            "stats": {"decisions": [{"decision": "coding", "model": "coder", "count": count["n"]}],
                      "backend_fallbacks": [{"model": "coder", "reason": "http_503", "count": 2}]},
            "cache": {"store": "memory", "entries": 3, "bytes": 2048,
                      "hits": [{"decision": "coding", "tier": "exact", "count": 7}],
                      "misses": [{"decision": "coding", "mode": "exact", "count": 4}]},
        }  # fmt: skip

    live.backend.router = StubRouter(inventory=router)
    live.backend.signal_procs = StubSignalProcesses()  # type: ignore[assignment]
    app = make_app(live.path, clock)
    async with app.run_test(size=SIZE) as pilot:
        await _started(pilot)
        panel = app.query_one(RouterPanel)
        assert panel.display

        def shown() -> str:
            console = Console(width=150, record=True)
            console.print(panel.shown)
            return console.export_text()

        # Two successive polls a fake second apart see 5 more decisions. A background poll
        # that asked before an advance and got its answer after it reads as no decisions:
        # poll again, on a deadline.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0
        while "coding->coder 5.0" not in shown():
            assert loop.time() < deadline, f"no 5.0/s decision rate shown: {shown()}"
            clock.advance(1.0)
            await app.poll_once()
        # A render between polls (the 1 s tick) keeps the last rates: unchanged counters
        # are not "no decisions".
        polls = app.polls
        clock.advance(1.0)
        await app._render_all()
        if app.polls == polls:  # no poll slipped in between
            assert "coding->coder 5.0" in shown()
        text = shown()
        assert "coder" in text and "http://127.0.0.1:8001/v1" in text
        assert "http_503 2" in text  # the model's fallbacks in the backends table
        assert "cache (memory): 3 entries, 2.0 KiB; hits exact 7; misses 4" in text
        assert (
            "signal processes  signals-0 ready pid 812 jobs 40  signals-1 backoff jobs 9 "
            "rst 1 (killed by signal 9) failed 2" in text
        )


class StubSignalProcesses:
    """The supervisor's signal processes as its inventory reads them."""

    started = True

    def inventory(self) -> list[dict[str, object]]:
        return [
            {"id": "signals-0", "pid": 812, "state": "ready", "inflight": 0, "jobs": 40,
             "failed_jobs": 0, "restarts": 0, "restart_reason": None, "last_error": None},
            {"id": "signals-1", "pid": None, "state": "backoff", "inflight": 0, "jobs": 9,
             "failed_jobs": 2, "restarts": 1, "restart_reason": "killed by signal 9",
             "last_error": "killed by signal 9"},
        ]  # fmt: skip


async def test_engine_mode_hides_the_router_panel(live: LiveControl, clock: FakeClock) -> None:
    app = make_app(live.path, clock)
    async with app.run_test(size=SIZE) as pilot:
        await _started(pilot)
        assert not app.query_one(RouterPanel).display


def test_command_line_checks_the_interval() -> None:
    args = build_parser().parse_args(["--socket", "/tmp/x.sock", "--interval", "0.5"])
    assert (args.socket, args.interval) == ("/tmp/x.sock", 0.5)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--interval", "0"])


async def test_the_header_says_when_the_file_on_disk_is_not_served(
    live: LiveControl, clock: FakeClock
) -> None:
    source = ConfigSource(Path("/etc/vllm-sr/config.yaml"), watching=True)
    live.backend.events.add_sink(source.on_event)
    source.read("a" * 64, True)
    source.planned("a" * 64)
    live.backend.events.publish(ev.POOL_PUBLISHED, generation=1, deployments=["primary"])
    live.backend.config_source = source
    app = make_app(live.path, clock)
    async with app.run_test(size=SIZE) as pilot:
        await _started(pilot)
        assert "not the one being served" not in _text(app.query_one(HeaderBar))
        source.read("b" * 64, True)
        problem = "config.yaml:9: global.model_catalog...device: 'gpu0' is not accepted"
        live.backend.events.publish(
            ev.RELOAD_FAILED, reason="bad", source="watch", problems=[problem]
        )
        await app.poll_once()
        header = _text(app.query_one(HeaderBar))
        assert "/etc/vllm-sr/config.yaml on disk (sha256 bbbbbbbbbbbb)" in header
        assert "not the one being served" in header and problem in header
