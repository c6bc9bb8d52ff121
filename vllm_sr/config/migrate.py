"""``vllm-sr config migrate``: a 3d48f8c9-era file's renamed fields rewritten to upstream v0.4's
names (the table in ``config/renames.py``).

Only the renamed keys' own characters change. The rest of the text stays byte for byte:
comments, key order, quoting, indentation and flow style. The round-trip parser gives each old
key's line and column, and the edit replaces the key there (quotes kept). The result is parsed
again and checked before anything uses it. A file already on v0.4's names comes back unchanged,
so a second run changes nothing.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from ruamel.yaml.comments import CommentedMap

from vllm_sr.config.files import parse_document, render_problem, to_plain
from vllm_sr.config.problems import format_path
from vllm_sr.config.renames import RENAMES, Rename, both_names_problems
from vllm_sr.errors import ConfigError


@dataclass(frozen=True)
class Renamed:
    rename: Rename
    line: int
    """1-based line of the key in the file as it was."""

    def describe(self) -> str:
        r = self.rename
        return f"line {self.line}: {format_path((*r.section, r.old))} -> {r.new}"


@dataclass(frozen=True)
class Migration:
    before: str
    after: str
    renamed: tuple[Renamed, ...]

    @property
    def changed(self) -> bool:
        return self.after != self.before

    def diff(self, source: str) -> str:
        """The change as a unified diff (empty when there is none)."""
        return "".join(
            difflib.unified_diff(
                self.before.splitlines(keepends=True),
                self.after.splitlines(keepends=True),
                fromfile=f"{source} (3d48f8c9 names)",
                tofile=f"{source} (v0.4 names)",
            )
        )


def _mapping_at(doc: object, section: tuple[str, ...]) -> CommentedMap | None:
    node = doc
    for key in section:
        if not isinstance(node, CommentedMap) or key not in node:
            return None
        node = node[key]
    return node if isinstance(node, CommentedMap) else None


def _key_position(node: CommentedMap, key: str, source: str) -> tuple[int, int]:
    """(0-based line, column) of ``key`` as written in ``node``."""
    try:
        line, col = node.lc.key(key)
    except (KeyError, TypeError, AttributeError) as exc:  # e.g. it comes from a << merge
        raise ConfigError(
            f"{source}: {key} is not written in its own mapping (a merge or an anchor?); "
            "accepted: rename it by hand"
        ) from exc
    return int(line), int(col)


def _rename_at(line: str, col: int, old: str, new: str) -> str | None:
    for quote in ("", '"', "'"):
        token = f"{quote}{old}{quote}"
        end = col + len(token)
        if line.startswith(token, col) and (quote or not line[end : end + 1].isalnum()):
            return f"{line[:col]}{quote}{new}{quote}{line[end:]}"
    return None


def migrate_text(text: str, source: str = "config.yaml") -> Migration:
    """``text`` with every old name of the table rewritten to its v0.4 name. Raises
    ConfigError (nothing rewritten) when a mapping gives a field under both names, or a key
    cannot be rewritten in place."""
    doc = parse_document(text, source)
    both = both_names_problems(to_plain(doc), ())
    if both:
        rendered = [render_problem(source, doc, p) for p in both]
        raise ConfigError(f"{source}: {len(rendered)} problem(s)", rendered)
    found: list[tuple[int, int, Rename]] = []
    for r in RENAMES:
        node = _mapping_at(doc, r.section)
        if node is not None and r.old in node:
            found.append((*_key_position(node, r.old, source), r))
    lines = text.split("\n")
    for line, col, r in sorted(found, key=lambda f: (f[0], f[1]), reverse=True):
        edited = _rename_at(lines[line], col, r.old, r.new) if line < len(lines) else None
        if edited is None:
            raise ConfigError(
                f"{source}:{line + 1}: {format_path((*r.section, r.old))}: the key is not "
                "written where the parser puts it; accepted: rename it by hand"
            )
        lines[line] = edited
    after = "\n".join(lines)
    _check(after, source, [r for _, _, r in found])
    renamed = tuple(Renamed(r, line + 1) for line, _, r in sorted(found, key=lambda f: f[:2]))
    return Migration(text, after, renamed)


def _check(after: str, source: str, renames: list[Rename]) -> None:
    """The rewritten text parses, and holds each renamed field under its new name only."""
    doc = parse_document(after, f"{source} (migrated)")
    for r in renames:
        node = _mapping_at(doc, r.section)
        if node is None or r.new not in node or r.old in node:
            raise ConfigError(
                f"{source}: rewriting {format_path((*r.section, r.old))} went wrong; "
                "accepted: rename it by hand (the file was not changed)"
            )
