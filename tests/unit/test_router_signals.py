"""Signal scoring on data: keyword methods (upstream literal default, regex, fuzzy, bm25,
ngram) and operators on upstream's keyword fragments and cases, domains (embedding scoring:
test_embedding_matching)."""

from __future__ import annotations

import pickle
from pathlib import Path

import yaml

from vllm_sr.config.routing_signals import DomainSignal, KeywordSignal, Signals
from vllm_sr.router.signals import (
    MISS,
    SignalResult,
    domain_result,
    keyword_matcher,
    levenshtein,
    lower_words,
    ngram_similarity,
    ngrams,
)
from vllm_sr.router.unknown import Unknown

FRAGMENTS = Path(__file__).parents[1] / "fixtures" / "upstream" / "fragments" / "signal"


def kw(**fields: object) -> KeywordSignal:
    return KeywordSignal.model_validate({"name": "k", "operator": "OR", **fields})


def fragment(path: str) -> dict[str, KeywordSignal]:
    """An upstream keyword fragment's rules by name, loaded unchanged."""
    doc = yaml.safe_load((FRAGMENTS / path).read_text())
    signals = Signals.model_validate(doc["routing"]["signals"])
    return {s.name: s for s in signals.keywords}


# -- literal keywords (no method: upstream's default) ----------------------------------------


def test_regex_fragment_literal_keywords_are_word_bounded_and_case_insensitive() -> None:
    rules = fragment("keyword/regex.yaml")
    urgent = keyword_matcher(rules["urgent_keywords"])
    sensitive = keyword_matcher(rules["sensitive_data_keywords"])
    assert rules["urgent_keywords"].method is None
    assert urgent.score("This is URGENT, reply ASAP") == SignalResult(True, 1.0)
    assert not urgent.score("the urgently needed fix").matched  # inside a longer word
    assert sensitive.score("what is my Social Security number?").matched  # phrase, any case
    assert sensitive.score("my ssn: 123").matched and sensitive.score("(password)").matched
    assert not sensitive.score("passwords are stored hashed").matched


def test_literal_keywords_are_not_patterns() -> None:
    m = keyword_matcher(kw(keywords=["a.b"]))
    assert m.score("see a.b").matched
    assert not m.score("see axb").matched  # "." is a literal dot


def test_literal_word_bounds_are_ascii_as_in_re2() -> None:
    # Upstream wraps a keyword with a word character in RE2's \b, which sees only
    # [0-9A-Za-z_]: after a trailing "+" or "é" a boundary needs an ASCII word character next.
    cpp = keyword_matcher(kw(keywords=["c++"]))
    assert not cpp.score("I write C++ daily").matched
    assert cpp.score("I write C++11").matched
    cafe = keyword_matcher(kw(keywords=["café"]))
    assert not cafe.score("un café noir").matched
    assert cafe.score("cafés").matched
    # A keyword with a Han character is not bounded at all.
    assert keyword_matcher(kw(keywords=["代码"])).score("写代码吧").matched
    assert keyword_matcher(kw(keywords=["c"])).score("a c b").matched
    assert not keyword_matcher(kw(keywords=["c"])).score("abc_").matched


def test_literal_case_sensitive() -> None:
    m = keyword_matcher(kw(keywords=["SSN"], case_sensitive=True))
    assert m.score("my SSN leaked").matched
    assert not m.score("my ssn leaked").matched


def test_literal_operators_and_or_nor() -> None:
    words = ["ssn", "credit card"]
    both, one, none = "my SSN and credit card", "my SSN only", "nothing here"
    and_ = keyword_matcher(kw(keywords=words, operator="AND"))
    or_ = keyword_matcher(kw(keywords=words, operator="OR"))
    nor = keyword_matcher(kw(keywords=words, operator="NOR"))
    assert [and_.score(t).matched for t in (both, one, none)] == [True, False, False]
    assert [or_.score(t).matched for t in (both, one, none)] == [True, True, False]
    assert [nor.score(t).matched for t in (both, one, none)] == [False, False, True]
    # Upstream records no keyword confidence: a rule leaf reads 1.0, and there is no value.
    assert and_.score(both) == nor.score(none) == SignalResult(True, 1.0, None)


# -- method regex: raw patterns, not word-bounded ------------------------------------------


def test_regex_keywords_are_raw_patterns_searched_anywhere() -> None:
    m = keyword_matcher(kw(method="regex", keywords=[r"c\+\+", r"user\.name@domain\.com"]))
    assert m.score("I write C++ daily").matched
    assert m.score("mail user.name@domain.com now").matched
    assert not m.score("cplusplus").matched
    # No word bounds: a pattern also hits inside a longer word, as upstream's raw RE2 does.
    assert keyword_matcher(kw(method="regex", keywords=["code"])).score("encoded").matched
    assert (
        keyword_matcher(kw(method="regex", keywords=[r"err(or)?s?"], operator="AND"))
        .score("two errors")
        .matched
    )


def test_regex_case_sensitive() -> None:
    m = keyword_matcher(kw(method="regex", keywords=[r"\bSSN\b"], case_sensitive=True))
    assert m.score("my SSN").matched and not m.score("my ssn").matched


# -- fuzzy matching (upstream's keyword_accuracy_test.go cases) ------------------------------


