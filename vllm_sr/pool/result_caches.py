"""Where a deployment's result cache lives, by its replica count (the page: "Single-worker
deployments retain the frontend result cache; multiple replicas use independent worker
caches").

One worker: the frontend keeps the cache (in front of the pool, it also saves the exchange) and
the worker keeps none. Several: the frontend bypasses it and each worker keeps its own (a
frontend entry would answer for whichever replica served it). None planned: neither. The
supervisor applies the worker side on every reconfiguration, to kept workers too; the frontend
and the inventory read the frontend side from the pool.
"""

from __future__ import annotations

from dataclasses import dataclass

FRONTEND_CACHE_BYTES = 64 * 1024 * 1024
WORKER_CACHE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class CacheSizes:
    frontend_bytes: int
    worker_bytes: int  # each worker's


def cache_sizes(
    replicas: int,
    *,
    frontend_bytes: int = FRONTEND_CACHE_BYTES,
    worker_bytes: int = WORKER_CACHE_BYTES,
) -> CacheSizes:
    if replicas == 1:
        return CacheSizes(frontend_bytes, 0)
    if replicas > 1:
        return CacheSizes(0, worker_bytes)
    return CacheSizes(0, 0)
