"""Per-forward thread counts for CPU workers: the per-process ``ThreadContext``, the
``ThreadPolicy`` protocol and the fixed policy (docs/adaptive-threads.md is the long form).

The engine asks a ``ThreadPolicy`` which count to serve each forward at, states that count on
the per-process ``ThreadContext`` for the forward, and hands the policy the served answer
afterwards so that the adaptive policy (``learner.AdaptiveThreads``) can time other counts on
the same input. ``policy.policy_from_env`` picks the policy at startup.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

import numpy

from vllm_sr.errors import ConfigError

ENV_ADAPTIVE = "VLLM_SRUN_CPU_ADAPTIVE_THREADS"
ACCEPTED_MODES = ("0", "1", "2")

Rerun = Callable[[int], numpy.ndarray]


def batch_tokens(rows: list[list[int]]) -> int:
    """The input size a policy buckets on: the padded tokens of the batch
    (rows x longest row), the work the intra-op threads split between them."""
    if not rows:
        return 0
    return len(rows) * max(len(r) for r in rows)


class ThreadPolicy(Protocol):
    def threads_for(self, n_tokens: int) -> int:
        """The count to SERVE a forward of ``n_tokens`` (``batch_tokens(rows)``) at."""
        ...

    def golden_passed(self) -> None:
        """The worker's startup golden check passed; exploration may start."""
        ...

    def after_forward(
        self,
        rows: list[list[int]],
        output: numpy.ndarray,
        threads: int,
        seconds: float,
        rerun: Rerun,
    ) -> None:
        """Called on the forward thread after each served forward (after its answers went
        out). ``rerun(n)`` runs the same forward at ``n`` threads and returns its output."""
        ...

    def report(self) -> dict[str, Any] | None:
        """The ``adaptive_threads`` object for /v1/models, /health and the inventory."""
        ...


class FixedThreads:
    """The configured count, always. What a worker runs without the variable."""

    def __init__(self, configured: int) -> None:
        if configured < 1:
            raise ConfigError(f"threads: {configured} is not a positive integer")
        self.configured = configured

    def threads_for(self, n_tokens: int) -> int:
        return self.configured

    def golden_passed(self) -> None:
        return None

    def after_forward(
        self,
        rows: list[list[int]],
        output: numpy.ndarray,
        threads: int,
        seconds: float,
        rerun: Rerun,
    ) -> None:
        return None

    def report(self) -> dict[str, Any] | None:
        return None


def _torch_get() -> int:
    import torch

    return int(torch.get_num_threads())


def _torch_set(n: int) -> None:
    import torch

    torch.set_num_threads(n)


class ThreadContext:
    """Where each forward states its thread count.

    There is no default count here: every forward says its own, so an engine never runs at a
    count another engine in the process left behind. torch's OpenMP count is per OS thread,
    so engines whose forwards run on different threads each keep theirs; the context sets it
    only when it differs from what the calling thread has (setting it costs a pool resize).
    """

    def __init__(
        self,
        get_threads: Callable[[], int] = _torch_get,
        set_threads: Callable[[int], None] = _torch_set,
    ) -> None:
        self._get = get_threads
        self._set = set_threads
        self._local = threading.local()
        self._lock = threading.Lock()
        self._counts: Counter[int] = Counter()

    @contextmanager
    def forward(self, *, threads: int) -> Iterator[int]:
        if not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads: {threads!r} is not a positive integer")
        # Read before setting: torch's first parallel call on a thread re-initialises that
        # thread's count from the last count set anywhere in the process; reading triggers
        # that initialisation now, so the count set next is the one this forward keeps.
        if self._get() != threads:
            self._set(threads)
        previous = getattr(self._local, "current", None)
        self._local.current = threads
        with self._lock:
            self._counts[threads] += 1
        try:
            yield threads
        finally:
            self._local.current = previous

    @property
    def current(self) -> int | None:
        """The count the forward running on the calling thread stated; None outside one."""
        current: int | None = getattr(self._local, "current", None)
        return current

    def counts(self) -> dict[int, int]:
        """Forwards stated per count since the context was made."""
        with self._lock:
            return dict(self._counts)


_PROCESS_CONTEXT: ThreadContext | None = None
_PROCESS_LOCK = threading.Lock()


def process_context() -> ThreadContext:
    """The one context of this process, shared by every engine in it."""
    global _PROCESS_CONTEXT
    with _PROCESS_LOCK:
        if _PROCESS_CONTEXT is None:
            _PROCESS_CONTEXT = ThreadContext()
        return _PROCESS_CONTEXT


def worker_cpu_budget(**measure: Any) -> int:
    """This worker's CPU budget by the planner's rules (``placement.cpu.measure_cpu_budget``):
    the smallest of its affinity, the cgroup CPU quota and the machine. It bounds the learner's
    allowed counts: affinity alone ignores a container's quota, so 2 configured threads on a
    64-CPU host with a 4-CPU quota would explore up to 64. ``measure`` is for tests."""
    from vllm_sr.placement.cpu import measure_cpu_budget

    return measure_cpu_budget(**measure).cpus


def parse_mode(env: Mapping[str, str]) -> int:
    """0 (off), 1 (learn and report) or 2 (also serve learned counts). Unset or empty is 0."""
    raw = env.get(ENV_ADAPTIVE)
    if raw is None or raw == "":
        return 0
    if raw not in ACCEPTED_MODES:
        raise ConfigError(
            f"{ENV_ADAPTIVE}={raw!r} is not accepted: use 0 (off), 1 (learn and report) "
            "or 2 (learn and serve learned counts)"
        )
    return int(raw)


__all__ = [
    "ACCEPTED_MODES",
    "ENV_ADAPTIVE",
    "FixedThreads",
    "Rerun",
    "ThreadContext",
    "ThreadPolicy",
    "batch_tokens",
    "parse_mode",
    "process_context",
    "worker_cpu_budget",
]
