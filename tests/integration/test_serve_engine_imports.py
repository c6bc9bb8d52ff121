"""Lazy Router mode in the real process: `vllm-sr serve -e` (the stand-in worker) serves and
answers chat with its typed 404 without ever loading numpy (which every router module needs),
read from the process's own memory map. tests/unit/test_frontend_imports.py checks the modules
in fresh interpreters; this checks the whole serve path as the command runs it."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from tests.integration.test_serve import serve

pytestmark = pytest.mark.slow


def mapped_files(pid: int) -> set[str]:
    """The files a process has mapped (its shared libraries among them)."""
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {parts[-1] for parts in (line.split() for line in lines) if parts[-1].startswith("/")}


async def test_engine_mode_serve_never_loads_numpy(tmp_path: Path) -> None:
    async with serve(tmp_path, 1) as served:
        async with aiohttp.ClientSession() as s:
            body = {"model": "primary", "messages": [{"role": "user", "content": "hi"}]}
            async with s.post(served.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 404
                assert (await r.json())["error"]["code"] == "engine_mode"
        files = mapped_files(served.proc.pid)
    assert any("httptools" in f for f in files)  # the map is read: the HTTP parser is there
    assert [f for f in files if "numpy" in f] == []
