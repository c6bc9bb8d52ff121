"""No import runs back up (issue 27): each package imports only what sits below it, so a request
walked through the code (docs/internals.md, "Two requests, walked") enters each layer once, in
order. Read from the source (every import statement, also those inside functions), not from
``sys.modules``, so a lazy import that runs only on some path is judged too. Imports under
``if TYPE_CHECKING:`` never run and are left out."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "vllm_sr"

# package -> the vllm_sr packages it must never import. Read top to bottom: the CLI and the
# supervisor sit above the frontend, which sits above Router mode, which sits above the pool;
# the worker is its own process and knows none of them; the server, the wire vocabulary and the
# plan records sit below all.
FORBIDDEN: dict[str, set[str]] = {
    "frontend": {"supervisor", "control", "commands", "cli"},
    "router": {"frontend", "supervisor", "control", "commands", "cli"},
    "pool": {"frontend", "router", "supervisor", "control", "worker", "commands", "cli"},
    "worker": {"pool", "frontend", "router", "supervisor", "control", "commands", "cli"},
    "httpserver": {
        "pool",
        "frontend",
        "router",
        "supervisor",
        "worker",
        "control",
        "config",
        "placement",
        "commands",
        "cli",
    },
    "config": {"pool", "frontend", "router", "supervisor", "worker", "control", "commands"},
}
# Leaf modules: the vllm_sr modules each may import at all.
LEAVES: dict[str, set[str]] = {
    "wire": {"errors"},
    "plan": {"jsontypes"},
    "jsontypes": set(),
    "errors": set(),
    "clock": set(),
    "heap": set(),
}


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                for inner in ast.walk(child):
                    if hasattr(inner, "lineno"):
                        lines.add(inner.lineno)
    return lines


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, the vllm_sr module) of every import in the file that runs."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "vllm_sr":  # from vllm_sr import wire, errors
                found += [(node.lineno, f"vllm_sr.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, node.module))
    return [(line, name) for line, name in found if name.startswith("vllm_sr.")]


def top_of(path: Path) -> str:
    return path.relative_to(ROOT).with_suffix("").parts[0]


def violations() -> list[str]:
    out: list[str] = []
    for path in sorted(ROOT.rglob("*.py")):
        top = top_of(path)
        for line, name in imports_of(path):
            target = name.split(".")[1]
            if top in FORBIDDEN and target in FORBIDDEN[top]:
                out.append(f"{path.relative_to(ROOT.parent)}:{line} imports {name}")
            if top in LEAVES and target != top and target not in LEAVES[top]:
                out.append(f"{path.relative_to(ROOT.parent)}:{line} imports {name}")
    return out


def test_no_import_runs_back_up() -> None:
    assert violations() == []


def test_the_scan_sees_lazy_imports_and_skips_type_checking_ones(tmp_path: Path) -> None:
    src = tmp_path / "mod.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "from vllm_sr import wire\n"
        "if TYPE_CHECKING:\n"
        "    from vllm_sr.router.chat import ChatRouter\n"
        "def f():\n"
        "    import vllm_sr.supervisor.service\n"
    )
    assert imports_of(src) == [(2, "vllm_sr.wire"), (6, "vllm_sr.supervisor.service")]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_each_ruled_package_exists(package: str) -> None:
    """A renamed package would leave its rule judging nothing."""
    assert (ROOT / package).exists() or (ROOT / f"{package}.py").exists()
