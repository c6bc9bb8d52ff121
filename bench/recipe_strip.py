"""An upstream recipe made loadable by removing only what vllm-sr refuses, and saying what was
removed: the probe bench's loader (bench/router_probes.py).

The recipe is validated as ``vllm-sr config validate`` does (``collect_problems``: field errors
and rule errors, each at its YAML path). Each problem removes the least that clears it:

- an unknown key: that key (every looper type runs now, so nothing clears the looper
  endpoint any more);
- a refused plugin or emit of a decision (``plugins[i]``, ``emits[i]``): that entry;
- any other problem inside a signal (``routing.signals.<family>[i]``): that signal;
- inside a decision's rule tree: the condition it is in (a leaf, or the node holding it),
  or the whole ``rules`` of the decision when the problem is at its root;
- anywhere else: the key the problem names (or the list entry).

The loop repeats until the file validates (removing a signal can make a rule that names it the
next problem) or no removal helps (then it raises, naming what is left). A path through a
pydantic union (``RuleNode`` / ``RuleLeaf``) is read against the document: a branch name that is
not a key of the document is skipped, and of two branches at one place, the one with fewer
problems is the one the document meant.
"""

from __future__ import annotations

import copy
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from vllm_sr.config.files import collect_problems
from vllm_sr.config.problems import Problem, format_path
from vllm_sr.config.schema import RootConfig

Path = tuple[str | int, ...]
MAX_ROUNDS = 40


@dataclass(frozen=True)
class Stripped:
    path: Path  # what was removed, in the document as it was at that round
    why: str  # the problem's message, shortened

    def pattern(self) -> str:
        """The path with list indexes as [N] (to group alike removals)."""
        return re.sub(r"\[\d+\]", "[N]", format_path(self.path))


class NotLoadable(Exception):
    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(p.render_plain() for p in problems[:5]))
        self.problems = problems


def resolve(doc: Any, loc: Path) -> tuple[Path, list[tuple[Path, str]]]:
    """The problem's path as it lies in the document (union branch names skipped), and the
    branches it went through: [(document path at the branch, branch name)]."""
    here: Path = ()
    node, branches = doc, []
    path: list[str | int] = []
    for part in loc:
        in_dict = isinstance(node, dict) and part in node
        if in_dict or (isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)):
            path.append(part)
            node = node[part]
        elif isinstance(part, str) and isinstance(node, dict) and part[:1].isupper():
            branches.append((tuple(path), part))  # a union's branch: not in the document
        else:
            path.append(part)  # a key the document lacks (missing): kept, resolved no further
            node = None
        here = tuple(path)
    return here, branches


def _meant(problems: list[Problem], doc: Any) -> list[tuple[Path, Problem]]:
    """Each problem at its document path, those of a union's other branch left out."""
    resolved = [(p, *resolve(doc, p.path)) for p in problems]
    per_branch: Counter[tuple[Path, str]] = Counter()
    for _, _, branches in resolved:
        per_branch.update(branches)
    best: dict[Path, str] = {}
    for (at, name), _count in sorted(per_branch.items(), key=lambda kv: kv[1]):
        best.setdefault(at, name)
    return [
        (path, problem)
        for problem, path, branches in resolved
        if all(best[at] == name for at, name in branches)
    ]


def _get(doc: Any, path: Path) -> Any:
    node = doc
    for part in path:
        node = node[part]
    return node


def _exists(doc: Any, path: Path) -> bool:
    try:
        _get(doc, path)
    except (KeyError, IndexError, TypeError):
        return False
    return True


def target(doc: Any, path: Path, problem: Problem) -> Path:
    """What to remove for one problem."""
    unknown = problem.message.startswith(("unknown key", "Extra inputs are not permitted"))
    if unknown and _exists(doc, path):
        return path
    parts = list(path)
    for i, part in enumerate(parts):  # a decision's plugin or emit: that entry
        if part in ("plugins", "emits") and i + 1 < len(parts) and isinstance(parts[i + 1], int):
            return tuple(parts[: i + 2])
    for i, part in enumerate(parts):  # inside a signal: the signal
        if part == "signals" and i + 2 < len(parts) and isinstance(parts[i + 2], int):
            return tuple(parts[: i + 3])
    if "rules" in parts:
        root = parts.index("rules")
        conds = [i for i, part in enumerate(parts) if part == "conditions" and i > root]
        conds = [i for i in conds if i + 1 < len(parts) and isinstance(parts[i + 1], int)]
        if conds:
            return tuple(parts[: conds[-1] + 2])
        return tuple(parts[: root + 1])
    while parts and not _exists(doc, tuple(parts)):
        parts.pop()  # a missing key: remove what holds it
    if not parts:
        raise NotLoadable([problem])
    return tuple(parts)


def _remove(doc: Any, path: Path) -> None:
    parent = _get(doc, path[:-1])
    del parent[path[-1]]


def _under(path: Path, others: set[Path]) -> bool:
    return any(o != path and path[: len(o)] == o for o in others)


def strip_refused(raw: dict[str, Any]) -> tuple[RootConfig, list[Stripped]]:
    """-> (the config as vllm-sr loads it, what was removed, in order). The recipe itself is
    not changed (a copy is stripped)."""
    doc = copy.deepcopy(raw)
    stripped: list[Stripped] = []
    for _ in range(MAX_ROUNDS):
        config, problems = collect_problems(doc)
        if config is not None:
            return config, stripped
        actions: dict[Path, str] = {}
        for path, problem in _meant(problems, doc):
            actions.setdefault(target(doc, path, problem), problem.message)
        if not actions:
            raise NotLoadable(problems)
        paths = set(actions)
        removed_any = False
        for where in sorted(paths, key=_sort_key, reverse=True):
            if _under(where, paths) or not _exists(doc, where):
                continue
            _remove(doc, where)
            removed_any = True
            stripped.append(Stripped(where, _short(actions[where])))
        if not removed_any:
            raise NotLoadable(problems)
    raise NotLoadable(collect_problems(doc)[1])


def _sort_key(path: Path) -> tuple[tuple[int, int | str], ...]:
    """List indexes sort as numbers, so that removing in reverse keeps the others valid."""
    return tuple((0, p) if isinstance(p, int) else (1, p) for p in path)


def _short(message: str) -> str:
    first = message.split("; accepted:")[0].split("; supported:")[0]
    first = re.sub(r" \((value|got) [^)]*\)?", "", first)
    return first if len(first) <= 90 else first[:87] + "..."


def summary(stripped: list[Stripped]) -> list[str]:
    """One line per kind of removal: count, path pattern, why (first seen)."""
    groups: dict[tuple[str, str], int] = defaultdict(int)
    for s in stripped:
        groups[(s.pattern(), s.why)] += 1
    return [f"{n:>3} x {pattern}: {why}" for (pattern, why), n in groups.items()]
