"""Fakes for worker tests that need no torch: a runner whose output encodes its input, a
whitespace tokenizer, and a thread policy that records what the engine told it."""

from __future__ import annotations

import threading
from typing import Any

import numpy


class FakeRunner:
    """Output row i = [len(row), first id, sum of ids, 1.0]; records every forward's rows.
    ``gate`` (when set) holds each forward until released; ``fail_when`` makes a forward
    raise when a row starts with that id."""

    def __init__(self, dims: int = 4) -> None:
        self.dims = dims
        self.forwards: list[list[list[int]]] = []
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.fail_when: int | None = None
        self._lock = threading.Lock()

    def forward(self, rows: list[list[int]]) -> numpy.ndarray:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(30)
        with self._lock:
            self.forwards.append([list(r) for r in rows])
        if self.fail_when is not None and any(r and r[0] == self.fail_when for r in rows):
            raise RuntimeError("scripted failure")
        out = numpy.zeros((len(rows), self.dims), dtype=numpy.float32)
        for i, r in enumerate(rows):
            out[i, 0] = len(r)
            out[i, 1] = r[0] if r else -1
            out[i, 2] = sum(r)
            out[i, 3] = 1.0
        return out


def expected_output(row: list[int], dims: int = 4) -> list[float]:
    values = [float(len(row)), float(row[0] if row else -1), float(sum(row)), 1.0]
    return values + [0.0] * (dims - 4)


class RecordingPolicy:
    """Serves ``threads`` and records threads_for / after_forward calls."""

    def __init__(self, threads: int = 3) -> None:
        self.threads = threads
        self.asked: list[int] = []
        self.after: list[tuple[int, int, float]] = []
        self.reruns: list[Any] = []
        self.rerun_at: int | None = None
        self.golden = False

    def threads_for(self, n_tokens: int) -> int:
        self.asked.append(n_tokens)
        return self.threads

    def golden_passed(self) -> None:
        self.golden = True

    def after_forward(
        self, rows: list[list[int]], output: Any, threads: int, seconds: float, rerun: Any
    ) -> None:
        self.after.append((len(rows), threads, seconds))
        if self.rerun_at is not None:
            self.reruns.append(rerun(self.rerun_at))

    def report(self) -> dict[str, Any] | None:
        return {"mode": "recording", "threads": self.threads}


def word_ids(texts: list[str]) -> list[list[int]]:
    """A whitespace tokenizer: [101, one id per word, 102], ids from the words' lengths."""
    return [[101, *(100 + len(w) for w in t.split()), 102] for t in texts]
