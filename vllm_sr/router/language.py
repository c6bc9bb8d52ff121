"""The ``language`` signal family: one lingua detection (every language it knows) of the
request's sampled text. Below the floor (the smallest non-zero rule threshold, else 0.3),
empty or undetected text is ``en`` at 0.5. At most one rule matches: the first named like the
code whose threshold (if any) the confidence reaches. Confidence 1.0; no value
(upstream ``language_classifier.go``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from vllm_sr.router.family_step import Names, SignalKey, StepReport
from vllm_sr.router.signals import MISS, SignalResult

if TYPE_CHECKING:
    from lingua import LanguageDetector

    from vllm_sr.config.routing_signals import Signals
    from vllm_sr.config.signal_families import LanguageSignal
    from vllm_sr.router.request_view import RequestView

DEFAULT_LANGUAGE_THRESHOLD = 0.3
FALLBACK_LANGUAGE = ("en", 0.5)
HIT = SignalResult(True, 1.0)

# -- language detection ---------------------------------------------------------------------

_detector: LanguageDetector | None = None
_detector_lock = threading.Lock()


def language_detector(*, preload: bool = False) -> LanguageDetector:
    """The process's lingua detector over every language, built on first use. Without
    ``preload`` its models load lazily, per script, on the detections that need them.

    Loading holds the GIL (lingua's Rust code does not release it): about 1 GB and 10-20 s
    for every language, during which no other Python thread runs. So ``vllm-sr serve``
    preloads the models before its event loop starts when the config has a language rule
    (:func:`preload_language_models`); otherwise a first detection would stall the loop."""
    global _detector
    with _detector_lock:
        if _detector is None:
            from lingua import LanguageDetectorBuilder

            builder = LanguageDetectorBuilder.from_all_languages()
            if preload:
                builder = builder.with_preloaded_language_models()
            _detector = builder.build()
        return _detector


def preload_language_models() -> None:
    """Load every language model now (see :func:`language_detector`)."""
    language_detector(preload=True)


def detect_language(text: str, floor: float) -> tuple[str, float]:
    """(ISO 639-1 code, confidence); ``en`` at 0.5 for empty, undetected or below-``floor``
    text (``floor`` <= 0 means 0.3)."""
    minimum = floor if floor > 0 else DEFAULT_LANGUAGE_THRESHOLD
    if not text.strip():
        return FALLBACK_LANGUAGE
    # One pass: lingua's detect_language_of is the top confidence value unless the top two tie
    # (then none), and compute_language_confidence re-derives that same value.
    values = language_detector().compute_language_confidence_values(text)
    if not values or (len(values) > 1 and values[1].value == values[0].value):
        return FALLBACK_LANGUAGE
    code = values[0].language.iso_code_639_1.name.lower()
    confidence = float(values[0].value)
    if not code or confidence < minimum:
        return FALLBACK_LANGUAGE
    return code, confidence


def language_floor(rules: Iterable[LanguageSignal]) -> float:
    """The smallest non-zero threshold (0 when none is set)."""
    set_ = [r.threshold for r in rules if r.threshold > 0]
    return min(set_) if set_ else 0.0


class LanguageFamily:
    """One detection of the sampled text; the first rule named like its code may match."""

    family = "language"
    heavy = True
    loaded = True  # lingua loads lazily per script; serve preloads every model

    def __init__(self, rules: list[LanguageSignal]) -> None:
        self.rules = rules
        self.floor = language_floor(rules)

    @staticmethod
    def build(signals: Signals) -> LanguageFamily | None:
        return LanguageFamily(list(signals.language)) if signals.language else None

    def load(self) -> None:
        detect_language("warm up the language detector", 0.0)

    def keys(self, names: Names | None) -> set[SignalKey]:
        return {("language", r.name) for r in self.rules}

    def evaluate(self, view: RequestView, names: Names | None, out: StepReport) -> float:
        code, confidence = detect_language(view.sampled_text(), self.floor)
        out.language = (code, confidence)
        winner = next((r for r in self.rules if r.name == code), None)
        for lang in self.rules:
            hit = lang is winner and (lang.threshold <= 0 or confidence >= lang.threshold)
            out.results.setdefault(("language", lang.name), HIT if hit else MISS)
        return confidence
