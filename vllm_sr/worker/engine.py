"""The batching engine: rows of concurrent requests share forwards on one dedicated thread.

A *job* is one unit of submission (a request, or a whole bundle): its rows enter the queue
together and its outputs come back in row order. The forward thread forms each forward from
queued rows (at most ``max_num_seqs`` rows and ``max_num_batched_tokens`` padded tokens): the
oldest row always, and rows of similar length around it while that is cheaper than running
them later, judged on what forwards of each size have cost here (``forming``).
Nothing here knows about HTTP or torch: a ``Runner`` turns token rows into an output matrix
(the seam types are in ``engine_types``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import sys
import threading
from collections.abc import Callable

import numpy

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.errors import DeadlineExceeded, InvalidRequest, NotReady, Overloaded, VllmSrError
from vllm_sr.worker.engine_types import (
    Deliver,
    EngineMetrics,
    Faults,
    ForwardFailed,
    Job,
    Limits,
    Runner,
)
from vllm_sr.worker.forming import ForwardCosts, form
from vllm_sr.worker.threads import FixedThreads, ThreadContext, ThreadPolicy, batch_tokens

log = logging.getLogger("vllm_sr.worker.engine")

# Callers name the seam types through this module.
__all__ = [
    "FORWARD_THREAD_NAME",
    "Deliver",
    "Engine",
    "EngineMetrics",
    "Faults",
    "ForwardFailed",
    "Job",
    "Limits",
    "Runner",
    "name_os_thread",
]


FORWARD_THREAD_NAME = "vsr-forward"  # what top -H and /proc/PID/task/*/comm show


def name_os_thread(name: str) -> None:
    """Name the calling OS thread (Linux), so per-thread CPU can be read from /proc."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


class _Row:
    __slots__ = ("index", "job", "length")

    def __init__(self, job: Job, index: int) -> None:
        self.job = job
        self.index = index
        self.length = len(job.rows[index])


def _call_each(jobs: list[Job]) -> None:
    for job in jobs:
        if job.on_done is not None:
            job.on_done(job)


