"""The dashboard's widgets. Each one only renders data it is handed; fetching lives in the app."""

from __future__ import annotations

import datetime as dt
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult, RenderResult
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, RichLog, Sparkline, Static

from vllm_sr.control.render import (
    backends_table,
    cache_line,
    config_lines,
    format_seconds,
    signal_processes_line,
)
from vllm_sr_top.model import (
    COLUMNS,
    SortKey,
    decisions_text,
    deployment_title,
    event_line,
    pool_state_text,
    replica_cells,
    sort_replicas,
)


class HeaderBar(Static):
    """Host, uptime, version, generation and every deployment's ready/desired and state."""

    DEFAULT_CSS = """
    HeaderBar { height: auto; background: $boost; padding: 0 1; }
    """

    def show(self, inventory: dict[str, Any] | None, socket: str, status: str) -> None:
        line = Text("vllm-sr-top", style="bold")
        if inventory is None:
            line.append(f"  {socket}  ")
            line.append(status, style="yellow")
            self.update(line)
            return
        svc = inventory.get("service", {})
        line.append(f"  host {svc.get('host', '?')}")
        line.append(f"  up {format_seconds(svc.get('uptime_s'), whole=True)}")
        line.append(f"  v{svc.get('version', '?')}")
        line.append(f"  gen {svc.get('generation', '?')}")
        line.append(f"  {status}", style="grey70")
        deps = Text()
        for dep in inventory.get("deployments", []):
            if deps:
                deps.append("   ")
            deps.append(str(dep.get("name", "?")), style="bold")
            deps.append(f" {dep.get('ready_replicas', 0)}/{dep.get('desired_replicas', 0)} ")
            deps.append_text(pool_state_text(str(dep.get("state", "?"))))
        if not deps:
            deps.append("no deployments", style="grey50")
        # config.yaml on disk is not the one being served: say so, and why, under the counts.
        drift = [Text(text, style="bold red") for text in config_lines(inventory)]
        self.update(Text("\n").join([line, deps, *drift]))


class Banner(Static):
    """One line that says what is wrong with the connection (or that updates are paused)."""

    DEFAULT_CSS = """
    Banner { height: auto; padding: 0 1; display: none; }
    Banner.-disconnected { display: block; background: $error; color: $text; text-style: bold; }
    Banner.-paused { display: block; background: $warning; color: $text; }
    Banner.-readonly { display: block; background: $primary-darken-2; color: $text; }
    """

    def show(self, kind: str | None, text: str = "") -> None:
        for cls in ("-disconnected", "-paused", "-readonly"):
            self.remove_class(cls)
        if kind is not None:
            self.add_class(f"-{kind}")
        self.update(text)


class ReplicaTable(DataTable[Any]):
    """Replicas of one deployment. Rows are updated in place so the cursor stays on its
    replica across refreshes (rebuilt only when the set or the order of replicas changes)."""

    def __init__(self, deployment: str, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)
        self.deployment = deployment
        self._order: list[str] = []
        self._cells: dict[str, list[Text | str]] = {}

    def on_mount(self) -> None:
        for name in COLUMNS:
            self.add_column(name, key=name)

    @property
    def selected_id(self) -> str | None:
        if not self._order or self.cursor_row < 0 or self.cursor_row >= len(self._order):
            return None
        return self._order[self.cursor_row]

    def show(self, replicas: list[dict[str, Any]], sort: SortKey, now: float) -> None:
        ordered = sort_replicas(replicas, sort)
        rows = {str(r.get("id")): replica_cells(r, now) for r in ordered}
        order = list(rows)
        if order != self._order:
            keep = self.selected_id
            self.clear()
            for rid, cells in rows.items():
                self.add_row(*cells, key=rid)
            self._order = order
            self._cells = rows
            if keep in order:
                self.move_cursor(row=order.index(keep), animate=False)
            return
        # Only changed cells are touched: with 64 replicas a refresh stays cheap.
        for rid, cells in rows.items():
            before = self._cells.get(rid, [])
            for index, (column, cell) in enumerate(zip(COLUMNS, cells, strict=True)):
                if index >= len(before) or before[index] != cell:
                    self.update_cell(rid, column, cell, update_width=True)
        self._cells = rows


