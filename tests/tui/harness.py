"""The dashboard's test rig: the REAL control server (vllm_sr.control.server) on a real Unix
socket, with the test FakeBackend (the real pool and event bus) behind it, so the app speaks
the real protocol and sees the real inventory.

``LiveControl`` runs in the test's own event loop (Pilot tests); ``ServerThread`` runs one on a
loop of its own, for the synchronous snapshot fixture, which runs the app with ``App.run``."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from textual.pilot import Pilot
from vllm_sr_top.app import VllmSrTop
from vllm_sr_top.source import connect

from tests.support.control_fake import FakeBackend
from vllm_sr.backoff import Backoff
from vllm_sr.clock import FakeClock
from vllm_sr.control.auth import AccessPolicy, Peer
from vllm_sr.control.server import ControlServer
from vllm_sr.errors import Forbidden

T = TypeVar("T")
HOST = "gpu-host-1"
DISPLAY_SOCKET = "/run/vllm-sr/control.sock"


class FixedHostBackend(FakeBackend):
    """The fake backend, reporting a fixed host name so screens do not depend on the machine."""

    def inventory(self) -> dict[str, Any]:
        inventory = super().inventory()
        inventory["service"]["host"] = HOST
        return inventory


class ReadOnlyPolicy(AccessPolicy):
    """Refuses every mutation the way the real policy refuses a non-admin user. Tests run as
    root, whom the real policy always lets through; the tmux test covers a real second uid."""

    def check_mutation(self, peer: Peer) -> None:
        raise Forbidden(
            f"{peer.describe()} may read but not change the service: it is not root, not the "
            "service user, and not in the admin group 'vllm-sr-admin'"
        )


def make_backend(
    clock: FakeClock,
    deployments: Mapping[str, Sequence[str]] | None = None,
) -> FixedHostBackend:
    backend = FixedHostBackend(deployments or {"primary": ["cpu", "cpu"]}, clock=clock)
    # An hour and a bit of service uptime, on the fake clock.
    clock.advance(3725)
    return backend


def load(backend: FakeBackend, seed: int = 0) -> None:
    """Deterministic traffic figures on every replica."""
    for i, rid in enumerate(backend.replica_ids()):
        k = i + seed
        backend.set_traffic(
            rid,
            inflight=(k * 7) % 33,
            outstanding_bytes=1500 * k,
            requests=100 * k,
            requests_per_s=10.0 + k,
            latency_p50_ms=3.0 + k,
            latency_p99_ms=40.0 + 3 * k,
        )
        backend.replica(rid).threads = 2


def make_app(
    socket: Path,
    clock: FakeClock,
    *,
    interval: float = 3600.0,
    backoff: Backoff | None = None,
    display_socket: str | None = None,
) -> VllmSrTop:
    """The app on the real client for ``socket``. A long interval means it polls only when a
    test says so (``poll_once``) or an action asks for a refresh: screens stay deterministic."""
    return VllmSrTop(
        display_socket or str(socket),
        interval,
        api=connect(str(socket)),
        clock=clock,
        tz=dt.UTC,
        backoff=backoff or Backoff(0.05, 0.2),
    )


class LiveControl:
    """A real ControlServer for ``backend`` on ``path``, in the current event loop."""

    def __init__(
        self, backend: FakeBackend, path: Path, policy: AccessPolicy | None = None
    ) -> None:
        self.backend = backend
        self.path = path
        self.policy = policy
        self.server: ControlServer | None = None

    async def start(self) -> None:
        self.server = ControlServer(
            self.backend, self.path, group=None, heartbeat_s=0.5, policy=self.policy
        )
        await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop()
            self.server = None


class ServerThread:
    """A ``LiveControl`` on an event loop in a thread of its own. ``call`` runs a function on
    that loop, so the backend is only ever touched from the thread that serves it."""

    def __init__(self, live: LiveControl) -> None:
        self.live = live
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        self.run(self.live.start())
        return self

    def __exit__(self, *exc: object) -> None:
        self.run(self.live.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    def call(self, fn: Callable[[], T]) -> T:
        async def _call() -> T:
            return fn()

        result: T = self.run(_call())
        return result


async def until(
    pilot: Pilot[Any], condition: Callable[[], bool], what: str, timeout: float = 5.0
) -> None:
    """Lets the app run until ``condition`` holds; fails naming ``what`` after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await pilot.pause(0.02)
