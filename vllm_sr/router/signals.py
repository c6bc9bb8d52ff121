"""Signal scoring, pure on data: keyword signals on the request text, embedding signals on the
request's embedding and the cached candidate embeddings, domain signals on a classification
answer. Each gives a :class:`SignalResult` (matched, confidence in [0, 1]).

Keyword methods (upstream names and defaults):

- ``regex``: each keyword is a regular expression matched on whole words (not inside a longer
  word), case-insensitive unless ``case_sensitive``; a present keyword has confidence 1.
- ``bm25``: each keyword is a document of a small corpus (the signal's keywords) and the request
  is the query; a keyword is present when its Okapi BM25 score (k1 1.2, b 0.75) reaches
  ``bm25_threshold``. Its confidence is the score over the score the keyword gets against its
  own text (1 when all of it appears), at most 1.
- ``ngram``: a keyword is present when some run of as many request words as the keyword has
  reaches ``ngram_threshold`` in character n-gram similarity (Jaccard over the multisets of
  ``ngram_arity``-grams, padded with arity-1 spaces), so "urgnt" still finds "urgent". Its
  confidence is that similarity.

Operators: OR matches when any keyword is present (confidence: the best present one); AND when
every one is (confidence: their mean); NOR when none is (confidence 1).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

import numpy

from vllm_sr.config.routing import DomainSignal, EmbeddingSignal, KeywordSignal

BM25_K1 = 1.2
BM25_B = 0.75
WORD_RE = re.compile(r"\w+")


@dataclass(frozen=True)
class SignalResult:
    matched: bool
    confidence: float

    @staticmethod
    def miss() -> SignalResult:
        return SignalResult(False, 0.0)


def combine(operator: str, present: list[tuple[bool, float]]) -> SignalResult:
    """A keyword signal's result from its keywords' (present, confidence)."""
    if operator == "NOR":
        hit = any(p for p, _ in present)
        return SignalResult(not hit, 0.0 if hit else 1.0)
    if operator == "AND":
        if present and all(p for p, _ in present):
            return SignalResult(True, sum(c for _, c in present) / len(present))
        return SignalResult.miss()
    confs = [c for p, c in present if p]
    return SignalResult(True, max(confs)) if confs else SignalResult.miss()


# -- keyword methods ------------------------------------------------------------------------


def whole_word(pattern: str) -> str:
    """``pattern`` matched only where it neither starts nor ends inside a word."""
    return rf"(?<!\w)(?:{pattern})(?!\w)"


class RegexKeywords:
    def __init__(self, sig: KeywordSignal) -> None:
        flags = 0 if sig.case_sensitive else re.IGNORECASE
        self.operator = sig.operator
        if sig.operator == "AND":
            self.each = [re.compile(whole_word(k), flags) for k in sig.keywords]
            self.any = None
        else:  # OR / NOR only ask "is any present": one alternation, one scan
            self.each = []
            self.any = re.compile("|".join(whole_word(k) for k in sig.keywords), flags)

    def score(self, text: str) -> SignalResult:
        if self.any is not None:
            return combine(self.operator, [(self.any.search(text) is not None, 1.0)])
        return combine(self.operator, [(p.search(text) is not None, 1.0) for p in self.each])


def words(text: str, case_sensitive: bool) -> list[str]:
    return WORD_RE.findall(text if case_sensitive else text.lower())


class Bm25Keywords:
    """The signal's keywords as a BM25 corpus; the request text is the query."""

    def __init__(self, sig: KeywordSignal) -> None:
        self.operator = sig.operator
        self.case_sensitive = sig.case_sensitive
        self.threshold = sig.bm25_threshold
        self.docs = [Counter(words(k, sig.case_sensitive)) for k in sig.keywords]
        n = len(self.docs)
        lengths = [sum(d.values()) for d in self.docs]
        self.avgdl = max(sum(lengths) / n, 1e-9)
        df: Counter[str] = Counter()
        for d in self.docs:
            df.update(d.keys())
        self.idf = {t: math.log((n - c + 0.5) / (c + 0.5) + 1.0) for t, c in df.items()}
        self.norms = [self._doc_score(set(d), i) for i, d in enumerate(self.docs)]

    def _doc_score(self, query: set[str], i: int) -> float:
        doc = self.docs[i]
        length = sum(doc.values())
        score = 0.0
        for term in query:
            f = doc.get(term, 0)
            if f:
                denom = f + BM25_K1 * (1.0 - BM25_B + BM25_B * length / self.avgdl)
                score += self.idf[term] * f * (BM25_K1 + 1.0) / denom
        return score

    def scores(self, text: str) -> list[float]:
        query = set(words(text, self.case_sensitive))
        return [self._doc_score(query, i) for i in range(len(self.docs))]

    def score(self, text: str) -> SignalResult:
        present = []
        for raw, norm in zip(self.scores(text), self.norms, strict=True):
            conf = min(1.0, raw / norm) if norm > 0 else 0.0
            present.append((raw > 0 and raw >= self.threshold, conf))
        return combine(self.operator, present)


