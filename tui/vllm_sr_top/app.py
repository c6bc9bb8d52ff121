"""vllm-sr-top: a live Textual dashboard of a vllm-sr host's replicas, ejections and restarts.

It speaks only the control API, through ``vllm_sr.control.client.AsyncControlClient``. All I/O
runs in Textual workers on the app's event loop (httpx's async client, never blocking), so a
slow or absent service never freezes the screen. The app is the layout, the rendering, the
actions and the command line; it mixes in its data side (``polling``) and its replica
selection (``selection``)."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
from collections.abc import Sequence
from typing import Any, ClassVar

from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import Footer

from vllm_sr.backoff import Backoff
from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr_top.model import SORT_KEYS, DecisionRates, ThroughputHistory, next_filter, next_sort
from vllm_sr_top.polling import Polling
from vllm_sr_top.screens import ACTIONS, PAST, ConfirmScreen, HelpScreen
from vllm_sr_top.selection import Selection
from vllm_sr_top.source import (
    DEFAULT_SOCKET,
    ActionRefused,
    ControlApi,
    Disconnected,
    connect,
)
from vllm_sr_top.widgets import (
    Banner,
    DeploymentPanel,
    EventsPane,
    HeaderBar,
    MessageLine,
    ReplicaTable,
    RouterPanel,
)

RECONNECT_FIRST_S = 0.5
RECONNECT_MAX_S = 10.0


class VllmSrTop(Polling, Selection, App[None]):
    TITLE = "vllm-sr-top"
    # The palette's footer entry would push our own keys off an 80-column footer.
    ENABLE_COMMAND_PALETTE = False
    # The first replica table takes the focus once it exists (see _render_unlocked).
    AUTO_FOCUS = None
    CSS = """
    #deployments { height: 1fr; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("question_mark", "help", "help"),
        Binding("q", "quit", "quit"),
        # Like top and htop (Textual's default only explains how to quit).
        Binding("ctrl+c", "quit", "quit", show=False, priority=True),
        Binding("j,down", "move(1)", "down", show=False),
        Binding("k,up", "move(-1)", "up", show=False),
        Binding("d", "act('drain')", "drain"),
        Binding("e", "act('eject')", "eject"),
        Binding("r", "act('readmit')", "readmit"),
        Binding("R", "act('restart')", "restart"),
        Binding("s", "sort", "sort"),
        Binding("f", "filter", "filter"),
        Binding("p", "pause", "pause"),
    ]

    def __init__(
        self,
        socket: str = DEFAULT_SOCKET,
        interval: float = 1.0,
        *,
        api: ControlApi | None = None,
        clock: Clock = SYSTEM_CLOCK,
        tz: dt.tzinfo | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        super().__init__()
        self.socket = socket
        self.interval = interval
        self.api = api or connect(socket)
        self.clock = clock
        self.tz = tz
        # Reconnects: 0.5 s doubling to 10 s, started over by a successful poll.
        self.backoff = backoff or Backoff(RECONNECT_FIRST_S, RECONNECT_MAX_S)
        self.attempts = 0  # failed polls since the last success
        self.inventory: dict[str, Any] | None = None
        self.history = ThroughputHistory()
        self.decisions = DecisionRates()
        self.sort = SORT_KEYS[0]
        self.filter: str | None = None
        self.paused = False
        self.connected = False
        self.read_only: str | None = None  # why, when the caller may only read
        self.polls = 0  # successful refreshes, for tests to wait on
        self.last_error = ""
        self.retry_at: float | None = None
        self._identity: tuple[Any, Any] | None = None  # (pid, started_at) of the service
        self._wake = asyncio.Event()
        self._render_lock = asyncio.Lock()
        self._table: ReplicaTable | None = None  # where the selection is
        self._online = asyncio.Event()

    # ---- layout -------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        # Held by reference: ``query_one`` searches the active screen, which is a dialog
        # while one is open, and the screen must keep updating behind it.
        self.header = HeaderBar()
        self.banner = Banner()
        self.deployments = VerticalScroll(id="deployments")
        self.router_panel = RouterPanel(id="router")
        self.router_panel.display = False
        self.events_pane = EventsPane(self.tz)
        self.message = MessageLine()
        yield self.header
        yield self.banner
        yield self.deployments
        yield self.router_panel
        yield self.events_pane
        yield self.message
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self._render_header()
        self.run_worker(self._poll_loop(), group="poll", exit_on_error=False)
        self.run_worker(self._event_loop(), group="events", exit_on_error=False)
        # Redraws the countdowns (ejection time left, retry in) between polls.
        self.set_interval(1.0, self._tick)

    async def on_unmount(self) -> None:
        await self.api.close()

    # ---- rendering ----------------------------------------------------------------------

    def _status_text(self) -> str:
        if not self.connected:
            return "connecting" if self.inventory is None else "disconnected"
        parts = [f"sort {self.sort.name}"]
        if self.filter:
            parts.append(f"only {self.filter}")
        if self.paused:
            parts.append("paused")
        return "  ".join(parts)

    def _render_header(self) -> None:
        self.header.show(self.inventory, self.socket, self._status_text())

    def _render_banner(self) -> None:
        banner = self.banner
        if not self.connected and self.retry_at is not None:
            left = max(0.0, self.retry_at - self.clock.monotonic())
            banner.show(
                "disconnected",
                f"DISCONNECTED: {self.last_error.rstrip('.')}. Retrying in {_seconds(left)} "
                f"(attempt {self.attempts}); the data below is stale.",
            )
        elif self.paused:
            banner.show("paused", "PAUSED: updates stopped; press p to resume")
        elif self.read_only:
            banner.show("readonly", f"read-only: {self.read_only}")
        else:
            banner.show(None)

    async def _render_all(self) -> None:
        # A refresh, a tick and a key (sort, filter) may all render at once; remounting the
        # panels must not interleave.
        async with self._render_lock:
            await self._render_unlocked()

    async def _render_unlocked(self) -> None:
        self._render_header()
        self._render_banner()
        if self.inventory is None:
            return
        container = self.deployments
        deps = [
            d
            for d in self.inventory.get("deployments", [])
            if self.filter is None or d.get("name") == self.filter
        ]
        names = [str(d.get("name")) for d in deps]
        panels = {p.deployment: p for p in container.query(DeploymentPanel)}
        if list(panels) != names:
            await container.remove_children()
            solo = len(names) == 1
            await container.mount_all(
                [DeploymentPanel(n, classes="-solo" if solo else "") for n in names]
            )
            panels = {p.deployment: p for p in container.query(DeploymentPanel)}
        now = self.clock.time()
        router = self.inventory.get("router")
        procs = self.inventory.get("signal_processes")
        self.router_panel.show(router, self.decisions.rates, procs)
        for dep in deps:
            name = str(dep.get("name"))
            panels[name].show(dep, self.history.samples(name), self.sort, now)
        # The selection starts in the first table, and moves there when its table went away
        # (a filter, a scale). The focus follows only when nothing has it: the user may have
        # moved it to the events pane, and a dialog keeps its own.
        tables = list(container.query(ReplicaTable))
        if tables and self.current_table is None:
            self._table = tables[0]
        focusable = self.app_focus and self.screen is container.screen
        if tables and focusable and self.focused is None:
            self._focus(self._table or tables[0])

    async def _tick(self) -> None:
        self._render_banner()
        if self.connected and not self.paused:
            await self._render_all()

    # ---- actions ------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # None shows the key greyed out in the footer: the action exists but is not allowed.
        if action == "act" and self.read_only:
            return None
        return True

    def say(self, text: str, kind: str = "info") -> None:
        self.message.say(text, kind)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_sort(self) -> None:
        self.sort = next_sort(self.sort)
        self.say(f"sorted by {self.sort.name}")
        self.run_worker(self._render_all(), group="render")

    def action_filter(self) -> None:
        names = [str(d.get("name")) for d in (self.inventory or {}).get("deployments", [])]
        self.filter = next_filter(self.filter, names)
        self.say(f"showing {self.filter or 'all deployments'}")
        self.run_worker(self._render_all(), group="render")

    def action_pause(self) -> None:
        self.paused = not self.paused
        self.say("paused" if self.paused else "resumed")
        self._render_banner()
        self._render_header()
        if not self.paused:
            self.refresh_now()

    def action_act(self, verb: str) -> None:
        if self.read_only:
            self.say(f"{verb} is disabled: {self.read_only}", "error")
            return
        rid = self.selected
        if rid is None:
            self.say(f"{verb}: select a replica first", "error")
            return

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.say(f"{verb} {rid}: sent, waiting for the service")
                self.run_worker(self._do_act(verb, rid), group="act", exit_on_error=False)
            else:
                self.say(f"{verb} {rid}: cancelled")

        self.push_screen(ConfirmScreen(ACTIONS[verb].format(rid=rid)), confirmed)

    async def _do_act(self, verb: str, rid: str) -> None:
        try:
            await self.api.act(verb, rid)
        except ActionRefused as exc:
            if exc.status == 403:
                self.read_only = exc.message
                self.refresh_bindings()
                self._render_banner()
            self.say(f"{verb} {rid} refused: {exc.message}", "error")
            return
        except Disconnected as exc:
            # Sent or not, applied or not: only the service knows; its events will say.
            self.say(f"{verb} {rid}: no answer from the service ({exc})", "error")
            return
        self.say(f"{verb} {rid}: done, {PAST[verb]}", "ok")
        self.refresh_now()


def _seconds(left: float) -> str:
    return f"{left:.1f}s" if left < 10 else f"{left:.0f}s"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-sr-top",
        description="Live dashboard of a vllm-sr host: replicas, ejections, restarts.",
    )
    parser.add_argument(
        "--socket", default=DEFAULT_SOCKET, help=f"control socket (default {DEFAULT_SOCKET})"
    )
    parser.add_argument(
        "--interval",
        type=_positive_seconds,
        default=1.0,
        help="refresh interval in seconds (default 1)",
    )
    return parser


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.05 <= value <= 3600:
        raise argparse.ArgumentTypeError(
            f"--interval {text!r}: expected seconds between 0.05 and 3600"
        )
    return value


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    VllmSrTop(socket=args.socket, interval=args.interval).run()


if __name__ == "__main__":
    main()
