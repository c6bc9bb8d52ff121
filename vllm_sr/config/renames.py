"""The fields upstream v0.4 ("Hermes") renamed in place: the one table of them.

A v0.4 file still says ``version: v0.3``; some fields only changed name (upstream's
"Configuration migration", V04-DELTA.md §2g). vllm-sr reads both names; the v0.4 name is the
current one (``config show`` prints it, an unknown-key message offers it), the 3d48f8c9 name is
still accepted, and a mapping that gives both is an error naming both. ``vllm-sr config
migrate`` (``config/migrate.py``) rewrites the old names to the new ones from this table.

Only plain renames are here: a field whose meaning or shape changed as well (reasoning
families moved into ``providers.models[].reasoning``, ``quality_score`` into evaluation
records, ``backend_refs[].type`` into catalog provider ids) is not a rename and is not listed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_sr.config.routing_base import Path, as_dict, problem

if TYPE_CHECKING:
    from vllm_sr.config.problems import Problem


@dataclass(frozen=True)
class Rename:
    section: tuple[str, ...]
    """The mapping that holds the key, as its path from the file's root."""

    old: str
    """The 3d48f8c9 name (still read)."""

    new: str
    """The v0.4 name (current)."""


PROVIDER_DEFAULTS = ("providers", "defaults")

RENAMES: tuple[Rename, ...] = (
    Rename(PROVIDER_DEFAULTS, "default_model", "model"),
    Rename(PROVIDER_DEFAULTS, "default_reasoning_effort", "reasoning_effort"),
)


def current_name(section: tuple[str, ...], old: str) -> str:
    """The v0.4 name of ``section``'s field ``old`` (``old`` itself when it was not renamed):
    the pydantic alias of a renamed field, so the schema speaks the current name."""
    return next((r.new for r in RENAMES if r.section == section and r.old == old), old)


def _renames_in(section: tuple[str, ...]) -> list[Rename]:
    return [r for r in RENAMES if r.section == section]


def given(mapping: object, section: tuple[str, ...], new: str) -> tuple[str, object] | None:
    """(the key the file uses, its value) for the field whose v0.4 name is ``new`` in the raw
    mapping at ``section``, whichever name it is written with; None when neither is."""
    m = as_dict(mapping)
    if new in m:
        return new, m[new]
    old = next((r.old for r in _renames_in(section) if r.new == new), None)
    if old is not None and old in m:
        return old, m[old]
    return None


def both_names_problems(mapping: object, at: Path) -> list[Problem]:
    """A problem at each old name whose new name is given too, in the raw mapping found at
    path ``at`` from the file's root (checked: every section of the table under ``at``)."""
    problems: list[Problem] = []
    for r in RENAMES:
        if r.section[: len(at)] != at:
            continue
        node: object = mapping
        for key in r.section[len(at) :]:
            node = as_dict(node).get(key)
        node = as_dict(node)
        if r.old in node and r.new in node:
            problems.append(
                problem(
                    (*r.section, r.old),
                    f"{r.old!r} and {r.new!r} are both given, and are the same field "
                    f"({r.old} is its 3d48f8c9 name, {r.new} its v0.4 name); accepted: one of "
                    f"them, preferably {r.new}",
                )
            )
    return problems


def both_names_error(data: object, section: tuple[str, ...]) -> str | None:
    """For a model validator: the message when the mapping at ``section`` gives a field under
    both names (None when it does not)."""
    m = as_dict(data)
    both = [r for r in _renames_in(section) if r.old in m and r.new in m]
    if not both:
        return None
    return "; ".join(f"{r.old} and {r.new} are both given (the same field)" for r in both)
