"""Classification: by labelled examples (nearest label centroid, any embedding model) or by a
model's own head (``id2label``).

By examples, each label's centroid is the L2-normalised mean of its examples' embeddings; an
input gets the label whose centroid is nearest in cosine, and a probability per label:
``softmax(cosine / TEMPERATURE)``. With ``TEMPERATURE = 0.05`` a cosine lead of 0.05 is worth
a factor e (~2.7) in odds, which separates topics for MiniLM-style encoders without making
every answer 1.0. Centroids are cached per label set (an LRU of ``CENTROID_CACHE_SIZE``).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import numpy

from vllm_sr.errors import InvalidRequest
from vllm_sr.jsontypes import json_type

TEMPERATURE = 0.05
CENTROID_CACHE_SIZE = 128
MAX_LABELS = 256
MAX_EXAMPLES = 1024  # over all labels of one label set

LabelKey = tuple[tuple[str, tuple[str, ...]], ...]


def parse_labels(value: Any, field: str = "labels") -> LabelKey:
    """Validate ``{name: [example, ...]}``; the key keeps the caller's label order."""
    if not isinstance(value, dict) or not value:
        raise InvalidRequest(
            f"{field}: expected a non-empty object {{label: [example phrases]}}, "
            f"got {type(value).__name__}"
        )
    if len(value) > MAX_LABELS:
        raise InvalidRequest(f"{field}: {len(value)} labels; at most {MAX_LABELS} accepted")
    items: list[tuple[str, tuple[str, ...]]] = []
    total = 0
    for name, examples in value.items():
        if isinstance(examples, str):
            examples = [examples]
        if (
            not isinstance(examples, list)
            or not examples
            or not all(isinstance(e, str) for e in examples)
        ):
            raise InvalidRequest(
                f"{field}.{name}: expected a non-empty list of example strings, "
                f"got {json_type(examples)}"
            )
        total += len(examples)
        items.append((name, tuple(examples)))
    if total > MAX_EXAMPLES:
        raise InvalidRequest(f"{field}: {total} examples; at most {MAX_EXAMPLES} accepted")
    return tuple(items)


def centroids_from(embeddings: numpy.ndarray, key: LabelKey) -> numpy.ndarray:
    """One normalised centroid per label from the examples' embeddings (in key order)."""
    out = numpy.empty((len(key), embeddings.shape[1]), dtype=numpy.float32)
    start = 0
    for i, (_, examples) in enumerate(key):
        mean = embeddings[start : start + len(examples)].mean(axis=0)
        out[i] = mean / max(float(numpy.linalg.norm(mean)), 1e-12)
        start += len(examples)
    return out


def softmax(x: numpy.ndarray) -> numpy.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    e = numpy.exp(shifted)
    result: numpy.ndarray = e / e.sum(axis=-1, keepdims=True)
    return result


def centroid_probabilities(embeddings: numpy.ndarray, centroids: numpy.ndarray) -> numpy.ndarray:
    """Each (normalised) embedding's label probabilities: a softmax of its cosines to the
    labels' centroids at :data:`TEMPERATURE`, a row per embedding."""
    return softmax((embeddings @ centroids.T) / TEMPERATURE)


def by_centroids(
    embeddings: numpy.ndarray, centroids: numpy.ndarray, names: list[str]
) -> list[dict[str, Any]]:
    return _results(centroid_probabilities(embeddings, centroids), names)


def by_logits(logits: numpy.ndarray, names: list[str]) -> list[dict[str, Any]]:
    return _results(softmax(logits.astype(numpy.float64)), names)


def by_sigmoid(logits: numpy.ndarray, names: list[str]) -> list[dict[str, object]]:
    """A multi-label head's rows: each label's sigmoid (independent scores; ``label`` is the
    highest)."""
    return _results(1.0 / (1.0 + numpy.exp(-logits.astype(numpy.float64))), names)


def by_token_maxima(maxima: numpy.ndarray, names: list[str]) -> list[dict[str, Any]]:
    """A token head's rows (each label's highest token probability): ``label`` is the label
    with the highest, ``probabilities`` those maxima (they need not sum to 1)."""
    return _results(maxima.astype(numpy.float64), names)


def _results(probs: numpy.ndarray, names: list[str]) -> list[dict[str, Any]]:
    """Each row's best label and per-label probabilities (a row's ``tolist``: the same
    Python floats as ``float`` of each element, in one call; the router reads one per
    chat)."""
    out = []
    for i, row in enumerate(probs):
        best = int(row.argmax())
        out.append(
            {
                "index": i,
                "label": names[best],
                "probabilities": dict(zip(names, row.tolist(), strict=True)),
            }
        )
    return out


class CentroidCache:
    """LRU of label set -> centroids; concurrent misses on one label set share one compute."""

    def __init__(self, size: int = CENTROID_CACHE_SIZE) -> None:
        self.size = size
        self._done: OrderedDict[LabelKey, numpy.ndarray] = OrderedDict()
        self._inflight: dict[LabelKey, asyncio.Future[numpy.ndarray]] = {}
        self.hits = 0
        self.misses = 0

    async def get(
        self, key: LabelKey, compute: Callable[[LabelKey], Awaitable[numpy.ndarray]]
    ) -> numpy.ndarray:
        found = self._done.get(key)
        if found is not None:
            self._done.move_to_end(key)
            self.hits += 1
            return found
        pending = self._inflight.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        self.misses += 1
        future: asyncio.Future[numpy.ndarray] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            value = await compute(key)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                future.cancel()
            else:
                future.set_exception(exc)
                future.exception()  # mark retrieved: a lone caller re-raises it below
            raise
        finally:
            self._inflight.pop(key, None)
        future.set_result(value)
        self._done[key] = value
        while len(self._done) > self.size:
            self._done.popitem(last=False)
        return value
