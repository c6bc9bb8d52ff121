"""``GET /v1/events/stream``: one NDJSON subscriber of the event bus. It replays the ring from
``since``, then sends live events and a heartbeat after each quiet ``heartbeat_s``; a reader
that falls ``subscriber_queue`` events behind is told so and dropped, one that takes no bytes
for ``write_timeout_s`` is cut off, and a stopping server ends every stream with a last line."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from vllm_sr.control.protocol import HEARTBEAT, NDJSON, STREAM_CLOSED, STREAM_DROPPED
from vllm_sr.events import Subscription
from vllm_sr.httpserver import Request, StreamResponse

if TYPE_CHECKING:
    from vllm_sr.control.routes import ServerView

log = logging.getLogger("vllm_sr.control")


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), default=str)


class EventStream:
    """One subscriber: ``run()`` answers the request until the reader goes or is dropped."""

    def __init__(self, server: ServerView, request: Request, since: int | None) -> None:
        self.server = server
        self.request = request
        self.since = since
        self.sub: Subscription = server.backend.events.subscribe(server.subscriber_queue)

    def wake(self) -> None:
        """Unblock the reader loop so it sees ``server.closing`` (the queue may be full)."""
        queue = self.sub.queue
        while queue.full():
            queue.get_nowait()
        queue.put_nowait(None)

    async def run(self) -> StreamResponse:
        resp = StreamResponse(200, NDJSON, {"Cache-Control": "no-store"})
        await resp.prepare(self.request)
        last = 0
        if self.since is not None:
            for old in self.server.backend.events.since(self.since):
                if not await self._send(resp, old.to_json()):
                    return resp
                last = old.seq
        while True:
            try:
                event = await asyncio.wait_for(self.sub.get(), self.server.heartbeat_s)
            except TimeoutError:
                line = {"event": HEARTBEAT, "time": self.server.clock.time()}
                if not await self._send(resp, line):
                    return resp
                continue
            if event is None:
                await self._send(resp, self._ending())
                return resp  # the server ends it
            if event.seq <= last:
                continue
            if not await self._send(resp, event.to_json()):
                return resp

    def _ending(self) -> dict[str, Any]:
        if self.server.closing:
            return {"event": STREAM_CLOSED, "reason": "the service is stopping"}
        return {
            "event": STREAM_DROPPED,
            "reason": f"this reader fell {self.server.subscriber_queue} events behind",
        }

    async def _send(self, resp: StreamResponse, obj: dict[str, Any]) -> bool:
        data = (dumps(obj) + "\n").encode()
        try:
            await asyncio.wait_for(resp.write(data), self.server.write_timeout_s)
        except TimeoutError:
            log.warning("control API: dropping an event stream reader that stopped reading")
            if self.request.conn is not None:
                self.request.conn.abort()
            return False
        except ConnectionError:
            return False
        return True
