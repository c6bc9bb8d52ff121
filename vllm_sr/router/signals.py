"""Signal scoring, pure on data: keyword signals on the request text, embedding signals on the
request's embedding and the cached candidate embeddings, domain signals on a classification
answer. Each gives a :class:`SignalResult`.

Keyword methods, as upstream (``pkg/classification/keyword_classifier*.go``):

- omitted: each keyword is a literal, wrapped in ASCII word boundaries (``\\b``: a neighbour
  in [0-9A-Za-z_] blocks it) when it has a letter, digit or underscore and no Han character,
  case-insensitive unless ``case_sensitive``;
- ``regex``: each keyword is a raw regular expression searched anywhere in the text
  (case-insensitive unless ``case_sensitive``), not word-bounded;
- with either, ``fuzzy_match`` also counts a keyword as present when some word of the text
  (a run of Unicode letters/digits, lowercased) is within ``fuzzy_threshold`` edits
  (Levenshtein; 0 means upstream's default 2) of the lowercased keyword;
- ``bm25``: each keyword is a document of a small corpus (the signal's keywords) and the request
  is the query; a keyword is present when its Okapi BM25 score (k1 1.2, b 0.75) reaches
  ``bm25_threshold``;
- ``ngram``: a keyword is present when some run of as many request words as the keyword has
  reaches ``ngram_threshold`` in character n-gram similarity (Jaccard over the multisets of
  ``ngram_arity``-grams, padded with arity-1 spaces), so "urgnt" still finds "urgent".
  (bm25 and ngram approximate upstream's Rust crates; their scores are not the crates' own.)

Operators: OR matches when any keyword is present, AND when every one is, NOR when none is.
A matching keyword signal has confidence 1.0 (upstream records none, and a rule leaf reads a
missing confidence as 1.0).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy
import numpy.typing as npt

from vllm_sr.router.unknown import Unknown

if TYPE_CHECKING:
    from vllm_sr.config.routing_signals import DomainSignal, KeywordSignal, Signals
    from vllm_sr.router.family_step import StepReport
    from vllm_sr.router.request_view import RequestView

BM25_K1 = 1.2
BM25_B = 0.75
DEFAULT_FUZZY_THRESHOLD = 2
WORD_RE = re.compile(r"\w+")
# Runs of letters and digits (not underscore): the words fuzzy matching compares with.
LETTER_DIGIT_RUN_RE = re.compile(r"[^\W_]+")
# RE2's \b is ASCII-only: a boundary between [0-9A-Za-z_] and anything else (or an edge).
_ASCII_WORD = "[0-9A-Za-z_]"
ASCII_BOUNDARY = rf"(?:(?<={_ASCII_WORD})(?!{_ASCII_WORD})|(?<!{_ASCII_WORD})(?={_ASCII_WORD}))"


@dataclass(slots=True, unsafe_hash=True)
class SignalResult:
    """One signal's outcome, never changed once made (:data:`MISS` and :data:`HIT` are
    shared). Not a frozen dataclass: a frozen ``__init__`` sets each field through
    ``object.__setattr__`` (0.7 µs against 0.2 µs per result, and a routed chat makes about a
    hundred); ``unsafe_hash`` keeps it hashable by value, as it was.

    ``confidence`` is what a plain rule leaf takes when the signal matched (upstream's
    ``SignalConfidences`` entry, 1.0 where the family records none).
    ``value`` is upstream's ``SignalValues`` entry, None where the family records none: the
    raw number a leaf with a ``predicate`` compares (upstream reads the confidence instead
    when there is no value). ``unknown`` is set when the signal could not be evaluated on
    this request (vllm_sr/router/unknown.py): it then does not match and has no value."""

    matched: bool
    confidence: float
    value: float | None = None
    unknown: Unknown | None = None

    def __reduce__(
        self,
    ) -> tuple[type[SignalResult], tuple[bool, float, float | None, Unknown | None]]:
        """Pickled as its constructor's arguments (a signal process's report carries a few
        dozen): half the time of the slots' state both ways."""
        return (SignalResult, (self.matched, self.confidence, self.value, self.unknown))

    @staticmethod
    def miss() -> SignalResult:
        """Not matched (one shared value: results are immutable, and a signal process's
        report then pickles it once)."""
        return MISS

    @staticmethod
    def unknown_because(why: Unknown) -> SignalResult:
        """The result of a signal that could not be evaluated: not matched, no value."""
        return SignalResult(False, 0.0, None, why)