class ThroughputSparkline(Sparkline):
    """One sample per column, the newest on the right, zeros before the first (like htop's
    meters), so a few first samples are not stretched over the whole width. The window is
    taken when drawing, at the width the sparkline has then."""

    def render(self) -> RenderResult:
        width = self.size.width
        full = self.data
        recent = list(full or [])[-width:] if width else []
        # set_reactive: a swap for this one drawing must not schedule another refresh.
        self.set_reactive(Sparkline.data, [0.0] * (width - len(recent)) + recent)
        try:
            return super().render()
        finally:
            self.set_reactive(Sparkline.data, full)


class DeploymentPanel(Vertical):
    """A deployment's title line with its throughput sparkline, then its replica table."""

    DEFAULT_CSS = """
    DeploymentPanel { height: auto; margin: 0 0 1 0; }
    DeploymentPanel > Horizontal { height: 1; }
    DeploymentPanel .title { width: auto; padding: 0 1; }
    DeploymentPanel .rate { width: 14; text-align: right; }
    DeploymentPanel Sparkline { width: 1fr; height: 1; margin: 0 1; }
    DeploymentPanel ReplicaTable { height: auto; }
    /* Alone on screen, the table fills it and scrolls under its own fixed header. */
    DeploymentPanel.-solo { height: 1fr; margin: 0; }
    DeploymentPanel.-solo ReplicaTable { height: 1fr; }
    """

    def __init__(self, deployment: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.deployment = deployment

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield Static(classes="title")
            yield Static(classes="rate")
            yield ThroughputSparkline([], summary_function=max)
        yield ReplicaTable(self.deployment)

    @property
    def table(self) -> ReplicaTable:
        return self.query_one(ReplicaTable)

    def show(self, dep: dict[str, Any], history: list[float], sort: SortKey, now: float) -> None:
        self.query_one(".title", Static).update(deployment_title(dep))
        rate = history[-1] if history else 0.0
        self.query_one(".rate", Static).update(f"{rate:.1f} req/s")
        # A fixed window, filled from the right as samples arrive (like htop's meters), so
        # a few first samples are not stretched over the whole width.
        self.query_one(ThroughputSparkline).data = list(history)
        self.table.show(list(dep.get("replicas", [])), sort, now)


class RouterPanel(Static):
    """Router mode: the LLM backends (state, requests/s, p50/p99, errors, fallbacks), decision
    rates, the response cache's hits and the signal processes. Hidden in Engine mode."""

    shown: Group | None = None

    def show(
        self,
        router: dict[str, Any] | None,
        rates: dict[tuple[str, str], float],
        signal_processes: list[dict[str, Any]] | None = None,
    ) -> None:
        self.display = router is not None
        if router is not None:
            parts: list[Table | Text] = [backends_table(router), decisions_text(router, rates)]
            if router.get("cache") is not None:
                parts.append(cache_line(router["cache"]))
            if signal_processes:
                parts.append(signal_processes_line(signal_processes))
            self.shown = Group(*parts)
            self.update(self.shown)


class EventsPane(RichLog):
    """The event stream: ejections, readmissions, withheld ejections, restarts, reloads."""

    DEFAULT_CSS = """
    EventsPane {
        height: 7; border-top: solid $primary; background: $surface; overflow-x: hidden;
    }
    """

    def __init__(self, tz: dt.tzinfo | None, **kwargs: Any) -> None:
        super().__init__(max_lines=500, wrap=False, markup=False, auto_scroll=True, **kwargs)
        self.tz = tz
        self.last_seq = 0

    def add_event(self, event: dict[str, Any]) -> bool:
        """Shows the event unless already shown (a reconnect replays from ``last_seq``)."""
        seq = event.get("seq")
        if isinstance(seq, int):
            if seq <= self.last_seq:
                return False
            self.last_seq = seq
        self.write(event_line(event, self.tz))
        return True

    def restarted(self) -> None:
        self.last_seq = 0
        self.write(
            Text(
                "-- the service restarted; events below are from the new process --",
                style="bold yellow",
            )
        )


class MessageLine(Static):
    """The outcome of the last action (or why it is not allowed)."""

    DEFAULT_CSS = """
    MessageLine { height: 1; padding: 0 1; color: $text-muted; }
    MessageLine.-error { color: $error; text-style: bold; }
    MessageLine.-ok { color: $success; }
    """

    def say(self, text: str, kind: str = "info") -> None:
        self.set_class(kind == "error", "-error")
        self.set_class(kind == "ok", "-ok")
        self.update(text)
