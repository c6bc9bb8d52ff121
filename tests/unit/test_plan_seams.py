"""The neutral plan module and the one-writer rule of replica state (issue 27): what importing
a seam pulls in, checked in a fresh interpreter per import (a module cached by another test
cannot hide one), and that no module outside the pool writes a field of the pool's records."""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from vllm_sr.pool.replica import Replica

PACKAGE = Path(__file__).resolve().parents[2] / "vllm_sr"


def _loaded_after(module: str) -> list[str]:
    code = (
        f"import {module}, sys, json; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('vllm_sr', 'numpy', 'pydantic', 'torch'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def test_importing_the_plan_module_pulls_in_nothing_of_the_package() -> None:
    assert _loaded_after("vllm_sr.plan") == ["vllm_sr", "vllm_sr.jsontypes", "vllm_sr.plan"]


def test_importing_the_chat_mount_loads_no_router_until_router_mode_is_on() -> None:
    loaded = _loaded_after("vllm_sr.frontend.chat_mount")
    assert not [m for m in loaded if m.startswith("vllm_sr.router") or m == "numpy"], loaded


RECORD_FIELDS = {f.name for f in dataclasses.fields(Replica)}


def _is_record(node: ast.expr) -> bool:
    """``x.record`` or ``pool.replica(rid)``: an expression that is a pool record."""
    if isinstance(node, ast.Attribute) and node.attr == "record":
        return True
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "replica"
    )


def _record_writes(source: str) -> list[int]:
    """Lines of ``source`` that assign a pool record's field."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(t, ast.Attribute) and t.attr in RECORD_FIELDS and _is_record(t.value):
                    found.append(node.lineno)
    return found


def test_no_module_outside_the_pool_writes_a_pool_record() -> None:
    """The pool is the one writer of its records (docs/internals.md, "Replica state"):
    elsewhere a record's field is told to the pool through its methods."""
    outside = [p for p in PACKAGE.rglob("*.py") if "pool" not in p.relative_to(PACKAGE).parts]
    assert len(outside) > 50  # the walk found the package
    writes = {
        str(p.relative_to(PACKAGE)): lines
        for p in outside
        if (lines := _record_writes(p.read_text()))
    }
    assert writes == {}


def test_the_record_write_check_sees_the_pattern_it_forbids() -> None:
    source = (
        "def f(pool, rep, r):\n"
        "    pool.replica(rep.id).restart_reason = 'x'\n"
        "    rep.record.usage = {}\n"
        "    rep.record.inflight += 1\n"
        "    rep.record.state, rep.record.pid = 'ready', None\n"
        "    rep.state = 'hung'\n"  # the worker's own record: not the pool's
        "    r.last_error = None\n"  # not reached through a record: not matched
    )
    assert _record_writes(source) == [2, 3, 4, 5, 5]