def ngrams(text: str, arity: int) -> Counter[str]:
    padded = " " * (arity - 1) + text + " " * (arity - 1)
    return Counter(padded[i : i + arity] for i in range(len(padded) - arity + 1))


def ngram_similarity(a: Counter[str], b: Counter[str]) -> float:
    """Jaccard similarity of two n-gram multisets."""
    union = sum((a | b).values())
    return sum((a & b).values()) / union if union else 0.0


class NgramKeywords:
    def __init__(self, sig: KeywordSignal) -> None:
        self.operator = sig.operator
        self.case_sensitive = sig.case_sensitive
        self.threshold = sig.ngram_threshold
        self.arity = sig.ngram_arity
        self.keywords = []
        for k in sig.keywords:
            ws = words(k, sig.case_sensitive)
            text = " ".join(ws)
            self.keywords.append((len(ws), len(text), ngrams(text, self.arity)))

    def best(self, text: str) -> list[float]:
        """Per keyword, its best similarity over runs of request words of its length."""
        ws = words(text, self.case_sensitive)
        cache: dict[str, Counter[str]] = {}
        out = []
        for count, length, grams in self.keywords:
            best = 0.0
            for start in range(max(0, len(ws) - count + 1) if count else 0):
                window = " ".join(ws[start : start + count])
                # |A&B| <= min(|A|, |B|) and |A|B| >= max(|A|, |B|) (a text of n characters
                # has n + arity - 1 grams): skip runs whose size alone rules them out.
                small, big = sorted((len(window), length))
                pad = self.arity - 1
                if small + pad < self.threshold * (big + pad):
                    continue
                wg = cache.get(window)
                if wg is None:
                    wg = cache[window] = ngrams(window, self.arity)
                best = max(best, ngram_similarity(grams, wg))
                if best >= 1.0:
                    break
            out.append(best)
        return out

    def score(self, text: str) -> SignalResult:
        return combine(self.operator, [(s >= self.threshold, s) for s in self.best(text)])


KeywordMatcher = RegexKeywords | Bm25Keywords | NgramKeywords


def keyword_matcher(sig: KeywordSignal) -> KeywordMatcher:
    if sig.method == "bm25":
        return Bm25Keywords(sig)
    if sig.method == "ngram":
        return NgramKeywords(sig)
    return RegexKeywords(sig)


# -- embeddings -----------------------------------------------------------------------------


def normalize_rows(matrix: numpy.ndarray) -> numpy.ndarray:
    m = numpy.asarray(matrix, dtype=numpy.float32)
    if m.ndim == 1:
        m = m[None, :]
    norms = numpy.linalg.norm(m, axis=1, keepdims=True)
    result: numpy.ndarray = m / numpy.maximum(norms, 1e-12)
    return result


def cosine_similarities(query: numpy.ndarray, candidates: numpy.ndarray) -> numpy.ndarray:
    """Cosine of ``query`` with each row of ``candidates`` (rows already normalised)."""
    q = normalize_rows(query)[0]
    result: numpy.ndarray = candidates @ q
    return result


def aggregate(sims: numpy.ndarray, method: str, threshold: float) -> SignalResult:
    """max: the best similarity; mean: the mean; any: matched when some candidate reaches the
    threshold, confidence the first such candidate's similarity (config order)."""
    if sims.size == 0:
        return SignalResult.miss()
    if method == "any":
        over = numpy.flatnonzero(sims >= threshold)
        if over.size == 0:
            return SignalResult(False, _clamp(float(sims.max())))
        return SignalResult(True, _clamp(float(sims[over[0]])))
    value = float(sims.mean()) if method == "mean" else float(sims.max())
    return SignalResult(value >= threshold, _clamp(value))


def _clamp(x: float) -> float:
    return min(1.0, max(0.0, x))


def embedding_result(
    sig: EmbeddingSignal, query: numpy.ndarray, candidates: numpy.ndarray
) -> SignalResult:
    return aggregate(cosine_similarities(query, candidates), sig.aggregation_method, sig.threshold)


# -- domains --------------------------------------------------------------------------------


def domain_results(
    domains: list[DomainSignal], label: str, probabilities: dict[str, float]
) -> dict[str, SignalResult]:
    """One classification answer (top ``label`` and per-label ``probabilities``) -> each
    domain's result: matched when it is the top label with at least its threshold."""
    out = {}
    for dom in domains:
        p = float(probabilities.get(dom.name, 0.0))
        out[dom.name] = SignalResult(label == dom.name and p >= dom.threshold, _clamp(p))
    return out
