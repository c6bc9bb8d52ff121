"""Upstream's prototype scoring (``pkg/classification/prototype_*.go``), pure on vectors: the
example bank of one signal (complexity's hard or easy candidates, a preference's examples, a
KB label's exemplars) is reduced to a few representative examples, and a request's embedding
is scored against them.

Building a bank: examples are deduplicated by text; with prototype scoring enabled (upstream's
default) they are clustered greedily (the seed whose cluster of examples at cosine >= 0.9 is
largest goes first, ties by the seed's text), each cluster keeps its medoid (the member with
the best mean cosine to the cluster, ties by text), the medoids are ordered by cluster size,
mean cosine, text, and at most 8 are kept. Scoring: with the prototypes' cosines to the query
sorted best first, score = 0.75 * best + 0.25 * mean(top 2) (``best_weight``, ``top_m``; a
``top_m`` of 0 averages every prototype, as an embedding signal's ``mean`` does).

``PrototypeBanks`` holds one config generation's named banks (embedded in one pass); where
upstream runs a trained classifier, a bank margin becomes a probability through a logistic at
``TEMPERATURE`` (and a label set through a softmax at the same temperature).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy
import numpy.typing as npt

from vllm_sr.router.signals import FloatArray, normalize_rows

CLUSTER_SIMILARITY = 0.9
MAX_PROTOTYPES = 8
BEST_WEIGHT = 0.75
TOP_M = 2
TEMPERATURE = 0.05


@dataclass(frozen=True)
class PrototypeOptions:
    """``prototype_scoring`` with upstream's defaults (0 or omitted means the default)."""

    enabled: bool = True
    cluster_similarity_threshold: float = CLUSTER_SIMILARITY
    max_prototypes: int = MAX_PROTOTYPES
    best_weight: float = BEST_WEIGHT
    top_m: int = TOP_M

    @staticmethod
    def of(cfg: object | None) -> PrototypeOptions:
        """From an upstream ``PrototypeScoring`` model (or None), defaults filled in."""
        if cfg is None:
            return PrototypeOptions()
        enabled = getattr(cfg, "enabled", None)
        cluster = getattr(cfg, "cluster_similarity_threshold", None) or 0.0
        most = getattr(cfg, "max_prototypes", None) or 0
        weight = getattr(cfg, "best_weight", None) or 0.0
        top_m = getattr(cfg, "top_m", None) or 0
        return PrototypeOptions(
            enabled=enabled is not False,
            cluster_similarity_threshold=cluster if cluster > 0 else CLUSTER_SIMILARITY,
            max_prototypes=most if most > 0 else MAX_PROTOTYPES,
            best_weight=min(1.0, weight) if weight > 0 else BEST_WEIGHT,
            top_m=top_m if top_m > 0 else TOP_M,
        )


@dataclass(frozen=True)
class BankScore:
    score: float
    best: float
    support: float
    count: int


EMPTY = BankScore(0.0, 0.0, 0.0, 0)


class PrototypeBank:
    """One example set's prototypes (normalised rows)."""

    def __init__(
        self, texts: list[str], vectors: FloatArray, options: PrototypeOptions | None = None
    ) -> None:
        self.options = options or PrototypeOptions()
        seen: dict[str, int] = {}
        for i, text in enumerate(texts):
            seen.setdefault(text, i)
        keep = sorted(seen.values())
        self.texts = [texts[i] for i in keep]
        rows = normalize_rows(vectors[keep]) if keep else numpy.zeros((0, 1), numpy.float32)
        if not self.options.enabled or len(keep) <= 1:
            self.prototypes = rows
            return
        self.prototypes, self.texts = _medoids(self.texts, rows, self.options)

    def score(self, query: FloatArray) -> BankScore:
        """The bank's score for one normalised query vector. Routing scores a few dozen banks
        per chat on the event loop, so the few cosines are ranked as Python floats (the same
        float64 values and sums as :meth:`score_array`, without numpy's per-call overhead);
        a mean over more than two (whose summation order is numpy's) or a NaN (whose place in
        the order is numpy's) takes :meth:`score_array`."""
        if self.prototypes.shape[0] == 0:
            return EMPTY
        return self.rank((self.prototypes @ query).tolist(), query)

    def rank(self, sims: list[float], query: FloatArray) -> BankScore:
        """:meth:`score` from the prototypes' cosines to ``query`` (``prototypes @ query``)."""
        n = len(sims)
        top = min(self.options.top_m, n) if self.options.top_m > 0 else n
        total = sum(sims)
        if top > 2 or total != total:  # (a NaN cosine makes the sum NaN)
            return self.score_array(query)
        sims.sort(reverse=True)
        best = sims[0]
        support = best if top == 1 else (best + sims[1]) / 2.0
        weight = self.options.best_weight
        return BankScore(weight * best + (1.0 - weight) * support, best, support, n)

    def score_array(self, query: FloatArray) -> BankScore:
        """:meth:`score` in numpy, whatever ``top_m``."""
        if self.prototypes.shape[0] == 0:
            return EMPTY
        sims = numpy.sort(self.prototypes @ query)[::-1].astype(numpy.float64)
        best = float(sims[0])
        top = min(self.options.top_m, sims.size) if self.options.top_m > 0 else sims.size
        support = float(sims[:top].mean())
        weight = self.options.best_weight
        return BankScore(weight * best + (1.0 - weight) * support, best, support, int(sims.size))


