"""vllm-sr-top's data side: one refresh of the inventory (and, on connecting, of the caller's
permission), the poll loop with its reconnect backoff, and the event stream, replayed from the
service's ring after a break. ``VllmSrTop`` mixes it in (its attributes are set in
``VllmSrTop.__init__``); the rendering it calls stays in ``app``."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from vllm_sr.backoff import Backoff
from vllm_sr.clock import Clock
from vllm_sr_top.model import DecisionRates, ThroughputHistory
from vllm_sr_top.source import ControlApi, Disconnected, permission_from_health
from vllm_sr_top.widgets import EventsPane

if TYPE_CHECKING:
    from textual.app import App

    _AppBase = App[None]
else:
    _AppBase = object

EVENT_BACKLOG = 50


class Polling(_AppBase):
    """The poll loop and the event stream of :class:`~vllm_sr_top.app.VllmSrTop`."""

    api: ControlApi
    interval: float
    clock: Clock
    backoff: Backoff
    attempts: int
    inventory: dict[str, Any] | None
    history: ThroughputHistory
    decisions: DecisionRates
    paused: bool
    connected: bool
    read_only: str | None
    polls: int
    last_error: str
    retry_at: float | None
    events_pane: EventsPane
    _identity: tuple[Any, Any] | None
    _wake: asyncio.Event
    _online: asyncio.Event

    if TYPE_CHECKING:

        def say(self, text: str, kind: str = "info") -> None: ...

        async def _render_all(self) -> None: ...

        def _render_banner(self) -> None: ...

        def _render_header(self) -> None: ...

    async def _poll_loop(self) -> None:
        while True:
            if not self.paused:
                try:
                    delay = await self.poll_once()
                except Exception as exc:  # a bug or a malformed document: keep the loop alive
                    self.log.error("refresh failed", exc)
                    self.say(f"could not show the inventory: {exc!r}", "error")
                    delay = None
                if delay is not None:
                    await self._wait(delay)
                    continue
            await self._wait(self.interval)

    async def _wait(self, seconds: float) -> None:
        """Sleeps ``seconds`` or until something asks for a refresh now."""
        # Cleared after waking, so a request made while a poll was running is not lost.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)
        self._wake.clear()

    def refresh_now(self) -> None:
        self._wake.set()

    async def poll_once(self) -> float | None:
        """One refresh. Returns the retry delay when the service cannot be reached."""
        try:
            if not self.connected:
                health = await self.api.health()
                if "caller" in health:  # else what a 403 taught us stands
                    self.read_only = permission_from_health(health)
            asked_at = self.clock.time()  # the counters are at least this recent
            inventory = await self.api.inventory()
        except Disconnected as exc:
            return self._went_away(str(exc))
        service = inventory.get("service", {})
        identity = (service.get("pid"), service.get("started_at"))
        if self._identity is not None and identity != self._identity:
            # A new service process numbers its events from 1 again.
            self.events_pane.restarted()
        self._identity = identity
        self.connected = True
        self._online.set()
        self.backoff.reset()
        self.attempts = 0
        self.retry_at = None
        self.inventory = inventory
        self.history.record(inventory)
        # Rates move with each new inventory only: a render between polls (the 1 s tick, a
        # key) shows the last rates instead of reading unchanged counters as no decisions.
        self.decisions.update(inventory.get("router"), asked_at)
        await self._render_all()
        self.polls += 1
        return None

    def _went_away(self, reason: str) -> float:
        self.connected = False
        self._online.clear()
        self.last_error = reason
        delay = self.backoff.next_delay()
        self.attempts += 1
        self.retry_at = self.clock.monotonic() + delay
        self._render_banner()
        self._render_header()
        return delay

    async def _event_loop(self) -> None:
        """Follows the event stream; after a break, replays what it missed from the ring."""
        pane = self.events_pane
        retry = Backoff(self.backoff.initial_s, self.backoff.max_s)
        while True:
            await self._online.wait()
            seen = pane.last_seq
            try:
                await self._catch_up(pane)
                # The stream replays what came after last_seq, so a reconnect loses nothing
                # that is still in the service's ring.
                async for event in self.api.stream_events(pane.last_seq):
                    if isinstance(event.get("seq"), int):
                        pane.add_event(event)
            except Disconnected:
                pass
            except Exception as exc:  # a malformed line must not end the pane for good
                self.log.error("event stream failed", exc)
            if pane.last_seq != seen:
                retry.reset()
            # Let the poll loop confirm (and own the backoff of) an outage. A stream that
            # breaks while the service answers is retried on a backoff of its own, so it
            # cannot spin.
            self._online.clear()
            self.refresh_now()
            await asyncio.sleep(retry.next_delay())

    async def _catch_up(self, pane: EventsPane) -> None:
        body = await self.api.events(pane.last_seq)
        if int(body.get("last_seq") or 0) < pane.last_seq:
            # Sequence numbers went back: a new service process the inventory has not shown
            # yet. Start over from its ring.
            pane.restarted()
            body = await self.api.events(0)
        # A fresh screen shows the recent past, not the whole ring.
        for event in list(body.get("events", []))[-EVENT_BACKLOG:]:
            pane.add_event(event)
