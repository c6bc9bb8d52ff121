"""``GET /metrics`` of the frontend: Prometheus families built at scrape time from the pools'
own counters (so the request path pays nothing for them), responses by surface and status, and
a request latency histogram per deployment and surface. The workers' own series are added by
``vllm_sr.frontend.scrape``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from vllm_sr.frontend.cache import ResultCache
from vllm_sr.pool.directory import PoolDirectory
from vllm_sr.pool.replica import Replica

Family = CounterMetricFamily | GaugeMetricFamily

STATES = ("ready", "degraded", "unavailable")
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
REPLICA = ["deployment", "replica"]


class LatencyHistogram:
    """Cumulative-at-render histogram of request seconds, per (deployment, surface): one list
    increment per request on the hot path, no locks (one event loop)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], list[int]] = {}
        self.sums: dict[tuple[str, str], float] = {}

    def observe(self, deployment: str, surface: str, seconds: float) -> None:
        key = (deployment, surface)
        counts = self.counts.get(key)
        if counts is None:
            counts = self.counts[key] = [0] * (len(LATENCY_BUCKETS) + 1)
            self.sums[key] = 0.0
        i = 0
        while i < len(LATENCY_BUCKETS) and seconds > LATENCY_BUCKETS[i]:
            i += 1
        counts[i] += 1
        self.sums[key] += seconds

    def family(self) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(
            "vllm_sr_request_seconds",
            "Frontend request latency by deployment and surface",
            labels=["deployment", "surface"],
        )
        for key, counts in sorted(self.counts.items()):
            running, buckets = 0, []
            for bound, n in zip((*LATENCY_BUCKETS, float("inf")), counts, strict=True):
                running += n
                buckets.append(("+Inf" if bound == float("inf") else str(bound), running))
            fam.add_metric(list(key), buckets, self.sums[key])
        return fam


# Per-replica series read straight off the pool's records (by the family's key below).
REPLICA_VALUES: dict[str, Callable[[Replica], int]] = {
    "inflight": lambda r: r.inflight,
    "outstanding_bytes": lambda r: r.outstanding_bytes,
    "admitted_bytes": lambda r: r.admitted_bytes,
    "restarts": lambda r: r.restarts,
    "ejections": lambda r: r.ejections,
    "readmissions": lambda r: r.readmissions,
}


def _replica_families() -> dict[str, Family]:
    c, g = CounterMetricFamily, GaugeMetricFamily
    return {
        "inflight": g("vllm_sr_replica_inflight", "Requests in flight", labels=REPLICA),
        "outstanding_bytes": g(
            "vllm_sr_replica_outstanding_bytes", "Request bytes in flight", labels=REPLICA
        ),
        "admitted_bytes": c(
            "vllm_sr_replica_admitted_bytes", "Request bytes admitted", labels=REPLICA
        ),
        "restarts": c("vllm_sr_replica_restarts", "Worker restarts", labels=REPLICA),
        "ejections": c("vllm_sr_replica_ejections", "Outlier ejections", labels=REPLICA),
        "readmissions": c(
            "vllm_sr_replica_readmissions", "Readmissions after ejection", labels=REPLICA
        ),
    }


def _pool_families() -> dict[str, Family]:
    c, g = CounterMetricFamily, GaugeMetricFamily
    dep = ["deployment"]
    return {
        "requests": c(
            "vllm_sr_replica_requests", "Exchanges by outcome", labels=[*REPLICA, "outcome"]
        ),
        "by_kind": c(
            "vllm_sr_replica_exchanges_by_kind",
            "Admitted exchanges by kind (native requests, routing tasks)",
            labels=[*REPLICA, "kind"],
        ),
        "state": g(
            "vllm_sr_replica_state", "1 for the replica's current state", labels=[*REPLICA, "state"]
        ),
        "withheld": c(
            "vllm_sr_ejections_withheld", "Ejections held back, by rule", labels=[*dep, "rule"]
        ),
        "rejected": c(
            "vllm_sr_pool_rejected", "Requests refused by admission", labels=[*dep, "reason"]
        ),
        "pool_state": g(
            "vllm_sr_pool_state", "1 for the deployment's current state", labels=[*dep, "state"]
        ),
        "ready": g("vllm_sr_pool_ready_replicas", "Ready replicas", labels=dep),
        "desired": g("vllm_sr_pool_desired_replicas", "Desired replicas", labels=dep),
        "retries": c(
            "vllm_sr_pool_retries",
            "Exchanges retried on another replica after a worker broke before answering",
            labels=dep,
        ),
    }