HIT = SignalResult(True, 1.0)
MISS = SignalResult(False, 0.0)


def combine(operator: str, present: list[bool]) -> SignalResult:
    """A keyword signal's result from whether each of its keywords is present."""
    if operator == "NOR":
        return SignalResult.miss() if any(present) else HIT
    if operator == "AND":
        return HIT if present and all(present) else SignalResult.miss()
    return HIT if any(present) else SignalResult.miss()


# -- keyword methods ------------------------------------------------------------------------


def has_han(text: str) -> bool:
    return HAN_RE.search(text) is not None


# Unicode's Han script (as Go's unicode.Han), code point ranges.
HAN_RANGES = (
    (0x2E80, 0x2E99),
    (0x2E9B, 0x2EF3),
    (0x2F00, 0x2FD5),
    (0x3005, 0x3005),
    (0x3007, 0x3007),
    (0x3021, 0x3029),
    (0x3038, 0x303B),
    (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
    (0xF900, 0xFA6D),
    (0xFA70, 0xFAD9),
    (0x16FE2, 0x16FE3),
    (0x16FF0, 0x16FF1),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2EBE0),
    (0x2F800, 0x2FA1D),
    (0x30000, 0x323AF),
)
HAN_RE = re.compile(
    "[" + "".join(f"{re.escape(chr(lo))}-{re.escape(chr(hi))}" for lo, hi in HAN_RANGES) + "]"
)


def literal_pattern(keyword: str) -> str:
    """Upstream's pattern for a literal keyword (no method): escaped, and ASCII word-bounded
    when it has a letter/digit/underscore and no Han character."""
    quoted = re.escape(keyword)
    wordish = any(ch.isalpha() or ch.isdecimal() or ch == "_" for ch in keyword)
    if wordish and not has_han(keyword):
        return ASCII_BOUNDARY + quoted + ASCII_BOUNDARY
    return quoted


