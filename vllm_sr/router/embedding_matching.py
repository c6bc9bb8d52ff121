"""How embedding signals score and match, as upstream's embedding classifier does
(``pkg/classification/embedding_classifier_scoring.go``, ``classifier_signal_output_policy.go``;
``ROUTER-REFERENCE.md`` §2.2), from ``global.model_catalog.embeddings.semantic.embedding_config``.

- Score: each signal's candidates are one prototype bank (``signals_prototypes``, with
  ``embedding_config.prototype_scoring``); ``aggregation_method: mean`` is the plain mean of
  the query's cosines to the prototypes, ``max`` and ``any`` the best/support blend
  (``best_weight`` x best + the rest x mean of the top ``top_m``). A signal matches ("hard")
  when its score reaches its ``threshold``.
- Soft matching (``enable_soft_matching``, default true): when no embedding signal matched hard,
  every one whose score reaches ``min_score_threshold`` (default 0.5) matches, confidence its
  score. It runs before partitions, as upstream's classifier does.
- ``top_k`` (default 1; 0 keeps all): after partitions and complexity composers, only the
  ``top_k`` matched embedding signals with the best confidence stay matched (ties by name).

Upstream evaluates every embedding rule once any decision uses the family, so both rules see
all of them (``QuestionPlan`` asks for every declared embedding signal then). A signal that is
unknown on the request (its deployment failed) takes no part.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from vllm_sr.router.rules import SignalKey
from vllm_sr.router.signals import FloatArray, SignalResult
from vllm_sr.router.signals_prototypes import PrototypeBank, PrototypeOptions

if TYPE_CHECKING:
    from vllm_sr.config.routing_signals import EmbeddingSignal
    from vllm_sr.config.schema import GlobalSection

DEFAULT_TOP_K = 1
DEFAULT_MIN_SCORE = 0.5
EMBEDDING = "embedding"


@dataclass(frozen=True)
class EmbeddingMatching:
    """``embedding_config``'s matching options, upstream's defaults filled in."""

    top_k: int = DEFAULT_TOP_K
    soft_matching: bool = True
    min_score: float = DEFAULT_MIN_SCORE
    prototypes: PrototypeOptions = field(default_factory=PrototypeOptions)

    @staticmethod
    def of(global_: GlobalSection | None) -> EmbeddingMatching:
        """From a ``GlobalSection`` (or None: upstream's defaults). As upstream's
        ``HNSWConfig.WithDefaults``: an omitted or negative ``top_k`` is 1, an omitted
        ``enable_soft_matching`` true, a ``min_score_threshold`` <= 0 is 0.5."""
        if global_ is None:
            return EmbeddingMatching()
        cfg = global_.model_catalog.embeddings.semantic.embedding_config
        top_k = cfg.top_k if cfg.top_k is not None and cfg.top_k >= 0 else DEFAULT_TOP_K
        min_score = cfg.min_score_threshold or 0.0
        return EmbeddingMatching(
            top_k=top_k,
            soft_matching=cfg.enable_soft_matching is not False,
            min_score=min_score if min_score > 0 else DEFAULT_MIN_SCORE,
            prototypes=PrototypeOptions.of(cfg.prototype_scoring),
        )

    def options(self, aggregation_method: str) -> PrototypeOptions:
        """The bank options of a signal: ``mean`` averages every prototype, unweighted."""
        if aggregation_method == "mean":
            return replace(self.prototypes, best_weight=0.0, top_m=0)
        return self.prototypes

    def bank(self, sig: EmbeddingSignal, vectors: FloatArray) -> PrototypeBank:
        """A signal's prototypes from its candidates' normalised embeddings (config order)."""
        return PrototypeBank(list(sig.candidates), vectors, self.options(sig.aggregation_method))

    def soft_match(self, results: dict[SignalKey, SignalResult]) -> list[str]:
        """When no embedding signal matched by its threshold, those scoring at least
        ``min_score`` match. -> the names soft-matched."""
        known = {k: r for k, r in results.items() if k[0] == EMBEDDING and r.unknown is None}
        if not self.soft_matching or any(r.matched for r in known.values()):
            return []
        out = []
        for key, res in sorted(known.items()):
            if res.value is not None and res.value >= self.min_score:
                results[key] = SignalResult(True, _clamp(res.value), res.value)
                out.append(key[1])
        return out

    def keep_top_k(self, results: dict[SignalKey, SignalResult]) -> list[str]:
        """Unmatch every matched embedding signal beyond the ``top_k`` best (by confidence,
        ties by name). -> the names unmatched."""
        if self.top_k == 0:
            return []
        matched = sorted(
            (k for k, r in results.items() if k[0] == EMBEDDING and r.matched),
            key=lambda k: (-results[k].confidence, k[1]),
        )
        for key in matched[self.top_k :]:
            results[key] = SignalResult(False, 0.0, results[key].value)
        return [k[1] for k in matched[self.top_k :]]


def embedding_score(sig: EmbeddingSignal, bank: PrototypeBank, query: FloatArray) -> SignalResult:
    """A signal's hard result on a normalised query: matched when its score reaches its
    ``threshold``; confidence the score (clamped to [0, 1]), value the score."""
    scored = bank.score(query)
    if scored.count == 0:
        return SignalResult.miss()
    return SignalResult(scored.score >= sig.threshold, _clamp(scored.score), scored.score)


def _clamp(x: float) -> float:
    return min(1.0, max(0.0, x))
