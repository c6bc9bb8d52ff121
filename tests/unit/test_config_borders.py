"""Config is data: no module of ``vllm_sr.config`` pulls in ``vllm_sr.placement`` (which runs
the GPU tools and reads the CPU budget), and the flag edits and plan rendering that need both
import in one direction only (render -> apply -> planner)."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import vllm_sr.config
import vllm_sr.placement

PACKAGE_DIR = Path(vllm_sr.config.__file__).parent


def _config_modules() -> list[str]:
    return sorted(f"vllm_sr.config.{m.name}" for m in pkgutil.iter_modules([str(PACKAGE_DIR)]))


def test_the_package_has_the_modules_named_in_the_issue() -> None:
    names = _config_modules()
    for wanted in ("schema", "files", "flags", "service"):
        assert f"vllm_sr.config.{wanted}" in names


@pytest.mark.parametrize("module", ["vllm_sr.config", *_config_modules()])
def test_importing_a_config_module_pulls_in_no_placement(module: str) -> None:
    """A fresh interpreter per module: an import cached by another test cannot hide one."""
    code = (
        f"import {module}, sys; "
        "bad = sorted(m for m in sys.modules if m.startswith('vllm_sr.placement')); "
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, f"{module} imports {proc.stdout.strip()} {proc.stderr[-400:]}"


def _imports(path: Path) -> set[str]:
    """Every vllm_sr module a file imports, at any depth (lazy imports count too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vllm_sr"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("vllm_sr"))
    return found


def test_no_config_module_names_placement_even_lazily() -> None:
    """Stronger than sys.modules: a function-level import would escape the test above."""
    offenders = {
        p.name: sorted(m for m in _imports(p) if m.startswith("vllm_sr.placement"))
        for p in PACKAGE_DIR.glob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_render_apply_planner_import_one_way() -> None:
    place = Path(vllm_sr.placement.__file__).parent
    assert "vllm_sr.placement.render" not in _imports(place / "apply.py")
    assert not any(m.startswith("vllm_sr.placement.apply") for m in _imports(place / "planner.py"))
    assert "vllm_sr.placement.apply" in _imports(place / "render.py")
