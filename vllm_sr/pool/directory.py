"""The published pools, by deployment name: what the frontend (and the router) resolve a
request's ``model`` against. The supervisor publishes a new generation in one step
(``publish``); readers only look up."""

from __future__ import annotations

from vllm_sr.errors import ModelNotFound
from vllm_sr.pool.pool import ReplicaPool


class PoolDirectory:
    def __init__(self) -> None:
        self.pools: dict[str, ReplicaPool] = {}
        self.default: str = ""
        self.aliases: dict[str, str] = {}  # other accepted names -> deployment
        self.generation = 0

    def publish(
        self,
        pools: dict[str, ReplicaPool],
        default: str,
        aliases: dict[str, str] | None = None,
        generation: int = 0,
    ) -> None:
        self.pools = pools
        self.default = default
        self.aliases = dict(aliases or {})
        self.generation = generation

    def resolve(self, model: str | None) -> ReplicaPool:
        """The pool for ``model``: a deployment name, an alias (the default deployment's
        artifact name) or None for the default deployment."""
        name = self.default if model is None else model
        pool = self.pools.get(name)
        if pool is None and model is not None and model in self.aliases:
            pool = self.pools.get(self.aliases[model])
        if pool is None:
            raise ModelNotFound(
                f"model {name!r} is not a deployment; known: {sorted(self.pools)}", model=name
            )
        return pool

    def items(self) -> list[tuple[str, ReplicaPool]]:
        """A snapshot of (deployment, pool), safe to iterate while a reload publishes."""
        return list(self.pools.items())
