"""docs/router.md's answer-header table against the code: the ``x-vsr-matched-<family>`` row
names exactly the words the router sends, the signal-family registry's header words
(``families.DEBUG_HEADER_WORD``) of the families it evaluates."""

from __future__ import annotations

import re
from pathlib import Path

from vllm_sr.config.signal_registry import FAMILIES
from vllm_sr.router.answers import answer_headers
from vllm_sr.router.families import DEBUG_HEADER_WORD
from vllm_sr.router.route import RouteResult

ROUTER_DOC = Path(__file__).parents[2] / "docs" / "router.md"
ROW = "| `x-vsr-matched-<family>` |"


def documented_words() -> list[str]:
    """The backticked words after "comma-separated" in the row's value."""
    (row,) = [line for line in ROUTER_DOC.read_text().splitlines() if line.startswith(ROW)]
    listed = row.removeprefix(ROW).split("comma-separated", 1)[1]
    return re.findall(r"`([a-z-]+)`", listed)


def sent_words() -> set[str]:
    """The header words ``answer_headers`` sends when a signal of every evaluated family
    matched, with the debug headers on."""
    matched = tuple(f"{f.name}:n" for f in FAMILIES if f.supported)
    headers = answer_headers(RouteResult(model="m", matched_signals=matched), debug=True)
    words = {h.removeprefix("x-vsr-matched-") for h in headers if h.startswith("x-vsr-matched-")}
    return words - {"signals"}  # x-vsr-matched-signals: ours, its own row


def test_the_matched_family_row_names_every_header_the_router_sends() -> None:
    documented = documented_words()
    assert len(documented) == len(set(documented)), documented
    registry = {DEBUG_HEADER_WORD[f.name] for f in FAMILIES if f.name in DEBUG_HEADER_WORD}
    sent = sent_words()
    assert sent <= registry  # every word sent is the registry's
    assert set(documented) == sent, (
        f"docs/router.md lacks {sorted(sent - set(documented))}, "
        f"names unsent {sorted(set(documented) - sent)}"
    )
