"""Signal scoring on data: keyword methods and operators, embedding aggregation, domains."""

from __future__ import annotations

import numpy
import pytest

from vllm_sr.config.routing import DomainSignal, EmbeddingSignal, KeywordSignal
from vllm_sr.router.signals import (
    SignalResult,
    aggregate,
    domain_results,
    embedding_result,
    keyword_matcher,
    ngram_similarity,
    ngrams,
)


def kw(**fields: object) -> KeywordSignal:
    return KeywordSignal.model_validate({"name": "k", **fields})


# -- regex ----------------------------------------------------------------------------------


def test_regex_matches_whole_words_case_insensitively() -> None:
    m = keyword_matcher(kw(keywords=["code", "debug"]))
    assert m.score("Please DEBUG this") == SignalResult(True, 1.0)
    assert not m.score("my encoded decoder").matched  # inside longer words: no
    assert m.score("code.").matched and m.score("(code)").matched


def test_regex_case_sensitive() -> None:
    m = keyword_matcher(kw(keywords=["SSN"], case_sensitive=True))
    assert m.score("my SSN leaked").matched
    assert not m.score("my ssn leaked").matched


def test_regex_keywords_are_patterns_and_symbols_work_at_edges() -> None:
    m = keyword_matcher(kw(keywords=[r"c\+\+", r"user\.name@domain\.com", r"err(or)?s?"]))
    assert m.score("I write C++ daily").matched
    assert m.score("mail user.name@domain.com now").matched
    assert m.score("two errors here").matched
    assert not m.score("cplusplus").matched


def test_regex_operators_and_or_nor() -> None:
    words = ["ssn", "credit card"]
    both, one, none = "my SSN and credit card", "my SSN only", "nothing here"
    and_ = keyword_matcher(kw(keywords=words, operator="AND"))
    or_ = keyword_matcher(kw(keywords=words, operator="OR"))
    nor = keyword_matcher(kw(keywords=words, operator="NOR"))
    assert [and_.score(t).matched for t in (both, one, none)] == [True, False, False]
    assert [or_.score(t).matched for t in (both, one, none)] == [True, True, False]
    assert [nor.score(t).matched for t in (both, one, none)] == [False, False, True]
    assert nor.score(none).confidence == 1.0


# -- bm25 -----------------------------------------------------------------------------------


def test_bm25_finds_present_keywords_at_the_upstream_threshold() -> None:
    sig = kw(method="bm25", keywords=["code", "function", "debug", "algorithm", "refactor"])
    assert sig.bm25_threshold == 0.1
    m = keyword_matcher(sig)
    scores = m.scores("please debug this function")  # type: ignore[union-attr]
    assert scores[1] > 0.1 and scores[2] > 0.1
    assert scores[0] == scores[3] == scores[4] == 0.0
    assert m.score("please debug this function") == SignalResult(True, 1.0)
    assert not m.score("what a lovely day").matched


def test_bm25_confidence_is_the_share_of_a_multiword_keyword_present() -> None:
    m = keyword_matcher(kw(method="bm25", keywords=["credit card number", "ssn"]))
    full = m.score("my credit card number")
    part = m.score("my credit is good")
    assert full.matched and full.confidence == pytest.approx(1.0)
    assert part.matched and 0.2 < part.confidence < 0.5


def test_bm25_threshold_raises_the_bar() -> None:
    m = keyword_matcher(
        kw(method="bm25", keywords=["credit card number", "ssn"], bm25_threshold=2.0)
    )
    assert not m.score("my credit is good").matched


# -- ngram ----------------------------------------------------------------------------------


def test_ngram_similarity_exact_and_disjoint() -> None:
    assert ngram_similarity(ngrams("urgent", 3), ngrams("urgent", 3)) == 1.0
    assert ngram_similarity(ngrams("urgent", 3), ngrams("xyz", 3)) == 0.0


def test_ngram_tolerates_typos_at_the_upstream_threshold() -> None:
    sig = kw(method="ngram", keywords=["urgent", "immediate", "asap", "emergency"])
    assert (sig.ngram_threshold, sig.ngram_arity) == (0.4, 3)
    m = keyword_matcher(sig)
    typo = m.score("this is urgnt please")
    assert typo.matched and 0.4 <= typo.confidence < 1.0
    assert m.score("URGENT").confidence == 1.0
    assert not m.score("a calm and relaxed question").matched


def test_ngram_multiword_keywords_compare_runs_of_words() -> None:
    m = keyword_matcher(kw(method="ngram", keywords=["social security"], operator="AND"))
    assert m.score("my social securty number").matched
    assert not m.score("hello world").matched


def test_ngram_threshold_one_means_exact() -> None:
    m = keyword_matcher(kw(method="ngram", keywords=["urgent"], ngram_threshold=1.0))
    assert m.score("urgent!").matched
    assert not m.score("urgnt").matched


# -- embeddings -----------------------------------------------------------------------------


SIMS = numpy.array([0.9, 0.5, 0.1], dtype=numpy.float32)


@pytest.mark.parametrize(
    ("method", "threshold", "matched", "confidence"),
    [
        ("max", 0.8, True, 0.9),
        ("max", 0.95, False, 0.9),
        ("mean", 0.5, True, 0.5),
        ("mean", 0.6, False, 0.5),
        ("any", 0.4, True, 0.9),  # the first candidate over the threshold (config order)
        ("any", 0.95, False, 0.9),
    ],
)
def test_aggregation(method: str, threshold: float, matched: bool, confidence: float) -> None:
    res = aggregate(SIMS, method, threshold)
    assert res.matched is matched
    assert res.confidence == pytest.approx(confidence)


def test_any_takes_the_first_candidate_over_the_threshold() -> None:
    res = aggregate(numpy.array([0.2, 0.6, 0.9], dtype=numpy.float32), "any", 0.5)
    assert res == SignalResult(True, pytest.approx(0.6))  # type: ignore[arg-type]


def test_embedding_result_is_cosine_to_candidates() -> None:
    sig = EmbeddingSignal(name="e", threshold=0.7, candidates=["a", "b"])
    cands = numpy.array([[1.0, 0.0], [0.0, 1.0]], dtype=numpy.float32)
    res = embedding_result(sig, numpy.array([3.0, 3.0], dtype=numpy.float32), cands)
    assert res.matched and res.confidence == pytest.approx(0.7071, abs=1e-4)
    res = embedding_result(sig, numpy.array([1.0, 3.0], dtype=numpy.float32), cands)
    assert res.matched and res.confidence == pytest.approx(0.9487, abs=1e-4)
    assert not embedding_result(sig, numpy.array([-1.0, -1.0], dtype=numpy.float32), cands).matched


# -- domains --------------------------------------------------------------------------------


def test_domain_matches_the_top_label_with_its_threshold() -> None:
    math = DomainSignal(name="math", description="Mathematics")
    law = DomainSignal(name="law", description="Law", threshold=0.9)
    probs = {"math": 0.7, "law": 0.3}
    out = domain_results([math, law], "math", probs)
    assert out["math"] == SignalResult(True, 0.7)
    assert not out["law"].matched
    out = domain_results([math, law], "law", {"math": 0.2, "law": 0.8})
    assert not out["law"].matched  # top label, but under its threshold 0.9
    assert not out["math"].matched
