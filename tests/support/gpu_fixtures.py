"""The captured GPU tool outputs in shared/fixtures/gpu/ and a fake tool that prints one.

A small executable named rocm-smi / nvidia-smi goes first on PATH, prints a capture and
records the arguments it was called with; the fixtures' bytes are only read."""

from __future__ import annotations

import os
import stat
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = REPO_ROOT.parent / "shared" / "fixtures" / "gpu"
MISSING_REASON = f"GPU fixtures not found at {FIXTURES} (shared/ beside the repo)"


def fake_tool(bin_dir: Path, tool: str, fixture: Path, rc: int = 0) -> None:
    """An executable named like the vendor tool that prints a capture and records its args."""
    script = bin_dir / tool
    script.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$*" > "{bin_dir}/{tool}.args"\ncat "{fixture}"\nexit {rc}\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def env_with(bin_dir: Path, **extra: str) -> dict[str, str]:
    """This process's environment with ``bin_dir`` first on PATH (and ``extra`` set)."""
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", **extra}
