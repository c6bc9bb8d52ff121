"""sd_notify for the service: readiness, status, reload/stop, start-timeout extension and the
watchdog. Every method is a no-op when the process was not started by systemd with
``NOTIFY_SOCKET`` (a developer's shell, tests, containers without systemd).

The datagram itself is sent by the ``sdnotify`` package (``_Channel`` below). What it cannot do
is wrapped around it: ``sdnotify.SystemdNotifier()`` reads ``os.environ`` itself (tests and the
supervisor hand an env in), connects once in its constructor and, when that fails (systemd not
there yet, or restarting), stays silent for the rest of the process; and it encodes with
latin-1. So the address is resolved here from the given env, the socket is (re)connected on the
next message after a failure, the text goes out as UTF-8, and the watchdog (interval, pid check,
pings from the event loop) is ours: sdnotify has none.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Mapping

import sdnotify

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.jsontypes import JsonObject, json_int, json_object

log = logging.getLogger("vllm_sr.supervisor.systemd")


def _socket_address(raw: str) -> str | None:
    """The sd_notify address: a filesystem path, or '@name' for the abstract namespace."""
    if raw.startswith("@"):
        return "\0" + raw[1:]
    if raw.startswith("/"):
        return raw
    return None  # vsock and other forms are not used for a host service


class _Channel(sdnotify.SystemdNotifier):
    """sdnotify's notifier on an address given to it, reconnecting after a failure.

    Its constructor is not called (it would read ``os.environ`` and connect once, for good);
    the fields its ``notify`` uses are set here, with ``debug`` on so a send error reaches
    ``send`` (which the caller logs) instead of being swallowed."""

    def __init__(self, address: str) -> None:
        self.debug = True
        self.socket: socket.socket | None = None
        self.address = address

    def send(self, text: str) -> None:
        """One datagram; raises OSError. A socket that fails is dropped and the message tried
        once more on a fresh one (systemd re-executed binds a new socket at the same path)."""
        for attempt in (1, 2):
            fresh = self.socket is None
            if self.socket is None:
                self.socket = self._connect()
            try:
                # sdnotify encodes latin-1; these characters are the UTF-8 bytes, sent as they are.
                self.notify(text.encode().decode("latin-1"))
                return
            except OSError:
                self.close()
                if fresh or attempt == 2:
                    raise

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            sock.connect(self.address)
        except OSError:
            sock.close()
            raise
        return sock

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close()
            self.socket = None


class SystemdNotifier:
    """Talks to systemd's notification socket named by ``env["NOTIFY_SOCKET"]`` (a path or
    ``@abstract``). A send failure is logged once per run of failures, never raised into the
    supervisor loop."""

    def __init__(self, env: Mapping[str, str] = os.environ, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._env = env
        address = _socket_address(env.get("NOTIFY_SOCKET", ""))
        self._channel = _Channel(address) if address is not None else None
        self._last_status: str | None = None
        self._send_failed = False
        self.enabled = self._channel is not None

    def _send(self, *lines: str) -> None:
        if self._channel is None:
            return
        try:
            self._channel.send("\n".join(lines))
            self._send_failed = False
        except OSError as exc:
            # systemd may be restarting; the next message retries. Log only the first failure
            # of a run so a missing socket does not flood the journal.
            if not self._send_failed:
                log.warning("sd_notify to %s failed: %s", self._env.get("NOTIFY_SOCKET"), exc)
            self._send_failed = True

    def ready(self, status: str | None = None) -> None:
        """READY=1 (and STATUS= when given): the first one ends `systemctl start`, a later
        one ends a reload."""
        if status is None:
            self._send("READY=1")
            return
        self._last_status = status
        self._send("READY=1", f"STATUS={status}")

    def status(self, text: str) -> None:
        """STATUS=text, sent only when it differs from the last status sent."""
        if text == self._last_status:
            return
        self._last_status = text
        self._send(f"STATUS={text}")

    def reloading(self) -> None:
        """RELOADING=1 with the CLOCK_MONOTONIC timestamp systemd >= 253 asks for."""
        usec = int(self._clock.monotonic() * 1_000_000)
        self._send("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def stopping(self) -> None:
        self._send("STOPPING=1")

    def extend_timeout(self, seconds: float) -> None:
        """Ask for `seconds` more before TimeoutStartSec/TimeoutStopSec fire (model loads)."""
        if seconds <= 0:
            return
        self._send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}")

    def watchdog_interval(self) -> float | None:
        """Seconds between pings: half of WATCHDOG_USEC, or None when the watchdog is off or
        meant for another process (WATCHDOG_PID names a different pid)."""
        if not self.enabled:
            return None
        pid = self._env.get("WATCHDOG_PID")
        if pid is not None and pid.strip() != str(os.getpid()):
            return None
        try:
            usec = int(self._env.get("WATCHDOG_USEC", ""))
        except ValueError:
            return None
        if usec <= 0:
            return None
        return usec / 2_000_000

    def watchdog_ping(self) -> None:
        self._send("WATCHDOG=1")

    async def run_watchdog(self) -> None:
        """Ping from the event loop itself: a stalled loop stops the pings and systemd
        restarts the service; a busy worker process does not (it has its own loop)."""
        interval = self.watchdog_interval()
        if interval is None:
            return
        while True:
            self.watchdog_ping()
            await asyncio.sleep(interval)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _objects(value: object) -> list[JsonObject]:
    """The JSON objects of a list (anything else in it, or a non-list, counts as nothing)."""
    if not isinstance(value, list):
        return []
    return [obj for item in value if (obj := json_object(item)) is not None]


def _deployment_line(dep: Mapping[str, object]) -> str:
    replicas = _objects(dep.get("replicas"))
    ready = dep.get("ready_replicas")
    if ready is None:
        ready = sum(1 for r in replicas if r.get("ready"))
    desired = dep.get("desired_replicas")
    if desired is None:
        desired = len(replicas)
    ejected = dep.get("ejected_replicas")
    if ejected is None:
        ejected = sum(1 for r in replicas if r.get("state") == "ejected")
    restarts = sum(json_int(r.get("restarts")) or 0 for r in replicas)
    name = dep.get("name", "?")
    return f"{name}: {ready}/{desired} ready, {ejected} ejected, {_plural(restarts, 'restart')}"


def status_line(inventory: Mapping[str, object]) -> str:
    """One STATUS= line from the inventory document, e.g.
    "primary: 2/2 ready, 0 ejected, 1 restart"; deployments joined by '; '."""
    deployments = _objects(inventory.get("deployments"))
    if not deployments:
        return "no deployments"
    return "; ".join(_deployment_line(d) for d in deployments)
