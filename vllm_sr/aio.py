"""The event loop ``serve`` runs on: uvloop (libuv, as uvicorn uses) when installed, else
asyncio's own. The frontend's HTTP loop does per-request Python work on the same cores as the
forwards; uvloop's transports and callbacks cost less of it. (Workers stay on asyncio's loop;
docs/internals.md says why.)"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_name() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on uvloop when it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
