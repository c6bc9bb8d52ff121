"""``GET /metrics`` of the frontend: Prometheus families built at scrape time from the pools'
own counters (so the request path pays nothing for them) plus responses by surface and status."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from vllm_sr.frontend.cache import ResultCache
from vllm_sr.pool.directory import PoolDirectory

STATES = ("ready", "degraded", "unavailable")


class FrontendCollector(Collector):
    def __init__(self, directory: PoolDirectory, caches: Mapping[str, ResultCache]) -> None:
        self.directory = directory
        self.caches = caches
        self.responses: Counter[tuple[str, int]] = Counter()

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

        labels = ["deployment", "replica"]
        inflight = GaugeMetricFamily(
            "vllm_sr_replica_inflight", "Requests in flight", labels=labels
        )
        outstanding = GaugeMetricFamily(
            "vllm_sr_replica_outstanding_bytes", "Request bytes in flight", labels=labels
        )
        admitted = CounterMetricFamily(
            "vllm_sr_replica_admitted_bytes", "Request bytes admitted", labels=labels
        )
        requests = CounterMetricFamily(
            "vllm_sr_replica_requests", "Exchanges by outcome", labels=[*labels, "outcome"]
        )
        restarts = CounterMetricFamily("vllm_sr_replica_restarts", "Worker restarts", labels=labels)
        ejections = CounterMetricFamily(
            "vllm_sr_replica_ejections", "Outlier ejections", labels=labels
        )
        readmissions = CounterMetricFamily(
            "vllm_sr_replica_readmissions", "Readmissions after ejection", labels=labels
        )
        state = GaugeMetricFamily(
            "vllm_sr_replica_state", "1 for the replica's current state", labels=[*labels, "state"]
        )
        withheld = CounterMetricFamily(
            "vllm_sr_ejections_withheld",
            "Ejections held back, by rule",
            labels=["deployment", "rule"],
        )
        rejected = CounterMetricFamily(
            "vllm_sr_pool_rejected",
            "Requests refused by admission",
            labels=["deployment", "reason"],
        )
        pool_state = GaugeMetricFamily(
            "vllm_sr_pool_state",
            "1 for the deployment's current state",
            labels=["deployment", "state"],
        )
        ready = GaugeMetricFamily(
            "vllm_sr_pool_ready_replicas", "Ready replicas", labels=["deployment"]
        )
        desired = GaugeMetricFamily(
            "vllm_sr_pool_desired_replicas", "Desired replicas", labels=["deployment"]
        )
        retries = CounterMetricFamily(
            "vllm_sr_pool_retries",
            "Exchanges retried on another replica after a worker broke before answering",
            labels=["deployment"],
        )
        for name, pool in self.directory.items():
            m = pool.metrics()
            inv = pool.inventory()
            for rid, r in m["replicas"].items():
                inflight.add_metric([name, rid], r["inflight"])
                outstanding.add_metric([name, rid], r["outstanding_bytes"])
                admitted.add_metric([name, rid], r["admitted_bytes"])
                for outcome, n in r["requests"].items():
                    requests.add_metric([name, rid, outcome], n)
                restarts.add_metric([name, rid], r["restarts"])
                ejections.add_metric([name, rid], r["ejections"])
                readmissions.add_metric([name, rid], r["readmissions"])
                state.add_metric([name, rid, r["state"]], 1)
            for rule, n in m["withheld"].items():
                withheld.add_metric([name, rule], n)
            for reason, n in m["rejected"].items():
                rejected.add_metric([name, reason], n)
            for s in STATES:
                pool_state.add_metric([name, s], 1 if inv["state"] == s else 0)
            ready.add_metric([name], inv["ready_replicas"])
            retries.add_metric([name], m["retries"])
            desired.add_metric([name], inv["desired_replicas"])
        yield from (inflight, outstanding, admitted, requests, restarts, ejections, readmissions)
        yield from (state, withheld, rejected, pool_state, ready, desired, retries)

        hits = CounterMetricFamily("vllm_sr_cache_hits", "Result cache hits", labels=["deployment"])
        misses = CounterMetricFamily(
            "vllm_sr_cache_misses", "Result cache misses", labels=["deployment"]
        )
        for name, cache in self.caches.items():
            hits.add_metric([name], cache.hits)
            misses.add_metric([name], cache.misses)
        yield hits
        yield misses
