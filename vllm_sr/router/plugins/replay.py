"""The ``router_replay`` plugin: a bounded record, per decision, of the chats it routed (what
upstream's router replay keeps: a request summary, the signals, the decision, the model, the
status and latency, and the bodies cut to ``max_body_bytes``), in the router's memory, read
through the control API (``GET /v1/replay``, ``vllm-sr ctl replay [--decision D]
[--follow]``). Each recorded answer carries ``x-vsr-replay-id``.

Records live per decision in a ring of ``max_records``; every record has a service-wide
``seq`` so a reader can ask for what came after the last one it saw (``--follow`` polls)."""

from __future__ import annotations

import itertools
import time
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_sr.config.routing_plugins import RouterReplayPlugin

H_REPLAY_ID = "x-vsr-replay-id"
MAX_LIST = 1000  # records one read returns at most


def cut(raw: bytes, limit: int) -> tuple[str, bool]:
    """The first ``limit`` bytes as text, and whether anything was cut."""
    return raw[:limit].decode("utf-8", "replace"), len(raw) > limit


class ReplayTap:
    """The backends' answer tap for replay: the status and the first ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.status: int | None = None
        self.body = bytearray()
        self.size = 0
        self.finished = False

    def whole(self, status: int, body: bytes) -> None:
        self.status, self.size, self.finished = status, len(body), True
        self.body = bytearray(body[: self.limit])

    def chunk(self, data: bytes) -> None:
        self.status = 200
        self.size += len(data)
        room = self.limit - len(self.body)
        if room > 0:
            self.body += data[:room]

    def finish(self) -> None:
        self.finished = True


class TeeTap:
    """Several taps as one."""

    def __init__(self, *taps: Any) -> None:
        self.taps = [t for t in taps if t is not None]

    def whole(self, status: int, body: bytes) -> None:
        for t in self.taps:
            t.whole(status, body)

    def chunk(self, data: bytes) -> None:
        for t in self.taps:
            t.chunk(data)

    def finish(self) -> None:
        for t in self.taps:
            t.finish()


@dataclass
class ReplayLog:
    """Every decision's ring of records (kept across config reloads, like the counters)."""

    rings: dict[str, deque[dict[str, Any]]] = field(default_factory=dict)
    seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    last_seq: int = 0

    def new_id(self) -> str:
        return uuid.uuid4().hex

    def record(
        self,
        plugin: RouterReplayPlugin,
        *,
        replay_id: str,
        decision: str,
        recipe: str,
        selected_model: str,
        answered_by: str | None,
        matched_signals: tuple[str, ...],
        body: bytes,
        stream: bool,
        status: int,
        latency_ms: float,
        path: str,
        response: ReplayTap | None,
        fallbacks: list[tuple[str, str]] | None = None,
        response_body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        self.last_seq = next(self.seq)
        rec: dict[str, Any] = {
            "seq": self.last_seq,
            "id": replay_id,
            "time": time.time(),
            "recipe": recipe,
            "decision": decision,
            "selected_model": selected_model,
            "model": answered_by,
            "matched_signals": list(matched_signals),
            "stream": stream,
            "status": status,
            "latency_ms": round(latency_ms, 3),
            "response_path": path,
            "backend_fallbacks": [f"{m}:{r}" for m, r in fallbacks or []],
            "request_bytes": len(body),
        }
        if plugin.capture_request_body:
            rec["request_body"], rec["request_truncated"] = cut(body, plugin.max_body_bytes)
        if plugin.capture_response_body:
            raw = bytes(response.body) if response is not None else (response_body or b"")
            size = response.size if response is not None else len(raw)
            rec["response_body"] = raw[: plugin.max_body_bytes].decode("utf-8", "replace")
            rec["response_truncated"] = size > plugin.max_body_bytes
            rec["response_bytes"] = size
        ring = self.rings.get(decision)
        if ring is None or ring.maxlen != plugin.max_records:
            ring = deque(ring or (), maxlen=plugin.max_records)
            self.rings[decision] = ring
        ring.append(rec)
        return rec

    def read(self, decision: str | None = None, since: int = 0) -> dict[str, Any]:
        """Records after ``since`` (oldest first, at most MAX_LIST), of one decision or all."""
        rings = [self.rings.get(decision, deque())] if decision else list(self.rings.values())
        found = sorted((r for ring in rings for r in ring if r["seq"] > since), key=_seq)
        return {
            "records": found[:MAX_LIST],
            "last_seq": self.last_seq,
            "decisions": sorted(self.rings),
        }


def _seq(rec: dict[str, Any]) -> int:
    return int(rec["seq"])
