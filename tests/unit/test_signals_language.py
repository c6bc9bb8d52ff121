"""The language signal with lingua over every language, on upstream's
``language/multilingual.yaml`` fragment and upstream's own detection cases: the ``en`` fallback
at 0.5, the floor, per-rule thresholds, at most one match, and the code check at load. The tests
that detect load lingua's models (about 1 GB, seconds): marked slow."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from vllm_sr.config.routing_signals import Signals
from vllm_sr.config.signal_families import LanguageSignal
from vllm_sr.router.deterministic import DeterministicSignals
from vllm_sr.router.language import detect_language, language_detector, language_floor
from vllm_sr.router.request_view import RequestView

FRAGMENTS = Path(__file__).parents[1] / "fixtures" / "upstream" / "fragments" / "signal"
SPANISH = "Hola, ¿cómo estás? Me llamo Juan y vivo en Madrid. ¿De dónde eres tú?"
GERMAN = "Guten Tag, wie geht es Ihnen? Ich heiße Hans und wohne in Berlin. Woher kommen Sie?"


def fragment(path: str) -> Signals:
    """An upstream fragment's ``routing.signals``, loaded unchanged."""
    doc = yaml.safe_load((FRAGMENTS / path).read_text())
    return Signals.model_validate(doc["routing"]["signals"])


def multilingual() -> DeterministicSignals:
    return DeterministicSignals(fragment("language/multilingual.yaml"))


def matched(sigs: DeterministicSignals, text: str) -> set[str]:
    out = sigs.evaluate(RequestView(text=text))
    return {name for (_, name), r in out.items() if r.matched}


@pytest.mark.slow  # loads lingua's models for every language (~1 GB, seconds)
@pytest.mark.parametrize(
    ("text", "code"),
    [
        (SPANISH, "es"),
        ("你好，世界", "zh"),
        ("Привет, как дела? Меня зовут Иван, и я живу в Москве.", "ru"),
        ("こんにちは、元気ですか？", "ja"),
        (GERMAN, "de"),
    ],
)
def test_detects_upstreams_examples(text: str, code: str) -> None:
    assert detect_language(text, 0.0)[0] == code


@pytest.mark.slow  # loads lingua's models for every language (~1 GB, seconds)
@pytest.mark.parametrize(
    "text", [SPANISH, GERMAN, "你好，世界", "Hello", "hola", "Hi", "12345", "Hello 世界 🌍 مرحبا"]
)
def test_one_pass_detection_agrees_with_linguas_two_calls(text: str) -> None:
    detector = language_detector()
    lang = detector.detect_language_of(text)
    code, confidence = detect_language(text, 1e-9)  # a floor that keeps every detection
    if lang is None:
        assert (code, confidence) == ("en", 0.5)
    else:
        assert code == lang.iso_code_639_1.name.lower()
        assert confidence == pytest.approx(detector.compute_language_confidence(text, lang))


@pytest.mark.slow  # loads lingua's models for every language (~1 GB, seconds)
@pytest.mark.parametrize("text", ["", "   \n\t  ", "1234567890 9876543210"])
def test_empty_or_undetected_text_is_english_at_half(text: str) -> None:
    assert detect_language(text, 0.0) == ("en", 0.5)


@pytest.mark.slow  # loads lingua's models for every language (~1 GB, seconds)
def test_below_the_floor_is_english_at_half() -> None:
    code, confidence = detect_language(SPANISH, 0.0)
    assert code == "es" and 0.3 <= confidence < 1.0
    assert detect_language(SPANISH, min(1.0, confidence + 0.01)) == ("en", 0.5)


@pytest.mark.slow  # loads lingua's models for every language (~1 GB, seconds)
def test_multilingual_fragment() -> None:
    sigs = multilingual()
    assert matched(sigs, "请帮我写一个排序算法") == {"zh"}
    assert matched(sigs, SPANISH) == {"es"}
    assert matched(sigs, GERMAN) == set()  # detected, but no rule is named de
    report = sigs.report(RequestView(text=SPANISH))
    assert report.language is not None and report.language[0] == "es"
    res = report.results[("language", "es")]
    assert (res.confidence, res.value) == (1.0, None)  # upstream records neither
    assert report.metrics["language"].confidence == report.language[1]


@pytest.mark.slow  # loads lingua's models for every language (~1 GB, seconds)
def test_an_en_rule_matches_the_fallback() -> None:
    sigs = DeterministicSignals(Signals(language=[LanguageSignal(name="en")]))
    assert matched(sigs, "") == {"en"}
    assert matched(sigs, "12345") == {"en"}


@pytest.mark.slow  # loads lingua's models for every language (~1 GB, seconds)
def test_rule_threshold_and_floor() -> None:
    _, confidence = detect_language(SPANISH, 0.0)
    strict = LanguageSignal(name="es", threshold=min(1.0, confidence + 0.01))
    loose = LanguageSignal(name="zh", threshold=0.2)
    assert language_floor([strict, loose]) == 0.2
    assert language_floor([LanguageSignal(name="es")]) == 0.0
    # The floor is the loose rule's 0.2; the strict rule's own threshold then refuses.
    assert matched(DeterministicSignals(Signals(language=[strict, loose])), SPANISH) == set()
    assert matched(
        DeterministicSignals(Signals(language=[LanguageSignal(name="es", threshold=0.3)])), SPANISH
    ) == {"es"}


def test_the_text_is_sampled_to_2048_characters() -> None:
    view = RequestView(text="a" * 5000)
    sample = view.sampled_text()
    assert sample.startswith("a" * 682) and sample.endswith("a" * 684)
    assert sample.count("[content sampled for routing signal evaluation]") == 2
    assert RequestView(text="short").sampled_text() == "short"


@pytest.mark.parametrize("name", ["EN", "xx", "english", "zh-CN"])
def test_names_must_be_lowercase_iso_codes_lingua_knows(name: str) -> None:
    with pytest.raises(ValidationError, match="ISO 639-1"):
        LanguageSignal(name=name)


@pytest.mark.parametrize("threshold", [-0.1, 1.5])
def test_threshold_is_between_zero_and_one(threshold: float) -> None:
    with pytest.raises(ValidationError):
        LanguageSignal(name="en", threshold=threshold)
