"""Fixtures of the dashboard's tests: a real control server with a fake backend behind it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.tui.harness import LiveControl, make_backend
from vllm_sr.clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def live(socket_dir: Path, clock: FakeClock) -> AsyncIterator[LiveControl]:
    """Two deployments: primary (3 CPU replicas) and classifier (1)."""
    backend = make_backend(clock, {"primary": ["cpu", "cpu", "cpu"], "classifier": ["cpu"]})
    control = LiveControl(backend, socket_dir / "control.sock")
    await control.start()
    try:
        yield control
    finally:
        await control.stop()
