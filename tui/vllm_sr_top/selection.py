"""vllm-sr-top's replica selection: which table the selection is in (kept apart from the
focus), the selected replica, and moving it with j/k across the deployments' tables, keeping
the selected row on screen. ``VllmSrTop`` mixes it in."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual import events
from textual.containers import VerticalScroll
from textual.geometry import Region

from vllm_sr_top.widgets import DeploymentPanel, ReplicaTable

if TYPE_CHECKING:
    from textual.app import App

    _AppBase = App[None]
else:
    _AppBase = object


class Selection(_AppBase):
    """The selection and j/k navigation of :class:`~vllm_sr_top.app.VllmSrTop`."""

    deployments: VerticalScroll
    _table: ReplicaTable | None

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
