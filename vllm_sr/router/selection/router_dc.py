"""The ``router_dc`` selector (upstream's ``pkg/selection/router_dc.go`` at 3d48f8c9: query-to-
model dual-contrastive matching), its scoring pure on vectors, and where its vectors come from
here.

Settings: one router_dc configuration per routing config, as upstream's registry holds one
selector: ``global.router.model_selection.router_dc`` (upstream's defaults: temperature 0.07,
min_similarity 0.3, use_capabilities true) with, from the FIRST decision whose type is
router_dc and that has a block, its ``temperature`` (when above 0), ``require_descriptions``
and ``use_capabilities`` (those two as written: absent is false). ``hybrid`` uses the same one.

Each model of the config (providers models and modelCards) is described by its modelCard's
``description``, then ``Capabilities: a, b`` when ``use_capabilities``, joined by ``. ``; a
model with capabilities but no text so far gets ``Model: <name>. Capabilities: ...``; a model
with neither has no vector (``require_descriptions`` logs those, as upstream).

Scoring (upstream's): per candidate, sigmoid(cos(query, model) / temperature); a candidate
without a vector scores ``min_similarity`` and cannot win. The best (first on ties) wins when
it reaches ``min_similarity``; else, or with no query vector, the first modelRef ("default
candidate selection", scores 1/n). The reported scores are the softmax of the similarities at
the temperature.

Vectors: the decision deployment's embedding model (the one the embedding signals and the
semantic cache use): the query's is the one routing already computed for the chat (else one
bundle exchange), the descriptions' are asked once and kept. Upstream embeds with its own
embedding model (Qwen3-Embedding at 1024 dimensions by default); ``dimension_size`` is not read
at request time there either."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy
from numpy.typing import NDArray

from vllm_sr.errors import VllmSrError
from vllm_sr.router import bundle
from vllm_sr.router.bundle import BUNDLE_PATH
from vllm_sr.router.cache import embedding as cache_embedding
from vllm_sr.router.cache.store import normalise
from vllm_sr.router.selection.selectors import Selection

if TYPE_CHECKING:
    from collections.abc import Sequence

    from vllm_sr.config.routing import ModelCard, ModelRef, Routing
    from vllm_sr.config.routing_selection import RouterDCSettings
    from vllm_sr.config.upstream_learning import RouterDC
    from vllm_sr.router.route import Exchange

log = logging.getLogger("vllm_sr.router")

Vector = NDArray[numpy.float32]

TASK = "router_dc_models"


@dataclass(frozen=True)
class RouterDCConfig:
    temperature: float = 0.07
    min_similarity: float = 0.3
    require_descriptions: bool = False
    use_capabilities: bool = True

    @staticmethod
    def of(global_: RouterDC | None, first_block: RouterDCSettings | None) -> RouterDCConfig:
        """Upstream's ``buildRouterDCSelectionConfig``: the global settings over upstream's
        defaults, then the first router_dc decision's block."""
        base = RouterDCConfig()
        g = global_
        temperature = g.temperature if g and g.temperature is not None else base.temperature
        min_sim = g.min_similarity if g and g.min_similarity is not None else base.min_similarity
        require = bool(g.require_descriptions) if g else base.require_descriptions
        caps = g.use_capabilities if g and g.use_capabilities is not None else True
        if first_block is not None:
            if first_block.temperature:
                temperature = first_block.temperature
            require = bool(first_block.require_descriptions)
            caps = bool(first_block.use_capabilities)
        return RouterDCConfig(temperature, min_sim, require, caps)


def description_text(name: str, card: ModelCard | None, use_capabilities: bool) -> str:
    """What upstream embeds for a model (``buildDescriptionText``)."""
    description = (card.description or "").strip() if card is not None else ""
    capabilities = list(card.capabilities) if card is not None else []
    parts = [description] if description else []
    if use_capabilities and capabilities:
        parts.append("Capabilities: " + ", ".join(capabilities))
    if not parts and capabilities:
        parts = [f"Model: {name}", "Capabilities: " + ", ".join(capabilities)]
    return ". ".join(parts)


