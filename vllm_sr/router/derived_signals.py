"""What the signals stage does once every family's result is in, in upstream's order
(``ROUTER-REFERENCE.md`` §0): embedding soft matching, partitions, complexity composers,
embedding ``top_k``, safety hazards, then projections (scores and their bands). Each step
reads and rewrites the results only, so the whole runs where the results are: on the loop, or
in the signal process that evaluated a chat's families and read its answers (one job, one
answer: ``cpu_signals``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm_sr.router.embedding_matching import EmbeddingMatching
from vllm_sr.router.signals_embedded import apply_composers
from vllm_sr.router.signals_projections import ProjectionPlan, apply_partitions
from vllm_sr.router.signals_safety import apply_hazards

if TYPE_CHECKING:
    from vllm_sr.config.routing import Routing
    from vllm_sr.router.rules import SignalKey
    from vllm_sr.router.signals import SignalResult


@dataclass(frozen=True)
class DerivedSignals:
    """One plan's steps over its results (``embedding``: its embedding_config's matching;
    ``uses_embeddings``: whether the plan evaluates embedding signals)."""

    routing: Routing
    embedding: EmbeddingMatching
    uses_embeddings: bool
    projections: ProjectionPlan = field(init=False)  # worked out once, from ``routing``

    def __post_init__(self) -> None:
        object.__setattr__(self, "projections", ProjectionPlan(self.routing))

    def apply(self, results: dict[SignalKey, SignalResult]) -> float | None:
        """Every step on ``results`` -> the milliseconds they took when projections ran
        (the ``projection`` family's timing), else None."""
        started = time.perf_counter()
        if self.uses_embeddings:
            self.embedding.soft_match(results)
        apply_partitions(self.routing, results)
        apply_composers(self.routing.signals, results)
        if self.uses_embeddings:
            self.embedding.keep_top_k(results)
        apply_hazards(self.routing.signals.safety, results)
        if self.projections.apply(results):
            return (time.perf_counter() - started) * 1000.0
        return None