def config_families(view: Mapping[str, object] | None) -> Iterator[Metric]:
    """config.yaml as served against the file on disk (the inventory's ``service.config``):
    upstream's ``/config/hash`` reports active against source the same way."""
    if view is None:
        return
    info = GaugeMetricFamily(
        "vllm_sr_config_info",
        "config.yaml's SHA-256: the text the served generation came from, and the file on disk",
        labels=["served", "file"],
    )
    info.add_metric([str(view.get("served_hash") or ""), str(view.get("file_hash") or "")], 1)
    yield info
    yield GaugeMetricFamily(
        "vllm_sr_config_in_sync",
        "1 when the file on disk is the config being served, 0 when it differs (see the "
        "inventory's service.config.last_failure for why)",
        value=1 if view.get("in_sync") else 0,
    )
    failures = CounterMetricFamily(
        "vllm_sr_config_reload_failures",
        "Reloads refused (the running generation kept serving), by what asked for them",
        labels=["source"],
    )
    counts = view.get("reload_failures")
    for source, n in sorted(counts.items() if isinstance(counts, dict) else []):
        failures.add_metric([str(source)], float(n))
    yield failures


class FrontendCollector(Collector):
    def __init__(
        self,
        directory: PoolDirectory,
        caches: Mapping[str, ResultCache],
        config_view: Callable[[], Mapping[str, object] | None] = lambda: None,
    ) -> None:
        self.directory = directory
        self.caches = caches
        self.config_view = config_view
        self.responses: Counter[tuple[str, int]] = Counter()
        self.latency = LatencyHistogram()

    def count(self, surface: str, status: int) -> None:
        self.responses[(surface, status)] += 1

    def collect(self) -> Iterator[Metric]:
        responses = CounterMetricFamily(
            "vllm_sr_frontend_responses",
            "Responses by surface and HTTP status",
            labels=["surface", "status"],
        )
        for (surface, status), n in sorted(self.responses.items()):
            responses.add_metric([surface, str(status)], n)
        yield responses
        yield self.latency.family()
        yield from self._pools()
        yield from self._caches()
        yield from config_families(self.config_view())

    def _pools(self) -> Iterator[Metric]:
        per_replica, per_pool = _replica_families(), _pool_families()
        for name, pool in self.directory.items():
            replicas = pool.replicas()
            for r in replicas:
                for key, fam in per_replica.items():
                    fam.add_metric([name, r.id], REPLICA_VALUES[key](r))
                for outcome, n in r.outcomes.items():
                    per_pool["requests"].add_metric([name, r.id, outcome], n)
                for kind, n in r.by_kind.items():
                    per_pool["by_kind"].add_metric([name, r.id, kind], n)
                per_pool["state"].add_metric([name, r.id, r.display_state()], 1)
            for rule, n in pool.outliers.withheld.items():
                per_pool["withheld"].add_metric([name, rule], n)
            for reason, n in pool.rejected.items():
                per_pool["rejected"].add_metric([name, reason], n)
            state = pool.inventory()["state"]  # ready, degraded or unavailable
            for s in STATES:
                per_pool["pool_state"].add_metric([name, s], 1 if state == s else 0)
            per_pool["ready"].add_metric([name], sum(1 for r in replicas if r.serving))
            desired = pool.desired_replicas
            per_pool["desired"].add_metric([name], len(replicas) if desired is None else desired)
            per_pool["retries"].add_metric([name], pool.retries)
        yield from per_replica.values()
        yield from per_pool.values()

    def _caches(self) -> Iterator[Metric]:
        hits = CounterMetricFamily("vllm_sr_cache_hits", "Result cache hits", labels=["deployment"])
        misses = CounterMetricFamily(
            "vllm_sr_cache_misses", "Result cache misses", labels=["deployment"]
        )
        for name, cache in self.caches.items():
            hits.add_metric([name], cache.hits)
            misses.add_metric([name], cache.misses)
        yield hits
        yield misses
