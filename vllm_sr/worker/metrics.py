"""Prometheus metrics of one worker, on a registry of its own (never the global one), so that
several engines in one process, or tests, never share counters."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
SECOND_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "vllm_sr_worker_requests",
            "HTTP requests answered, by surface and status code",
            ["surface", "status"],
            registry=r,
        )
        self.rows = Counter("vllm_sr_worker_rows", "Input rows accepted", ["surface"], registry=r)
        self.forward_rows = Histogram(
            "vllm_sr_worker_forward_rows", "Rows per forward", buckets=ROW_BUCKETS, registry=r
        )
        self.forward_tokens = Histogram(
            "vllm_sr_worker_forward_padded_tokens",
            "Padded tokens (rows x longest row) per forward",
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.forward_seconds = Histogram(
            "vllm_sr_worker_forward_seconds",
            "Seconds per forward",
            buckets=SECOND_BUCKETS,
            registry=r,
        )
        self.deadline_dropped = Counter(
            "vllm_sr_worker_deadline_dropped_rows",
            "Queued rows dropped before a forward because their request's deadline had passed",
            registry=r,
        )
        self._cache_metrics(r)
        self.queue_depth = Gauge(
            "vllm_sr_worker_queue_depth", "Rows waiting for a forward", registry=r
        )

    def _cache_metrics(self, r: CollectorRegistry) -> None:
        self.cache_hits = Counter(
            "vllm_sr_worker_result_cache_hits", "Answers served from the result cache", registry=r
        )
        self.cache_misses = Counter(
            "vllm_sr_worker_result_cache_misses",
            "Result cache look-ups that found nothing (only counted when the cache is on)",
            registry=r,
        )
        self.cache_evictions = Counter(
            "vllm_sr_worker_result_cache_evictions",
            "Answers evicted from the result cache to stay under its byte bound",
            registry=r,
        )
        self.cache_bytes = Gauge(
            "vllm_sr_worker_result_cache_bytes", "Bytes the result cache holds", registry=r
        )
        self.cache_max_bytes = Gauge(
            "vllm_sr_worker_result_cache_max_bytes",
            "The result cache's byte bound (0: the cache is off)",
            registry=r,
        )

    def observe_cache(self, hit: bool | None, evicted: int, held: int) -> None:
        """One look-up (``hit``; None for a store alone), evictions and the bytes now held."""
        if hit is True:
            self.cache_hits.inc()
        elif hit is False:
            self.cache_misses.inc()
        if evicted:
            self.cache_evictions.inc(evicted)
        self.cache_bytes.set(held)

    def observe_forward(self, rows: int, padded: int, seconds: float) -> None:
        self.forward_rows.observe(rows)
        self.forward_tokens.observe(padded)
        self.forward_seconds.observe(seconds)

    def set_queue_depth(self, rows: int) -> None:
        self.queue_depth.set(rows)

    def count_deadline_dropped(self, rows: int) -> None:
        self.deadline_dropped.inc(rows)

    def count_request(self, surface: str, status: int, rows: int = 0) -> None:
        self.requests.labels(surface, str(status)).inc()
        if rows:
            self.rows.labels(surface).inc(rows)

    def render(self) -> bytes:
        return generate_latest(self.registry)
