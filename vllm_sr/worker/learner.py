"""The adaptive thread learner behind ``VLLM_SRUN_CPU_ADAPTIVE_THREADS`` (modes 1 and 2;
docs/adaptive-threads.md is the long form): per log2 token bucket, shadow passes at other
counts that must reproduce the served answer bit for bit, timed against the configured count.
A shadow pass reruns the served forward itself, so it runs at the served dtype (a bfloat16
worker compares bfloat16 answers; its host record is kept apart, see threads_record). This is
the policy; the buckets and their statistics are in ``learner_stats``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.errors import ConfigError
from vllm_sr.events import THREADS_LEARNED, THREADS_RETIRED
from vllm_sr.worker.learner_stats import (
    Bucket,
    allowed_counts,
    bucket_label,
    bucket_of,
    diff_summary,
    identical,
    median,
    recommend,
)
from vllm_sr.worker.threads import ENV_ADAPTIVE, Rerun, batch_tokens

log = logging.getLogger("vllm_sr.worker.threads")

Emit = Callable[..., None]


class RecordSink(Protocol):
    """Where the host's bit-identity record goes (``threads_record.HostRecords``)."""

    def learned(self, counts: list[int], buckets: list[str]) -> None: ...

    def drifted(self, counts: list[int], detail: str) -> None: ...


def apply_setting(threads: int) -> str:
    """The exact setting that pins a count: the deployment's field, or the serve flag."""
    return (
        f"threads: {threads} on the deployment in config.yaml "
        f"(or vllm-sr serve --threads {threads})"
    )


# The learner's documented defaults (docs/adaptive-threads.md explains each).
WINDOW = 16  # mode 2: consecutive bit-identical matches before a bucket serves its count
MIN_SAMPLES = 5  # timed pairs per count per bucket before the bucket's fastest is decided
SHARE = 0.1  # at most this share of a bucket's forwards carry exploration passes
TIME_SHARE = 0.2  # extra passes may take at most this share of the served forwards' time
AUDIT_SHARE = 0.02  # mode 2, a bucket serving a learned count: share re-checked against configured
MAX_SHADOW_PER_S = 10.0  # cap on extra passes (warm + shadow) per second, over all buckets
MARGIN = 0.05  # another count must be this much faster (median paired ratio) to beat configured


@dataclass(frozen=True)
class _Forward:
    """One served forward that carries exploration passes."""

    rows: list[list[int]]
    served: numpy.ndarray
    threads: int
    bucket: Bucket
    rerun: Rerun