def _medoids(
    texts: list[str], rows: FloatArray, options: PrototypeOptions
) -> tuple[FloatArray, list[str]]:
    sim = rows @ rows.T
    numpy.fill_diagonal(sim, 1.0)
    close = sim >= options.cluster_similarity_threshold
    remaining = set(range(len(texts)))
    reps: list[tuple[int, float, str, int]] = []  # (size, mean cosine, text, index)
    while remaining:
        best_seed = -1
        best_cluster: list[int] = []
        for seed in sorted(remaining):
            cluster = sorted(i for i in remaining if i == seed or close[seed, i])
            if (
                best_seed < 0
                or len(cluster) > len(best_cluster)
                or (len(cluster) == len(best_cluster) and texts[seed] < texts[best_seed])
            ):
                best_seed, best_cluster = seed, cluster
        medoid, medoid_avg = best_cluster[0], -2.0
        for i in best_cluster:
            avg = float(sim[i, best_cluster].mean())
            if avg > medoid_avg or (avg == medoid_avg and texts[i] < texts[medoid]):
                medoid, medoid_avg = i, avg
        reps.append((len(best_cluster), medoid_avg, texts[medoid], medoid))
        remaining -= set(best_cluster)
    reps.sort(key=lambda r: (-r[0], -r[1], r[2]))
    reps = reps[: options.max_prototypes]
    return rows[[r[3] for r in reps]], [r[2] for r in reps]


def logistic(margin: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, margin / TEMPERATURE))))


def softmax_best(scores: dict[str, float]) -> tuple[str, float]:
    top = max(scores.values())
    weights = {k: math.exp((s - top) / TEMPERATURE) for k, s in scores.items()}
    total = sum(weights.values())
    best = min(scores, key=lambda k: (-scores[k], k))
    return best, weights[best] / total


