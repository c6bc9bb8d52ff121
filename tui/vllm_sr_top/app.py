"""vllm-sr-top: a live Textual dashboard of a vllm-sr host's replicas, ejections and restarts.

It speaks only the control API, through ``vllm_sr.control.client.AsyncControlClient``. All I/O
runs in Textual workers on the app's event loop (httpx's async client, never blocking), so a
slow or absent service never freezes the screen."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
from collections.abc import Sequence
from typing import Any, ClassVar

from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.geometry import Region
from textual.widgets import Footer

from vllm_sr.backoff import Backoff
from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr_top.model import SORT_KEYS, DecisionRates, ThroughputHistory, next_filter, next_sort
from vllm_sr_top.screens import ACTIONS, PAST, ConfirmScreen, HelpScreen
from vllm_sr_top.source import (
    DEFAULT_SOCKET,
    ActionRefused,
    ControlApi,
    Disconnected,
    connect,
    permission_from_health,
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

EVENT_BACKLOG = 50


class VllmSrTop(App[None]):
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

    # ---- data ---------------------------------------------------------------------------

    async def _poll_loop(self) -> None:
        while True:
            if not self.paused:
                try:
                    delay = await self.poll_once()
                except Exception as exc:  # a bug or a malformed document: keep the loop alive
                    self.log.error("refresh failed", exc)
                    self.say(f"could not show the inventory: {exc!r}", "error")
                    delay = None
                if delay is not None:
                    await self._wait(delay)
                    continue
            await self._wait(self.interval)

    async def _wait(self, seconds: float) -> None:
        """Sleeps ``seconds`` or until something asks for a refresh now."""
        # Cleared after waking, so a request made while a poll was running is not lost.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)
        self._wake.clear()

    def refresh_now(self) -> None:
        self._wake.set()

    async def poll_once(self) -> float | None:
        """One refresh. Returns the retry delay when the service cannot be reached."""
        try:
            if not self.connected:
                health = await self.api.health()
                if "caller" in health:  # else what a 403 taught us stands
                    self.read_only = permission_from_health(health)
            inventory = await self.api.inventory()
        except Disconnected as exc:
            return self._went_away(str(exc))
        service = inventory.get("service", {})
        identity = (service.get("pid"), service.get("started_at"))
        if self._identity is not None and identity != self._identity:
            # A new service process numbers its events from 1 again.
            self.events_pane.restarted()
        self._identity = identity
        self.connected = True
        self._online.set()
        self.backoff.reset()
        self.attempts = 0
        self.retry_at = None
        self.inventory = inventory
        self.history.record(inventory)
        await self._render_all()
        self.polls += 1
        return None

    def _went_away(self, reason: str) -> float:
        self.connected = False
        self._online.clear()
        self.last_error = reason
        delay = self.backoff.next_delay()
        self.attempts += 1
        self.retry_at = self.clock.monotonic() + delay
        self._render_banner()
        self._render_header()
        return delay

    async def _event_loop(self) -> None:
        """Follows the event stream; after a break, replays what it missed from the ring."""
        pane = self.events_pane
        retry = Backoff(self.backoff.initial_s, self.backoff.max_s)
        while True:
            await self._online.wait()
            seen = pane.last_seq
            try:
                await self._catch_up(pane)
                # The stream replays what came after last_seq, so a reconnect loses nothing
                # that is still in the service's ring.
                async for event in self.api.stream_events(pane.last_seq):
                    if isinstance(event.get("seq"), int):
                        pane.add_event(event)
            except Disconnected:
                pass
            except Exception as exc:  # a malformed line must not end the pane for good
                self.log.error("event stream failed", exc)
            if pane.last_seq != seen:
                retry.reset()
            # Let the poll loop confirm (and own the backoff of) an outage. A stream that
            # breaks while the service answers is retried on a backoff of its own, so it
            # cannot spin.
            self._online.clear()
            self.refresh_now()
            await asyncio.sleep(retry.next_delay())

    async def _catch_up(self, pane: EventsPane) -> None:
        body = await self.api.events(pane.last_seq)
        if int(body.get("last_seq") or 0) < pane.last_seq:
            # Sequence numbers went back: a new service process the inventory has not shown
            # yet. Start over from its ring.
            pane.restarted()
            body = await self.api.events(0)
        # A fresh screen shows the recent past, not the whole ring.
        for event in list(body.get("events", []))[-EVENT_BACKLOG:]:
            pane.add_event(event)

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
        self.router_panel.show(router, self.decisions.update(router, now))
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

    # ---- selection ----------------------------------------------------------------------

    def _tables(self) -> list[ReplicaTable]:
        return list(self.deployments.query(ReplicaTable))

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        if isinstance(event.widget, ReplicaTable):
            self._table = event.widget

    @property
    def current_table(self) -> ReplicaTable | None:
        """The table the selection is in. Kept apart from the focus: the focus goes away
        while the terminal is not the active window (Textual blurs on focus-out), and keys
        can still arrive then (tmux send-keys, a paste)."""
        focused = self.focused
        if isinstance(focused, ReplicaTable):
            self._table = focused
        elif self._table is not None and not self._table.is_attached:
            self._table = None
        return self._table

    @property
    def selected(self) -> str | None:
        table = self.current_table
        return table.selected_id if table is not None else None

    def _focus(self, table: ReplicaTable) -> None:
        self._table = table
        # At once, not on the next message like Widget.focus(): a key already queued behind
        # this one (j then e) must find the table focused.
        table.screen.set_focus(table, scroll_visible=False)

    def action_move(self, step: int) -> None:
        """Moves the selection; past a table's end it continues in the next deployment."""
        tables = self._tables()
        current = self.current_table
        if current is None:
            if tables:
                self._focus(tables[0])
            return
        if self.focused is not current:
            self._focus(current)
        row = current.cursor_row + step
        if 0 <= row < current.row_count:
            current.move_cursor(row=row, animate=False)
            return
        index = tables.index(current) + (1 if step > 0 else -1)
        if 0 <= index < len(tables) and tables[index].row_count:
            target = tables[index]
            self._focus(target)
            target.move_cursor(row=0 if step > 0 else target.row_count - 1, animate=False)

    def on_data_table_row_highlighted(self, event: ReplicaTable.RowHighlighted) -> None:
        """Keeps the selected row on screen: the tables grow to their full height inside one
        scrolling area, so it is that area, not the table, that has to scroll."""
        table = event.data_table
        panel = table.parent
        if not isinstance(panel, DeploymentPanel):
            return
        y = panel.virtual_region.y + table.virtual_region.y + table.header_height
        row = Region(0, y + event.cursor_row, 1, 1)
        container = self.deployments
        # The header row goes along when the first row is selected.
        top = row if event.cursor_row else Region(0, y - table.header_height, 1, 2)
        container.scroll_to_region(top, animate=False, immediate=True)

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