def levenshtein(a: str, b: str) -> int:
    """Edit distance over code points (insert, delete, substitute: 1 each)."""
    if len(a) > len(b):
        a, b = b, a
    if not a:
        return len(b)
    prev = list(range(len(a) + 1))
    for j, cb in enumerate(b, 1):
        cur = [j]
        for i, ca in enumerate(a, 1):
            cur.append(min(prev[i] + 1, cur[i - 1] + 1, prev[i - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def split_runs(run: str) -> list[str]:
    """A ``[^\\W_]+`` run split where it holds a character that is a number but neither a
    letter nor a decimal digit (Python's \\w has those; Go's IsLetter/IsDigit do not)."""
    if run.isalpha() or run.isdecimal() or all(c.isalpha() or c.isdecimal() for c in run):
        return [run]
    return "".join(c if c.isalpha() or c.isdecimal() else " " for c in run).split()


def letter_digit_runs(text: str) -> list[str]:
    """The text's runs of Unicode letters and decimal digits."""
    return [w for run in LETTER_DIGIT_RUN_RE.findall(text) for w in split_runs(run)]


def lower_words(text: str) -> list[str]:
    """The text's runs of letters and digits, lowercased (upstream's fuzzy-match words)."""
    return [w.lower() for w in letter_digit_runs(text)]


def fuzzy_present(keyword_lower: str, words: list[str], threshold: int) -> bool:
    n = len(keyword_lower)
    return any(
        abs(len(w) - n) <= threshold and levenshtein(w, keyword_lower) <= threshold for w in words
    )


class RegexKeywords:
    """Literal keywords (no method) or raw patterns (method regex), with optional fuzzy
    matching."""

    def __init__(self, sig: KeywordSignal) -> None:
        flags = 0 if sig.case_sensitive else re.IGNORECASE
        self.operator = sig.operator
        literal = sig.method is None
        patterns = [literal_pattern(k) if literal else k for k in sig.keywords]
        self.fuzzy = sig.fuzzy_match
        # 0 means upstream's default, as its keyword classifier reads it.
        self.fuzzy_threshold = sig.fuzzy_threshold or DEFAULT_FUZZY_THRESHOLD
        self.lowered = [k.lower() for k in sig.keywords]
        self.each = [re.compile(p, flags) for p in patterns]
        # OR / NOR without fuzzy only ask "is any present": one alternation, one scan. Raw
        # patterns stay apart (their group numbers would shift inside an alternation).
        self.any = (
            re.compile("|".join(f"(?:{p})" for p in patterns), flags)
            if literal and not self.fuzzy and sig.operator != "AND"
            else None
        )

    def present(self, text: str) -> list[bool]:
        words = lower_words(text) if self.fuzzy else []
        out = []
        for pattern, lowered in zip(self.each, self.lowered, strict=True):
            hit = pattern.search(text) is not None
            if not hit and self.fuzzy:
                hit = fuzzy_present(lowered, words, self.fuzzy_threshold)
            out.append(hit)
        return out

    def score(self, text: str) -> SignalResult:
        if self.any is not None:
            return combine(self.operator, [self.any.search(text) is not None])
        return combine(self.operator, self.present(text))


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
        return combine(self.operator, [s > 0 and s >= self.threshold for s in self.scores(text)])


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
        return combine(self.operator, [s >= self.threshold for s in self.best(text)])


KeywordMatcher = RegexKeywords | Bm25Keywords | NgramKeywords


def keyword_matcher(sig: KeywordSignal) -> KeywordMatcher:
    if sig.method == "bm25":
        return Bm25Keywords(sig)
    if sig.method == "ngram":
        return NgramKeywords(sig)
    return RegexKeywords(sig)


class KeywordFamily:
    """The keyword signals of a generation, as a CPU-step family (``family_step``)."""

    family = "keyword"
    heavy = False
    loaded = True

    def __init__(self, matchers: dict[str, KeywordMatcher]) -> None:
        self.matchers = matchers

    @staticmethod
    def build(signals: Signals) -> KeywordFamily | None:
        matchers = {s.name: keyword_matcher(s) for s in signals.keywords}
        return KeywordFamily(matchers) if matchers else None

    def load(self) -> None:
        pass

    def keys(self, names: frozenset[str] | None) -> set[tuple[str, str]]:
        return {("keyword", n) for n in self.matchers if names is None or n in names}

    def evaluate(
        self, view: RequestView, names: frozenset[str] | None, out: StepReport
    ) -> float | None:
        for name, matcher in self.matchers.items():
            if names is None or name in names:
                out.results[("keyword", name)] = matcher.score(view.text)
        return None


# -- embeddings -----------------------------------------------------------------------------

FloatArray = npt.NDArray[numpy.float32]
"""Embedding rows (or one row): float32, as the worker sends them."""


def normalize_rows(matrix: FloatArray) -> FloatArray:
    """Each row over its L2 norm (at least 1e-12). The norm is ``numpy.linalg.norm``'s own
    computation for a real matrix along one axis (the square root of the summed squares:
    the same bits), without its argument handling (a chat's read normalises a few rows)."""
    m = numpy.asarray(matrix, dtype=numpy.float32)
    if m.ndim == 1:
        m = m[None, :]
    norms = numpy.sqrt(numpy.add.reduce(m * m, axis=1, keepdims=True))
    result: FloatArray = (m / numpy.maximum(norms, 1e-12)).astype(numpy.float32, copy=False)
    return result


# -- domains --------------------------------------------------------------------------------


def domain_result(dom: DomainSignal, label: str, p: float) -> SignalResult:
    """A domain's result from the classification's top ``label`` and the domain's
    probability ``p``: matched when it is the top label with at least its threshold."""
    return SignalResult(label == dom.name and p >= dom.threshold, min(1.0, max(0.0, p)))