@dataclass(frozen=True)
class BankStacks:
    """The banks whose score needs at most their two best cosines (``top_m`` 1 or 2, or a
    bank of one or two prototypes), ranked together: the banks of one prototype count are
    stacked for one batched product (numpy's batched matmul runs each bank's own
    matrix-vector product: the same cosines as the bank alone); every bank's cosines then
    fill a row of one matrix (padded with -inf), sorted at once, and the two best of each
    row are blended in float64 with :meth:`PrototypeBank.rank`'s operations."""

    names: list[str]  # the banks, row by row
    stacks: list[tuple[FloatArray, int, int, int]]  # (prototypes, first row, rows, count)
    width: int  # the most prototypes of a bank
    weight: npt.NDArray[numpy.float64]  # each row's best_weight
    rest: npt.NDArray[numpy.float64]  # 1.0 - best_weight
    pairs: npt.NDArray[numpy.bool_]  # whether the support is the mean of the best two

    @staticmethod
    def of(banks: dict[str, PrototypeBank]) -> BankStacks:
        by_count: dict[int, list[str]] = {}
        for name, bank in banks.items():
            by_count.setdefault(bank.prototypes.shape[0], []).append(name)
        names: list[str] = []
        stacks = []
        for count, members in by_count.items():
            stack = numpy.stack([banks[n].prototypes for n in members])
            stacks.append((stack, len(names), len(members), count))
            names += members
        opts = [banks[n].options for n in names]
        counts = [banks[n].prototypes.shape[0] for n in names]
        return BankStacks(
            names,
            stacks,
            max(counts, default=1),
            numpy.array([o.best_weight for o in opts], dtype=numpy.float64),
            numpy.array([1.0 - o.best_weight for o in opts], dtype=numpy.float64),
            numpy.array([_top(o, n) == 2 for o, n in zip(opts, counts, strict=True)], bool),
        )

    def scores(self, query: FloatArray) -> tuple[list[float], list[int]]:
        """Every row's score, and the rows whose best cosine is NaN (numpy and Python order
        it differently) or zero (whose sign, among tied zeros, is the Python sort's): those
        the caller ranks through the bank's own :meth:`PrototypeBank.score`."""
        sims = numpy.full((len(self.names), self.width), -numpy.inf, dtype=numpy.float32)
        for stack, first, rows, count in self.stacks:
            sims[first : first + rows, :count] = stack @ query
        sims.sort(axis=1)  # (float32 cosines order as their float64 values do)
        top = sims[:, -2:].astype(numpy.float64) if self.width > 1 else sims.astype(numpy.float64)
        best = top[:, -1]
        support = numpy.where(self.pairs, (best + top[:, 0]) / 2.0, best)
        score = self.weight * best + self.rest * support
        odd = numpy.abs(best) > 0.0
        return score.tolist(), [] if odd.all() else numpy.flatnonzero(~odd).tolist()


@dataclass
class PrototypeBanks:
    """Named example sets (one bank per rule or label); their vectors arrive once
    (:meth:`take`)."""

    specs: dict[str, tuple[list[str], PrototypeOptions | None]] = field(default_factory=dict)
    banks: dict[str, PrototypeBank] = field(default_factory=dict)
    raw: dict[str, FloatArray] = field(default_factory=dict)
    # The banks :meth:`scores` ranks together, and the others (a mean over more than two
    # cosines) through their own :meth:`PrototypeBank.score`.
    stacked: BankStacks | None = None
    singles: list[str] = field(default_factory=list)

    def add(self, name: str, texts: Iterable[str], options: PrototypeOptions | None) -> None:
        self.specs[name] = ([t for t in texts if t], options)

    def texts(self) -> list[str]:
        return [t for texts, _ in self.specs.values() for t in texts]

    def take(self, vectors: FloatArray) -> None:
        start = 0
        for name, (texts, options) in self.specs.items():
            rows = vectors[start : start + len(texts)]
            start += len(texts)
            self.raw[name] = rows
            self.banks[name] = PrototypeBank(texts, rows, options)
        ranked = {n: b for n, b in self.banks.items() if b.prototypes.shape[0]}
        self.singles = [n for n, b in ranked.items() if _top(b.options, b.prototypes.shape[0]) > 2]
        self.stacked = BankStacks.of({n: ranked[n] for n in ranked if n not in self.singles})

    def scores(self, query: FloatArray) -> dict[str, float]:
        """Every bank's score for one query (what a chat's families read; 0.0 for a bank
        without examples), each bank's :meth:`PrototypeBank.score` to the bit, the banks
        ranked together (:class:`BankStacks`): a chat pays a few numpy calls instead of a few
        dozen Python rankings and BankScores."""
        out = dict.fromkeys(self.banks, 0.0)
        if self.stacked is not None and self.stacked.names:
            names = self.stacked.names
            scores, odd = self.stacked.scores(query)
            out.update(zip(names, scores, strict=True))
            for i in odd:
                out[names[i]] = self.banks[names[i]].score(query).score
        for name in self.singles:
            out[name] = self.banks[name].score(query).score
        return out

    def max_cos(self, name: str, query: FloatArray) -> float:
        rows = self.raw.get(name)
        if rows is None or rows.shape[0] == 0:
            return 0.0
        return float((rows @ query).max())


def _top(options: PrototypeOptions, count: int) -> int:
    """How many of a bank's best cosines its support averages."""
    return min(options.top_m, count) if options.top_m > 0 else count
