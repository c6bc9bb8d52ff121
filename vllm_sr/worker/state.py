"""What the worker's HTTP handlers read: the worker's state (``WorkerState``, which ``main``
and ``startup`` move along), one request's Server-Timing marks (``Timing``), and the
``/health`` body built from the state (what the pool and the supervisor read).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from vllm_sr import wire
from vllm_sr.worker import surfaces
from vllm_sr.worker.classify import CentroidCache
from vllm_sr.worker.engine import Engine
from vllm_sr.worker.engine_types import Faults, Limits
from vllm_sr.worker.metrics import WorkerMetrics
from vllm_sr.worker.result_cache import ResultCache
from vllm_sr.worker.threads import ThreadPolicy

# The handlers' logger: status changes read in the log as they did from the API module.
log = logging.getLogger("vllm_sr.worker.api")

API_VERSION = "1"
DEFAULT_MAX_BODY = wire.MAX_BODY_BYTES
DEFAULT_READ_TIMEOUT_S = 30.0


@dataclass
class WorkerState:
    """Everything the handlers read; main and startup move ``status`` along and fill the rest."""

    artifact: str
    device: str
    threads: int
    policy: ThreadPolicy
    metrics: WorkerMetrics = field(default_factory=WorkerMetrics)
    faults: Faults = field(default_factory=Faults)
    status: str = "starting"
    reason: str | None = "the worker is starting"
    replica_id: str | None = None
    served_names: frozenset[str] = frozenset()
    limits: Limits | None = None
    limit_source: dict[str, str] = field(default_factory=dict)
    engine: Engine | None = None
    view: surfaces.ModelView | None = None
    card: dict[str, Any] = field(default_factory=dict)
    centroids: CentroidCache = field(default_factory=CentroidCache)
    result_cache: ResultCache = field(default_factory=lambda: ResultCache(0))
    revision: str | None = None  # what the worker loaded (set at load; part of cache keys)
    capabilities: dict[str, Any] | None = None  # surfaces, dimensions, max_length, labels
    max_body: int = DEFAULT_MAX_BODY
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    started_at: float = field(default_factory=time.time)

    def set_status(self, status: str, reason: str | None) -> None:
        self.status = status
        self.reason = reason
        log.info("status %s%s", status, f": {reason}" if reason else "")


class Timing:
    """One request's Server-Timing marks, and the rows it sent to the engine (for metrics)."""

    __slots__ = ("forward", "marks", "rows", "start")

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.marks: dict[str, float] = {}
        self.rows = 0
        self.forward = False  # a forward ran this request's rows

    def lap(self, name: str, since: float) -> float:
        now = time.perf_counter()
        self.marks[name] = self.marks.get(name, 0.0) + (now - since)
        return now

    def header(self) -> str:
        total = time.perf_counter() - self.start
        parts = [f"{k};dur={v * 1000:.3f}" for k, v in self.marks.items()]
        parts.append(f"total;dur={total * 1000:.3f}")
        return ", ".join(parts)


def health_body(state: WorkerState) -> dict[str, Any]:
    return {
        "status": state.status,
        "reason": state.reason,
        "api_version": API_VERSION,
        "model": state.artifact,
        "limits": state.limits.to_json() if state.limits else None,
        "threads": state.threads,
        "adaptive_threads": state.policy.report(),
        "device": state.device,
        "replica_id": state.replica_id,
        "pid": os.getpid(),
        "queue_rows": state.engine.queue_depth if state.engine else 0,
        "forward_running": state.engine.busy if state.engine else False,
        "revision": state.revision,
        "capabilities": state.capabilities,
        "result_cache_bytes": state.result_cache.max_bytes,
        "forward_running_s": round(state.engine.forward_running_s, 3) if state.engine else 0.0,
        "forward_costs": state.engine.costs.to_json() if state.engine else None,
        "forward_tokens": (
            state.engine.forming_limits.max_num_batched_tokens if state.engine else None
        ),
    }