def model_texts(routing: Routing, models: Sequence[str], config: RouterDCConfig) -> dict[str, str]:
    """Each model's text (those with none left out; logged when descriptions are required)."""
    cards = {c.name: c for c in routing.model_cards}
    out = {}
    for name in models:
        text = description_text(name, cards.get(name), config.use_capabilities)
        if text:
            out[name] = text
    missing = [m for m in models if m not in out]
    if config.require_descriptions and missing:
        log.error(
            "router_dc requires descriptions but %d models are missing them: %s",
            len(missing),
            ", ".join(missing),
        )
    return out


def similarity(query: Vector, model: Vector, temperature: float) -> float:
    """sigmoid(cos / temperature)."""
    n = min(len(query), len(model))
    q, m = query[:n], model[:n]
    nq, nm = float(numpy.linalg.norm(q)), float(numpy.linalg.norm(m))
    cos = 0.0 if nq == 0 or nm == 0 else float(q @ m) / (nq * nm)
    return 1.0 / (1.0 + math.exp(-cos / temperature))


def softmax(scores: dict[str, float], temperature: float) -> dict[str, float]:
    top = max(scores.values())
    exp = {k: math.exp((v - top) / temperature) for k, v in scores.items()}
    total = sum(exp.values())
    return {k: v / total for k, v in exp.items()}


def router_dc(
    refs: Sequence[ModelRef],
    config: RouterDCConfig,
    query: Vector | None,
    vectors: dict[str, Vector],
) -> Selection:
    if query is None:
        return _default(refs, "no query embedding")
    scores: dict[str, float] = {}
    best: ModelRef | None = None
    best_score = 0.0
    for ref in refs:
        vec = vectors.get(ref.model)
        if vec is None:
            scores[ref.model] = config.min_similarity
            continue
        score = similarity(query, vec, config.temperature)
        scores[ref.model] = score
        if score > best_score:
            best, best_score = ref, score
    if best is None or best_score < config.min_similarity:
        return _default(refs, "no model above similarity threshold")
    return Selection(
        best,
        "router_dc",
        f"router_dc: query-model contrastive similarity {best_score:.4f} "
        f"(temperature {config.temperature:g})",
        softmax(scores, config.temperature),
    )


def _default(refs: Sequence[ModelRef], why: str) -> Selection:
    share = 1.0 / len(refs)
    return Selection(
        refs[0],
        "router_dc",
        f"router_dc: default candidate selection: {why}: the first modelRef",
        {r.model: share for r in refs},
    )


class ModelVectors:
    """The models' description vectors on the decision deployment: asked in one bundle the
    first time a chat needs them, kept for the config's life (a failed ask is retried by the
    next chat)."""

    def __init__(
        self,
        texts: dict[str, str],
        deployment: str | None,
        exchange: Exchange | None,
        timeout_ms: float | None,
    ) -> None:
        self.texts = texts
        self.deployment = deployment
        self.exchange = exchange
        self.timeout_ms = timeout_ms
        self.vectors: dict[str, Vector] | None = None
        self.exchanges = 0

    @property
    def usable(self) -> bool:
        return bool(self.deployment) and self.exchange is not None

    async def _ask(self, texts: list[str], task: str) -> list[Vector] | None:
        assert self.deployment and self.exchange is not None
        body = bundle.request([bundle.embed_task(task, texts)])
        self.exchanges += 1
        try:
            status, answer = await self.exchange(
                self.deployment, BUNDLE_PATH, body, self.timeout_ms
            )
        except VllmSrError as exc:
            log.info("router_dc: embedding on %s failed: %s", self.deployment, exc.message)
            return None
        rows = bundle.task_embeddings(answer, task) if status == 200 else None
        return rows if rows is not None and len(rows) == len(texts) else None

    async def models(self) -> dict[str, Vector]:
        if self.vectors is None and self.usable and self.texts:
            names = list(self.texts)
            rows = await self._ask([self.texts[n] for n in names], TASK)
            if rows is not None:
                self.vectors = {n: normalise(v) for n, v in zip(names, rows, strict=True)}
        return self.vectors or {}

    async def query(
        self, text: str, holder: cache_embedding.QueryEmbedding | None = None
    ) -> Vector | None:
        """The chat's query vector: routing's own answer when it asked the decision deployment
        (the chat's ``holder``, as the semantic cache reads it), else one exchange."""
        if not self.usable or not text.strip():
            return None
        assert self.exchange is not None and self.deployment
        if holder is None or holder.deployment != self.deployment or holder.text != text:
            holder = cache_embedding.QueryEmbedding(self.deployment, text)
        return await holder.vector(self.exchange, self.timeout_ms)
