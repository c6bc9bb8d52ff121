"""The dashboard's one seam to the service: a small async interface over the control API,
implemented with ``vllm_sr.control.client.AsyncControlClient``. The app sees two failure
kinds only: ``Disconnected`` (retry with backoff) and ``ActionRefused`` (show the reason)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from vllm_sr.control.client import AsyncControlClient
from vllm_sr.errors import DeadlineExceeded, ServiceNotRunning, VllmSrError

DEFAULT_SOCKET = "/run/vllm-sr/control.sock"


class Disconnected(Exception):
    """The service cannot be reached (no socket, refused, reset, timed out)."""


class ActionRefused(Exception):
    """The service answered a mutation with an error: shown to the user as is."""

    def __init__(self, message: str, status: int = 0, code: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


class ControlApi(Protocol):
    async def health(self) -> dict[str, Any]: ...

    async def inventory(self) -> dict[str, Any]: ...

    async def events(self, since: int) -> dict[str, Any]: ...

    def stream_events(self, since: int) -> AsyncIterator[dict[str, Any]]: ...

    async def act(self, verb: str, replica: str) -> dict[str, Any]: ...

    async def close(self) -> None: ...


def permission_from_health(health: dict[str, Any]) -> str | None:
    """Why the caller may only read, or None when it may act (or the server does not say,
    in which case the first refused action tells us)."""
    caller = health.get("caller")
    if isinstance(caller, dict) and caller.get("may_mutate") is False:
        return str(caller.get("why") or "the service lets this user read only")
    return None


READ_TIMEOUT_S = 10.0
# A mutation answers once applied: a drain waits for in-flight requests, a restart for the
# new worker. The screen does not wait on it (it runs in a worker), so allow it time.
ACTION_TIMEOUT_S = 300.0


def connect(socket: str) -> ControlApi:
    return ClientApi(
        AsyncControlClient(socket, timeout_s=READ_TIMEOUT_S),
        AsyncControlClient(socket, timeout_s=ACTION_TIMEOUT_S),
    )


class ClientApi:
    """``ControlApi`` over the control API's own async client (one for reads, one with a
    longer timeout for actions)."""

    def __init__(self, client: AsyncControlClient, actions: AsyncControlClient) -> None:
        self.client = client
        self.actions = actions

    async def _read(self, call: Any) -> dict[str, Any]:
        try:
            result: dict[str, Any] = await call
        except VllmSrError as exc:
            # Any failed read leaves the screen stale; the banner says why and we retry.
            raise Disconnected(exc.message) from exc
        return result

    async def health(self) -> dict[str, Any]:
        return await self._read(self.client.health())

    async def inventory(self) -> dict[str, Any]:
        return await self._read(self.client.inventory())

    async def events(self, since: int) -> dict[str, Any]:
        return await self._read(self.client.events(since=since))

    async def stream_events(self, since: int) -> AsyncIterator[dict[str, Any]]:
        try:
            async for event in self.client.stream_events(since=since):
                yield event
        except VllmSrError as exc:
            raise Disconnected(exc.message) from exc

    async def act(self, verb: str, replica: str) -> dict[str, Any]:
        if verb not in ("drain", "eject", "readmit", "restart"):
            raise ValueError(f"verb: {verb!r} is not one of drain, eject, readmit, restart")
        try:
            result: dict[str, Any] = await getattr(self.actions, verb)(replica)
        except (ServiceNotRunning, DeadlineExceeded) as exc:
            raise Disconnected(exc.message) from exc
        except VllmSrError as exc:
            raise ActionRefused(exc.message, exc.http_status, exc.code) from exc
        return result

    async def close(self) -> None:
        await self.client.close()
        await self.actions.close()