def test_fuzzy_or_finds_typos_within_the_threshold() -> None:
    m = keyword_matcher(kw(keywords=["urgent", "emergency", "asap", "immediate"], fuzzy_match=True))
    assert m.score("This is urgent").matched
    assert m.score("This is urgnt please help").matched  # 1 deletion
    assert m.score("This is an emergncy situation").matched
    assert m.score("I need this immediatly").matched
    assert not m.score("a calm and relaxed question").matched


def test_fuzzy_and_needs_every_keyword_each_within_the_threshold() -> None:
    m = keyword_matcher(
        kw(keywords=["SSN", "password"], operator="AND", fuzzy_match=True, fuzzy_threshold=1)
    )
    assert m.score("My SSN and password leaked").matched
    assert m.score("My SNN and password leaked").matched
    assert m.score("My SNN and pasword leaked").matched
    assert not m.score("My SSN is here").matched
    assert not m.score("My password is here").matched
    assert not m.score("My S and password").matched  # 2 edits


def test_fuzzy_nor_rejects_typos_too() -> None:
    m = keyword_matcher(
        kw(keywords=["spam", "scam", "fraud"], operator="NOR", fuzzy_match=True, fuzzy_threshold=1)
    )
    assert m.score("This is a normal message").matched
    assert not m.score("This is spam content").matched
    assert not m.score("This is spem content").matched
    assert not m.score("This looks like a scm").matched


def test_fuzzy_threshold_zero_means_upstreams_default_two() -> None:
    m = keyword_matcher(kw(keywords=["urgent"], fuzzy_match=True, fuzzy_threshold=0))
    assert m.score("urgnet").matched  # 2 edits (a transposition)
    assert not keyword_matcher(kw(keywords=["urgent"])).score("urgnet").matched


def test_fuzzy_words_are_letter_digit_runs() -> None:
    assert lower_words("Hello_World, 42x! Ünï") == ["hello", "world", "42x", "ünï"]
    assert levenshtein("kitten", "sitting") == 3 and levenshtein("", "abc") == 3


def test_fuzzy_with_regex_method() -> None:
    m = keyword_matcher(kw(method="regex", keywords=["emergency"], fuzzy_match=True))
    assert m.score("an emergancy").matched


# -- bm25 -----------------------------------------------------------------------------------


def test_bm25_finds_present_keywords_at_the_upstream_threshold() -> None:
    sig = fragment("keyword/nlp.yaml")["code_keywords"]
    assert (sig.method, sig.bm25_threshold) == ("bm25", 0.1)
    m = keyword_matcher(sig)
    scores = m.scores("please debug this function")  # type: ignore[union-attr]
    assert scores[1] > 0.1 and scores[2] > 0.1
    assert scores[0] == scores[3] == scores[4] == 0.0
    assert m.score("please debug this function") == SignalResult(True, 1.0)
    assert not m.score("what a lovely day").matched


def test_bm25_a_multiword_keyword_is_present_with_part_of_its_words() -> None:
    m = keyword_matcher(kw(method="bm25", keywords=["credit card number", "ssn"]))
    assert m.score("my credit card number") == SignalResult(True, 1.0)
    assert m.score("my credit is good") == SignalResult(True, 1.0)  # confidence: upstream's 1.0
    assert not m.score("my debit is good").matched


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
    sig = fragment("keyword/nlp.yaml")["urgent_keywords"]
    assert (sig.method, sig.ngram_threshold, sig.ngram_arity) == ("ngram", 0.4, 3)
    m = keyword_matcher(sig)
    assert m.score("this is urgnt please") == SignalResult(True, 1.0)
    assert m.best("this is urgnt please")[0] < 1.0  # type: ignore[union-attr]
    assert m.score("URGENT").matched
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


# -- domains --------------------------------------------------------------------------------


def test_domain_matches_the_top_label_with_its_threshold() -> None:
    math = DomainSignal(name="math", description="Mathematics")
    law = DomainSignal(name="law", description="Law", threshold=0.9)
    assert domain_result(math, "math", 0.7) == SignalResult(True, 0.7)  # no domain value
    assert not domain_result(law, "math", 0.3).matched
    assert not domain_result(law, "law", 0.8).matched  # top label, but under its threshold 0.9
    assert domain_result(law, "law", 0.9).matched
    assert not domain_result(math, "law", 0.2).matched
    assert domain_result(math, "math", 1.5).confidence == 1.0  # clamped to [0, 1]


def test_signal_result_pickles_to_an_equal_result_and_hashes_by_value() -> None:
    results = [
        SignalResult(True, 0.75, 1.5),
        SignalResult(False, 0.0),
        SignalResult.unknown_because(Unknown("timeout", "http_504: slow")),
        MISS,
    ]
    back = pickle.loads(pickle.dumps(results, protocol=pickle.HIGHEST_PROTOCOL))
    assert back == results
    assert [type(r) for r in back] == [SignalResult] * 4
    assert back[2].unknown == Unknown("timeout", "http_504: slow")
    # a report's shared MISS is pickled once and comes back as one object
    twice = pickle.loads(pickle.dumps([MISS, MISS], protocol=pickle.HIGHEST_PROTOCOL))
    assert twice[0] is twice[1]
    assert hash(SignalResult(True, 0.75, 1.5)) == hash(back[0])
    assert len({SignalResult(False, 0.0), MISS}) == 1
