"""Modal screens: the confirmation every action asks for, and the key help."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

HELP_TEXT = """\
[b]vllm-sr-top[/b]: live replicas, ejections and restarts of a vllm-sr host

  [b]?[/b]          this help             [b]q[/b]          quit
  [b]↑ ↓ j k[/b]    select a replica      [b]tab[/b]        next deployment table
  [b]d[/b]          drain the replica     [b]e[/b]          eject it (base cool-down)
  [b]r[/b]          readmit it            [b]R[/b]          restart its worker
  [b]s[/b]          next sort column      [b]f[/b]          filter by deployment
  [b]p[/b]          pause / resume updates

Each action asks to confirm, then shows the service's answer or its refusal.
Actions need the service's admin rights (root, the service user or the admin
group); a read-only user sees them disabled, with the reason.

Press any key to close."""


# The confirmation asked before each action, and what the message line says once done.
ACTIONS: dict[str, str] = {
    "drain": "Drain {rid}? It stops taking requests and finishes the ones it has.",
    "eject": "Eject {rid} from dispatch for its deployment's base cool-down?",
    "readmit": "Readmit {rid} into dispatch now (ends an ejection or undoes a drain)?",
    "restart": "Restart {rid}'s worker process? In-flight requests are drained first.",
}
PAST = {"drain": "draining", "eject": "ejected", "readmit": "readmitted", "restart": "restarting"}


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Static {
        width: auto; max-width: 90%; height: auto; padding: 1 2;
        border: round $primary; background: $panel;
    }
    """

    def compose(self) -> ComposeResult:
        yield Static(HELP_TEXT)

    def on_key(self) -> None:
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    """Asks ``question``; ``y``/enter confirms, ``n``/escape cancels."""

    BINDINGS = [  # noqa: RUF012 (Textual's declared class attribute)
        Binding("y,enter", "answer(True)", "yes"),
        Binding("n,escape", "answer(False)", "no"),
    ]
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical {
        width: 64; max-width: 95%; height: auto; padding: 1 2;
        border: thick $warning; background: $panel;
    }
    ConfirmScreen .hint { color: $text-muted; }
    """

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.question, markup=False)
            yield Static("y / enter: yes     n / esc: no", classes="hint")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