class Engine:
    """Queue + forward thread. ``submit`` is called from any thread (the HTTP loop); finished
    jobs go to ``deliver`` once per forward (the HTTP layer hops them onto its loop)."""

    def __init__(
        self,
        runner: Runner,
        limits: Limits,
        *,
        clock: Clock = SYSTEM_CLOCK,
        policy: ThreadPolicy | None = None,
        context: ThreadContext | None = None,
        metrics: EngineMetrics | None = None,
        max_queue_rows: int | None = None,
        faults: Faults | None = None,
        deliver: Deliver = _call_each,
        costs: ForwardCosts | None = None,
        forward_tokens: int | None = None,
    ) -> None:
        self.runner = runner
        self.limits = limits
        if forward_tokens is not None and forward_tokens < 1:
            raise ValueError(f"forward_tokens: {forward_tokens!r} is not a positive integer")
        # What forwards are formed to: the limits, with the padded tokens capped further at
        # ``forward_tokens`` when given (a CPU's best forward size; see forming.py).
        self.forming_limits = (
            limits
            if forward_tokens is None or forward_tokens >= limits.max_num_batched_tokens
            else Limits(limits.max_num_seqs, forward_tokens)
        )
        self.clock = clock
        self.policy: ThreadPolicy = policy or FixedThreads(1)
        self.context = context or ThreadContext(lambda: 0, lambda n: None)
        self.metrics = metrics
        self.max_queue_rows = max_queue_rows or max(16 * limits.max_num_seqs, 1024)
        self.faults = faults or Faults()
        self.deliver = deliver
        self.costs = costs if costs is not None else ForwardCosts()
        self._cond = threading.Condition()
        self._pending: list[_Row] = []
        self._busy = False
        self._forward_started: float | None = None
        self._stopping = False
        self._shutdown = threading.Event()
        self._thread: threading.Thread | None = None
        self.forwards = 0

    # -- submission (any thread) ---------------------------------------------------------
    def submit(
        self,
        rows: list[list[int]],
        on_done: Callable[[Job], None] | None = None,
        deadline: float | None = None,
    ) -> Job:
        """Queue one job's rows. ``deadline`` (on this engine's clock) drops the job's rows
        still queued once it has passed, answering ``DeadlineExceeded``; a forward already
        running with them continues."""
        if not rows:
            raise InvalidRequest("a job needs at least one row")
        with self._cond:
            if self._stopping:
                raise NotReady("the worker is shutting down")
            queued = len(self._pending)
            if queued and queued + len(rows) > self.max_queue_rows:
                raise Overloaded(
                    f"{queued} rows are queued; {len(rows)} more would pass the queue limit "
                    f"of {self.max_queue_rows} rows"
                )
            job = Job(rows, on_done, self.clock.monotonic(), deadline)
            self._pending.extend(_Row(job, i) for i in range(len(rows)))
            depth = len(self._pending)
            self._cond.notify()
        if self.metrics is not None:
            self.metrics.set_queue_depth(depth)
        return job

    @property
    def busy(self) -> bool:
        """A forward is running now."""
        return self._busy

    @property
    def forward_running_s(self) -> float:
        """Seconds the running forward has taken so far; 0.0 when none runs."""
        started = self._forward_started
        return max(0.0, self.clock.monotonic() - started) if started is not None else 0.0

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def queue_depth(self) -> int:
        return len(self._pending)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="vllm-sr-forward", daemon=True)
        self._thread.start()

    def stop(self, drain_timeout: float = 5.0) -> None:
        """Refuse new work, let queued rows finish for up to ``drain_timeout`` seconds, then
        end the forward thread (an injected delay is cut short). Unfinished jobs fail."""
        deadline = self.clock.monotonic() + drain_timeout
        with self._cond:
            self._stopping = True
            while (self._pending or self._busy) and self.clock.monotonic() < deadline:
                self._cond.wait(timeout=0.05)
            self._shutdown.set()
            leftover = self._pending
            self._pending = []
            self._cond.notify_all()
        self._fail(leftover, NotReady("the worker stopped before this row ran"))
        if self._thread is not None:
            self._thread.join(timeout=max(0.0, deadline - self.clock.monotonic()) + 1.0)

    # -- the forward thread --------------------------------------------------------------
    def _loop(self) -> None:
        name_os_thread(FORWARD_THREAD_NAME)
        while True:
            with self._cond:
                while not self._pending and not self._shutdown.is_set():
                    self._cond.wait()
                if self._shutdown.is_set():
                    return
                expired, dropped = self._expire()
                batch = self._take() if self._pending else []
                if batch:
                    self._busy = True
                    self._forward_started = self.clock.monotonic()
                depth = len(self._pending)
            self._answer_expired(expired, dropped)
            if self.metrics is not None:
                self.metrics.set_queue_depth(depth)
            if not batch:
                continue
            try:
                self.run_batch(batch)
            finally:
                with self._cond:
                    self._busy = False
                    self._forward_started = None
                    self._cond.notify_all()

    def _expire(self) -> tuple[list[Job], int]:
        """Take out the queued rows of jobs whose deadline has passed (called holding the
        lock, between forwards). Returns those jobs and how many rows were dropped."""
        now = self.clock.monotonic()
        expired: dict[int, Job] = {}
        for r in self._pending:
            deadline = r.job.deadline
            if deadline is not None and deadline <= now:
                expired[id(r.job)] = r.job
        if not expired:
            return [], 0
        kept = [r for r in self._pending if id(r.job) not in expired]
        dropped = len(self._pending) - len(kept)
        self._pending = kept
        return list(expired.values()), dropped

    def _answer_expired(self, jobs: list[Job], dropped: int) -> None:
        if not jobs:
            return
        now = self.clock.monotonic()
        for job in jobs:
            assert job.deadline is not None
            late_ms = (now - job.deadline) * 1000
            job.error = DeadlineExceeded(
                f"the request's deadline passed {late_ms:.0f} ms before a forward could take "
                f"its rows ({job.n_rows} rows, queued {(now - job.submitted_at) * 1000:.0f} ms)"
            )
            job.done_at = now
        log.info("deadline: dropped %d queued rows of %d requests", dropped, len(jobs))
        if self.metrics is not None:
            self.metrics.count_deadline_dropped(dropped)
        self.deliver(jobs)

    def _take(self) -> list[_Row]:
        pending = self._pending
        chosen = form([r.length for r in pending], self.forming_limits, self.costs)
        if len(chosen) == len(pending):
            self._pending = []
            return pending
        keep = set(chosen)
        self._pending = [r for i, r in enumerate(pending) if i not in keep]
        return [pending[i] for i in chosen]

    def run_batch(self, batch: list[_Row]) -> None:
        rows = [r.job.rows[r.index] for r in batch]
        padded = batch_tokens(rows)
        threads = self.policy.threads_for(padded)
        started = self.clock.monotonic()
        for r in batch:
            if r.job.first_forward_at is None:
                r.job.first_forward_at = started
        try:
            self._inject_delay()
            output = self._timed_forward(rows, threads, padded)
            if len(output) != len(rows):
                raise ForwardFailed(f"the model returned {len(output)} rows for {len(rows)}")
        except Exception as exc:
            log.exception("forward of %d rows failed", len(rows))
            error = exc if isinstance(exc, VllmSrError) else ForwardFailed(f"forward failed: {exc}")
            self._fail(batch, error)
            return
        seconds = self.clock.monotonic() - started
        self.forwards += 1
        if self.metrics is not None:
            self.metrics.observe_forward(len(rows), padded, seconds)
        self.deliver(self._distribute(batch, output))
        self._after(rows, output, threads, seconds)

    def measure(self, rows: list[list[int]], threads: int | None = None) -> numpy.ndarray:
        """One forward of ``rows`` (at the policy's count unless ``threads`` is given), its
        time recorded in ``costs``. Called on the forward thread, or before ``start`` (the
        startup probes)."""
        padded = batch_tokens(rows)
        if threads is None:
            threads = self.policy.threads_for(padded)
        return self._timed_forward(rows, threads, padded)

    def _timed_forward(self, rows: list[list[int]], threads: int, padded: int) -> numpy.ndarray:
        started = self.clock.monotonic()
        with self.context.forward(threads=threads):
            output = self.runner.forward(rows)
        self.costs.observe(padded, self.clock.monotonic() - started)
        return output

    def _inject_delay(self) -> None:
        delay = self.faults.forward_delay_s
        if delay > 0:
            # Waiting on the shutdown event, not sleeping, so SIGTERM cuts a long fault short.
            self._shutdown.wait(delay)
            if self._shutdown.is_set():
                raise NotReady("the worker is shutting down")

    def _distribute(self, batch: list[_Row], output: numpy.ndarray) -> list[Job]:
        done: list[Job] = []
        now = self.clock.monotonic()
        for i, r in enumerate(batch):
            job = r.job
            if job.outputs is None:
                job.outputs = numpy.empty((job.n_rows, *output.shape[1:]), dtype=output.dtype)
            job.outputs[r.index] = output[i]
            job.remaining -= 1
            if job.remaining == 0:
                job.done_at = now
                done.append(job)
        return done

    def _after(
        self, rows: list[list[int]], output: numpy.ndarray, threads: int, seconds: float
    ) -> None:
        def rerun(n: int) -> numpy.ndarray:
            with self.context.forward(threads=n):
                return self.runner.forward(rows)

        try:
            self.policy.after_forward(rows, output, threads, seconds, rerun)
        except Exception:  # learning must never take serving down
            log.exception("thread policy failed after a forward")

    def _fail(self, batch: list[_Row], error: VllmSrError) -> None:
        jobs: dict[int, Job] = {}
        for r in batch:
            if r.job.error is None and r.job.done_at is None:
                jobs[id(r.job)] = r.job
        now = self.clock.monotonic()
        for job in jobs.values():
            job.error = error
            job.done_at = now
        if jobs:
            with self._cond:
                # Drop the failed jobs' other rows still queued: they cannot succeed now.
                self._pending = [r for r in self._pending if id(r.job) not in jobs]
            self.deliver(list(jobs.values()))
