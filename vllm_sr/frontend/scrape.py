"""Each managed worker's own /metrics, gathered when the frontend's /metrics is scraped: the
workers listen on sockets in a private directory, so nothing else can scrape them. Every series
gets ``deployment`` and ``replica`` labels; a worker that does not answer within the short
timeout is simply absent from this scrape."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from vllm_sr.errors import VllmSrError
from vllm_sr.pool.directory import PoolDirectory
from vllm_sr.pool.replica import Replica

log = logging.getLogger("vllm_sr.frontend")

SCRAPE_TIMEOUT_S = 0.5


async def _one(deployment: str, rep: Replica) -> tuple[str, str, str] | None:
    """One worker's exposition text, through its client (the pool's ``Client``: ``request``)."""
    if rep.client is None or rep.served_model is not None:
        return None  # attached runtimes are scraped where they run
    try:
        resp = await rep.client.request("GET", "/metrics", timeout_s=SCRAPE_TIMEOUT_S)
    except VllmSrError:
        return None
    if resp.status != 200:
        return None
    return deployment, rep.id, resp.body.decode("utf-8", "replace")


async def scrape(directory: PoolDirectory) -> list[tuple[str, str, str]]:
    """(deployment, replica, exposition text) of every worker that answered in time."""
    jobs = [
        _one(name, rep)
        for name, pool in directory.items()
        for rep in pool.replicas()
        if rep.pid is not None
    ]
    done = await asyncio.gather(*jobs)
    return [d for d in done if d is not None]


def merge(texts: Iterable[tuple[str, str, str]]) -> list[Metric]:
    """One family per metric name across workers, each sample labelled with its worker."""
    families: dict[str, Metric] = {}
    for deployment, replica, text in texts:
        try:
            parsed = list(text_string_to_metric_families(text))
        except ValueError as exc:
            log.warning("worker %s sent metrics that do not parse: %s", replica, exc)
            continue
        for fam in parsed:
            merged = families.get(fam.name)
            if merged is None:
                merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type)
            for sample in fam.samples:
                labels = {"deployment": deployment, "replica": replica, **sample.labels}
                merged.add_sample(sample.name, labels, sample.value, sample.timestamp)
    return list(families.values())


class ScrapedCollector(Collector):
    """Yields what the last ``scrape`` merged (set just before the registry is rendered)."""

    def __init__(self) -> None:
        self.families: list[Metric] = []

    def collect(self) -> Iterator[Metric]:
        yield from self.families
