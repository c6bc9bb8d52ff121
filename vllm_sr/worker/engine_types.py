"""The engine's seam types: what a submission is (``Job``) and the limits and fault switches
it runs under (``Limits``, ``Faults``), and what the engine calls out to (a ``Runner`` that
turns token rows into an output matrix, ``EngineMetrics``, ``Deliver``). ``engine`` re-exports
the ones its callers name; nothing here knows about HTTP, torch or the forward thread."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy

from vllm_sr.errors import InvalidRequest, VllmSrError


class Runner(Protocol):
    def forward(self, rows: list[list[int]]) -> numpy.ndarray:
        """One output row per input row (same order)."""
        ...


@dataclass(frozen=True)
class Limits:
    max_num_seqs: int
    max_num_batched_tokens: int

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidRequest(f"{name}: {value!r} is not a positive integer")

    def to_json(self) -> dict[str, int]:
        return {
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
        }


class ForwardFailed(VllmSrError):
    code = "internal_error"
    http_status = 500


class Job:
    """One submission: its rows, where their outputs go, and when things happened."""

    __slots__ = (
        "deadline",
        "done_at",
        "error",
        "first_forward_at",
        "n_rows",
        "on_done",
        "outputs",
        "remaining",
        "rows",
        "submitted_at",
    )

    def __init__(
        self,
        rows: list[list[int]],
        on_done: Callable[[Job], None] | None,
        now: float,
        deadline: float | None = None,
    ) -> None:
        self.rows = rows
        self.deadline = deadline  # on the engine's clock; None: no deadline
        self.n_rows = len(rows)
        self.remaining = len(rows)
        self.on_done = on_done
        self.outputs: numpy.ndarray | None = None
        self.error: VllmSrError | None = None
        self.submitted_at = now
        self.first_forward_at: float | None = None
        self.done_at: float | None = None

    @property
    def queue_s(self) -> float:
        return (self.first_forward_at or self.submitted_at) - self.submitted_at

    def result(self) -> numpy.ndarray:
        if self.error is not None:
            raise self.error
        assert self.outputs is not None
        return self.outputs


class Faults:
    """Fault injection for tests (only when the worker was started with faults enabled)."""

    def __init__(self, enabled: bool = False, forward_delay_s: float = 0.0) -> None:
        self.enabled = enabled
        self.forward_delay_s = forward_delay_s if enabled else 0.0


class EngineMetrics(Protocol):
    def observe_forward(self, rows: int, padded: int, seconds: float) -> None: ...

    def set_queue_depth(self, rows: int) -> None: ...

    def count_deadline_dropped(self, rows: int) -> None: ...


Deliver = Callable[[list[Job]], None]