class AdaptiveThreads:
    """Learns the fastest intra-op count per log2 token bucket from shadow passes that must
    reproduce the served answer bit for bit. Mode 1 serves the configured count always; mode 2
    serves a bucket's learned count once it matched ``window`` times in a row. Any mismatch
    retires learning for good; from then on only the configured count serves. The host record
    keeps the mismatch, so a later start (``recorded_drift``) is retired from the outset."""

    def __init__(
        self,
        mode: int,
        configured: int,
        budget: int,
        emit: Emit | None = None,
        clock: Clock = SYSTEM_CLOCK,
        *,
        window: int = WINDOW,
        min_samples: int = MIN_SAMPLES,
        share: float = SHARE,
        time_share: float = TIME_SHARE,
        audit_share: float = AUDIT_SHARE,
        max_shadow_per_s: float = MAX_SHADOW_PER_S,
        margin: float = MARGIN,
        records: RecordSink | None = None,
        fallback: str | None = None,
        recorded_drift: str | None = None,
        record_path: str | None = None,
    ) -> None:
        if mode not in (1, 2):
            raise ConfigError(f"{ENV_ADAPTIVE}={mode!r} is not accepted: use 0, 1 or 2")
        if configured < 1 or budget < 1:
            raise ConfigError(f"threads: {configured} / budget {budget} must be positive")
        self.mode, self.configured, self.budget = mode, configured, budget
        self.allowed = allowed_counts(configured, budget)
        self.window, self.min_samples, self.margin = window, min_samples, margin
        self.share, self.time_share, self.audit_share = share, time_share, audit_share
        self.max_shadow_per_s = max_shadow_per_s
        self._emit, self._clock = emit, clock
        self._records, self.fallback = records, fallback
        self._lock = threading.Lock()
        self._golden = False
        # A drift this host's record keeps retires learning before any pass runs.
        self._retired: str | None = recorded_drift
        self.recorded_drift = recorded_drift is not None
        self.record_path = record_path
        self._buckets: dict[int, Bucket] = {}
        self._tokens = max(max_shadow_per_s, 2.0)
        self._refilled = clock.monotonic()
        self._passes = 0
        self._shadow_s = 0.0
        self._served_s = 0.0

    # -- serving ------------------------------------------------------------------------
    def threads_for(self, n_tokens: int) -> int:
        if self.mode != 2:
            return self.configured
        with self._lock:
            if self._retired is not None:
                return self.configured
            bucket = self._buckets.get(bucket_of(n_tokens))
            return self.configured if bucket is None else bucket.serving

    def golden_passed(self) -> None:
        with self._lock:
            self._golden = True

    @property
    def retired(self) -> bool:
        return self._retired is not None

    # -- learning -----------------------------------------------------------------------
    def after_forward(
        self,
        rows: list[list[int]],
        output: numpy.ndarray,
        threads: int,
        seconds: float,
        rerun: Rerun,
    ) -> None:
        with self._lock:
            if not self._golden or self._retired is not None:
                return
            bucket = self._bucket(bucket_of(batch_tokens(rows)))
            bucket.forwards += 1
            self._served_s += seconds
            plan = self._plan(bucket, threads, seconds)
            if plan is None:
                return
            bucket.explored += 1
        # Passes run outside the lock so report() never waits on a forward.
        kind, count = plan
        fwd = _Forward(rows, numpy.asarray(output), threads, bucket, rerun)
        {"explore": self._explore, "verify": self._verify, "check": self._check}[kind](fwd, count)

    def _bucket(self, index: int) -> Bucket:
        bucket = self._buckets.get(index)
        if bucket is None:
            bucket = self._buckets[index] = Bucket(index, self.configured)
            if len(self.allowed) == 1:
                bucket.phase, bucket.best = "learned", self.configured
        return bucket

    def _plan(self, bucket: Bucket, threads: int, seconds: float) -> tuple[str, int] | None:
        """Which passes this forward carries, inside the shares and the per-second cap.
        The passes' cost is predicted (this forward's time times what is known of the count's
        speed) and must fit the time share first, so one slow pass cannot overshoot it."""
        if bucket.phase == "exploring":
            share, passes = self.share, 2
            others = [c for c in self.allowed if c != self.configured]
            plan = ("explore", min(others, key=lambda c: (bucket.samples[c], c)))
            cost = seconds * (1.0 + self._slowness(bucket, plan[1]))
        elif bucket.phase == "verifying":
            assert bucket.best is not None
            share, passes, plan = self.share, 1, ("verify", bucket.best)
            cost = seconds * self._slowness(bucket, bucket.best)
        elif bucket.phase == "serving" and threads != self.configured:
            share, passes, plan = self.audit_share, 1, ("check", self.configured)
            cost = seconds / self._slowness(bucket, threads)
        else:
            return None
        if bucket.explored >= share * bucket.forwards:
            return None
        if self._shadow_s + cost > self.time_share * self._served_s or not self._take(passes):
            return None
        return plan

    def _slowness(self, bucket: Bucket, count: int) -> float:
        """Time at ``count`` over time at the configured count: this bucket's median when
        known, else the worst median of the other buckets, else 1."""
        if count == self.configured:
            return 1.0
        if bucket.ratios.get(count):
            return bucket.median_ratio(count, self.configured)
        seen = [median(b.ratios[count]) for b in self._buckets.values() if b.ratios.get(count)]
        return max(seen, default=1.0)

    def _take(self, passes: int) -> bool:
        now = self._clock.monotonic()
        cap = max(self.max_shadow_per_s, 2.0)
        self._tokens = min(cap, self._tokens + (now - self._refilled) * self.max_shadow_per_s)
        self._refilled = now
        if self._tokens < passes:
            return False
        self._tokens -= passes
        return True

    def _timed(self, rerun: Rerun, count: int) -> tuple[numpy.ndarray, float]:
        start = self._clock.monotonic()
        out = numpy.asarray(rerun(count))
        took = self._clock.monotonic() - start
        with self._lock:
            self._passes += 1
            self._shadow_s += took
        return out, took

    def _explore(self, fwd: _Forward, count: int) -> None:
        # The warm pass at the served count puts the input in cache for both timed passes
        # and is itself the configured count's timing for the pair.
        warm, t_warm = self._timed(fwd.rerun, fwd.threads)
        if not self._matches(fwd, warm, fwd.threads):
            return
        shadow, t_shadow = self._timed(fwd.rerun, count)
        if not self._matches(fwd, shadow, count):
            return
        with self._lock:
            fwd.bucket.add(fwd.threads, t_warm, None)
            fwd.bucket.add(count, t_shadow, t_shadow / t_warm if t_warm > 0 else 1.0)
            self._maybe_learn(fwd.bucket)

    def _verify(self, fwd: _Forward, count: int) -> None:
        shadow, took = self._timed(fwd.rerun, count)
        if not self._matches(fwd, shadow, count):
            return
        bucket = fwd.bucket
        with self._lock:
            bucket.add(count, took, None)
            bucket.matches += 1
            if bucket.matches >= self.window and self._retired is None:
                bucket.phase, bucket.serving = "serving", count
                label = bucket_label(bucket.index)
                log.info("threads_serving bucket=%s threads=%d", label, count)

    def _check(self, fwd: _Forward, count: int) -> None:
        # Serving a learned count: re-run at the configured one; a difference is the learned
        # count drifting, so that is the count retired.
        out, _ = self._timed(fwd.rerun, count)
        self._matches(fwd, out, count, drifting=fwd.threads)

    def _maybe_learn(self, bucket: Bucket) -> None:
        others = [c for c in self.allowed if c != self.configured]
        if any(len(bucket.ratios.get(c, ())) < self.min_samples for c in others):
            return
        best = min(self.allowed, key=lambda c: bucket.median_ratio(c, self.configured))
        if bucket.median_ratio(best, self.configured) > 1.0 - self.margin:
            best = self.configured
        bucket.best = best
        switch = self.mode == 2 and best != self.configured
        bucket.phase = "verifying" if switch else "learned"
        fields: dict[str, Any] = {
            "bucket": bucket_label(bucket.index),
            "threads": best,
            "median_ms": round(median(bucket.times[best]) * 1000, 3),
            "ratio": round(bucket.median_ratio(best, self.configured), 3),
            "samples": bucket.samples[best],
        }
        recommended = self._recommend()
        if recommended is not None:
            fields |= {"recommended": recommended, "apply": apply_setting(recommended)}
        self._publish(THREADS_LEARNED, logging.INFO, fields)
        if self._records is not None and self.mode == 1 and self._state() == "learned":
            learned = [bucket_label(b.index) for b in self._buckets.values()]
            self._records.learned(list(self.allowed), learned)

    def _matches(
        self, fwd: _Forward, out: numpy.ndarray, count: int, drifting: int | None = None
    ) -> bool:
        if identical(fwd.served, out):
            return True
        drifting = count if drifting is None else drifting
        against = fwd.threads if drifting == count else count
        tokens, label = batch_tokens(fwd.rows), bucket_label(fwd.bucket.index)
        diff = diff_summary(fwd.served, out)
        with self._lock:
            if self._retired is not None:
                return False
            self._retired = (
                f"{drifting} threads drifted from the answer at {against} on bucket {label} "
                f"({len(fwd.rows)} rows, {tokens} padded tokens): {diff}"
            )
        fields = {"threads": drifting, "against_threads": against, "bucket": label}
        fields |= {"tokens": tokens, "rows": len(fwd.rows), "diff": diff}
        self._publish(THREADS_RETIRED, logging.WARNING, fields)
        if self._records is not None:
            self._records.drifted(sorted({drifting, against}), self._retired or diff)
        return False

    def _publish(self, name: str, level: int, fields: dict[str, Any]) -> None:
        if self._emit is not None:
            self._emit(name, **fields)
        else:
            log.log(level, "%s %s", name, " ".join(f"{k}={v}" for k, v in fields.items()))

    # -- report -------------------------------------------------------------------------
    def report(self) -> dict[str, Any] | None:
        with self._lock:
            buckets = [self._bucket_report(self._buckets[i]) for i in sorted(self._buckets)]
            recommended = None if self._retired else self._recommend()
            total = self._served_s + self._shadow_s
            return {
                "mode": self.mode,
                "state": self._state(),
                "configured": self.configured,
                "budget": self.budget,
                "allowed": list(self.allowed),
                "golden_passed": self._golden,
                "window": self.window,
                "min_samples": self.min_samples,
                "share": self.share,
                "time_share": self.time_share,
                "max_shadow_per_s": self.max_shadow_per_s,
                "buckets": buckets,
                "best_threads": recommended,
                "recommended_threads": recommended,
                "recommendation": None if recommended is None else f"pin --threads {recommended}",
                "apply": None if recommended is None else apply_setting(recommended),
                "fallback": self.fallback,
                "retire_reason": self._retired,
                "recorded_drift": self.recorded_drift,
                "record": self.record_path,
                "shadow_passes": self._passes,
                "shadow_seconds": round(self._shadow_s, 6),
                "shadow_time_share": round(self._shadow_s / total, 4) if total else 0.0,
            }

    def _state(self) -> str:
        if self._retired is not None:
            return "retired"
        if not self._buckets or any(
            b.phase in ("exploring", "verifying") for b in self._buckets.values()
        ):
            return "exploring"
        return "learned"

    def _bucket_report(self, b: Bucket) -> dict[str, Any]:
        counts = []
        for c in self.allowed:
            times = b.times.get(c)
            has_ratio = c == self.configured or bool(b.ratios.get(c))
            counts.append(
                {
                    "threads": c,
                    "samples": b.samples[c],
                    "median_ms": round(median(times) * 1000, 3) if times else None,
                    "ratio": round(b.median_ratio(c, self.configured), 3) if has_ratio else None,
                }
            )
        return {
            "bucket": bucket_label(b.index),
            "tokens_max": 2**b.index,
            "phase": b.phase,
            "forwards": b.forwards,
            "explored": b.explored,
            "best": b.best,
            "serving": self.configured if self._retired else b.serving,
            "matches": b.matches,
            "counts": counts,
        }

    def _recommend(self) -> int | None:
        return recommend(list(self._buckets.values()), self.allowed, self.configured, self.margin)
