"""The ``router_replay`` plugin: a record of each chat a decision routed (upstream's record
fields: a request summary, the signals, the decision, the model, the status and latency, and
the bodies cut to ``max_body_bytes``), kept by ``global.services.router_replay``'s store
(memory, redis or postgres: vllm_sr/router/replay/) and read through the control API
(``GET /v1/replay``, ``vllm-sr ctl replay [--decision D] [--follow]``). Each recorded answer
carries ``x-vsr-replay-id``.

A decision records when its plugin says ``enabled: true``, or says nothing and
``global.services.router_replay.enabled`` is true (upstream's layering, :func:`effective`).
Every record has a store-wide ``seq`` so a reader can ask for what came after the last one it
saw (``--follow`` polls)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, NotRequired, TypedDict, Unpack

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.config.router_replay import RouterReplayPlugin
from vllm_sr.jsontypes import JsonObject
from vllm_sr.router.replay import build_writer
from vllm_sr.router.replay.store import MemoryReplayStore, Record, ReplayQuery, iso
from vllm_sr.router.replay.writer import ReplayWriter

if TYPE_CHECKING:
    from vllm_sr.config.router_replay import RouterReplay
    from vllm_sr.router.backend_proxy import AnswerTap

H_REPLAY_ID = "x-vsr-replay-id"
GLOBAL_DEFAULT = RouterReplayPlugin(enabled=True)  # upstream's plugin defaults


def effective(plugin: RouterReplayPlugin | None, global_enabled: bool) -> RouterReplayPlugin | None:
    """The replay settings a decision runs with (None: it records nothing)."""
    if plugin is None:
        return GLOBAL_DEFAULT if global_enabled else None
    enabled = plugin.enabled if plugin.enabled is not None else global_enabled
    return plugin if enabled else None


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

    def __init__(self, *taps: AnswerTap | None) -> None:
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


class ChatFacts(TypedDict):
    """What :meth:`ReplayLog.build` records of one chat (its keyword arguments)."""

    replay_id: str
    decision: str
    recipe: str
    original_model: str | None
    selected_model: str
    answered_by: str | None
    matched_signals: tuple[str, ...]
    body: bytes
    stream: bool
    status: int
    latency_ms: float
    path: str
    response: ReplayTap | None
    fallbacks: NotRequired[list[tuple[str, str]] | None]
    response_body: NotRequired[bytes | None]
    session: NotRequired[Mapping[str, object] | None]


class ReplayLog:
    """Builds each record and hands it to the writer (kept across config reloads while the
    store settings stay the same, like the counters)."""

    def __init__(self, writer: ReplayWriter | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        self.writer = writer if writer is not None else ReplayWriter(MemoryReplayStore(0, clock))
        self.clock = clock

    @classmethod
    def from_config(cls, conf: RouterReplay | None, clock: Clock = SYSTEM_CLOCK) -> ReplayLog:
        """For ``global.services.router_replay`` (None: the memory store, no TTL)."""
        return cls(build_writer(conf, clock), clock)

    def new_id(self) -> str:
        return uuid.uuid4().hex

    def build(
        self,
        plugin: RouterReplayPlugin,
        *,
        replay_id: str,
        decision: str,
        recipe: str,
        original_model: str | None,
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
        session: Mapping[str, object] | None = None,
    ) -> Record:
        """One record, upstream's field names where upstream has the field (``timestamp`` is
        when the chat arrived; ``duration_ms`` until its answer was complete)."""
        rec: Record = {
            "id": replay_id,
            "timestamp": iso(self.clock.time() - latency_ms / 1000.0),
            "recipe": recipe,
            "decision": decision,
            "original_model": original_model,
            "selected_model": selected_model,
            "model": answered_by,
            "signals": signals_by_family(matched_signals),
            "streaming": stream,
            "response_status": status,
            "duration_ms": round(latency_ms),
            "lifecycle_state": "completed" if status < 400 else "failed",
            "from_cache": path == "cache",
            "response_path": path,
            "backend_fallbacks": [f"{m}:{r}" for m, r in fallbacks or []],
            "request_bytes": len(body),
            **(session or {}),  # session_id, turn_index (vllm_sr/router/replay/session.py)
        }
        if plugin.capture_request_body:
            rec["request_body"], rec["request_body_truncated"] = cut(body, plugin.max_body_bytes)
        if plugin.capture_response_body:
            raw = bytes(response.body) if response is not None else (response_body or b"")
            size = response.size if response is not None else len(raw)
            rec["response_body"] = raw[: plugin.max_body_bytes].decode("utf-8", "replace")
            rec["response_body_truncated"] = size > plugin.max_body_bytes
            rec["response_bytes"] = size
        return rec

    async def record(self, plugin: RouterReplayPlugin, **fields: Unpack[ChatFacts]) -> Record:
        """Build the record and keep it (a store that cannot keep it counts it lost)."""
        rec = self.build(plugin, **fields)
        await self.writer.write(rec, plugin.max_records)
        return rec

    async def read(
        self,
        decision: str | None = None,
        since: int = 0,
        recipe: str | None = None,
        session: str | None = None,
    ) -> JsonObject:
        """Records after ``since`` (oldest first, at most ``store.MAX_LIST``), of one decision,
        recipe (two recipes may each have a decision of one name) and/or session, or all; raises
        StoreUnavailable while the store is down."""
        query = ReplayQuery(decision=decision, since=since, recipe=recipe, session=session)
        records, last, decisions = await self.writer.read(query)
        return {"records": records, "last_seq": last, "decisions": decisions}

    async def get(self, record_id: str) -> Record | None:
        """One record by its id (None: unknown or expired); raises StoreUnavailable while the
        store is down."""
        return await self.writer.get(record_id)

    async def append_outcome(self, record_id: str, outcome: Record) -> bool:
        """Add an outcome verdict to the record's ``outcomes`` (False: no such record)."""
        return await self.writer.append_outcome(record_id, outcome)

    async def close(self) -> None:
        await self.writer.close()


def signals_by_family(matched: tuple[str, ...]) -> dict[str, list[str]]:
    """``("keyword:code", "domain:math")`` -> upstream's ``{"keyword": ["code"], ...}``."""
    out: dict[str, list[str]] = {}
    for sig in matched:
        family, _, name = sig.partition(":")
        out.setdefault(family, []).append(name)
    return out
