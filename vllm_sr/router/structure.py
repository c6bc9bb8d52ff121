"""The structure signal, pure on text, as upstream (``classification/structure_classifier.go``,
``structure_text.go``):

- a source counts: ``regex`` non-overlapping matches (case-insensitive unless
  ``case_sensitive``); ``keyword_set`` non-overlapping occurrences of each keyword (case-folded
  unless ``case_sensitive``; a keyword without CJK characters counts only where neither
  neighbour is a non-CJK letter or digit); ``sequence`` 1 when some sequence's markers occur in
  order; ``text_bytes`` the UTF-8 length of the current user text;
- the feature's value: ``exists`` 0/1, ``count`` the count, ``density`` count / text units (CJK
  characters each, plus runs of other letters/digits), ``sequence`` 0/1;
- matched: with no predicate when the value is above 0, else when every bound holds;
- confidence: 0 unmatched, 1 with no predicate, else max(0.5, sigmoid(4 * |value - b|)) with
  b the first bound of gt, gte, lt, lte. The value is recorded for every rule.

Regular expressions run on Python's ``re``, not RE2: ``\\d``, ``\\w``, ``\\s`` and ``\\b`` are
Unicode-aware here where RE2's are ASCII, and RE2-only syntax (``\\p{Han}``) is refused at load.
"""

from __future__ import annotations

import math
import re

from vllm_sr.config.signal_families import StructureSignal
from vllm_sr.router.signals import SignalResult, is_han

_CJK_RANGES = (
    (0x1100, 0x11FF),  # Hangul Jamo
    (0x302E, 0x302F),
    (0x3041, 0x3096),  # Hiragana
    (0x309D, 0x309F),
    (0x30A1, 0x30FA),  # Katakana
    (0x30FD, 0x30FF),
    (0x3131, 0x318E),  # Hangul compatibility Jamo
    (0x31F0, 0x31FF),
    (0x3200, 0x321E),
    (0x3260, 0x327E),
    (0x32D0, 0x32FE),
    (0x3300, 0x3357),
    (0xA960, 0xA97C),
    (0xAC00, 0xD7A3),  # Hangul syllables
    (0xD7B0, 0xD7C6),
    (0xD7CB, 0xD7FB),
    (0xFF66, 0xFF6F),
    (0xFF71, 0xFF9D),
    (0xFFA0, 0xFFBE),
    (0xFFC2, 0xFFC7),
    (0xFFCA, 0xFFCF),
    (0xFFD2, 0xFFD7),
    (0xFFDA, 0xFFDC),
    (0x1AFF0, 0x1B16F),  # Kana supplement / extended
    (0x1F200, 0x1F200),
)


def is_cjk(ch: str) -> bool:
    """Han, Hiragana, Katakana or Hangul."""
    if is_han(ch):
        return True
    o = ord(ch)
    return any(lo <= o <= hi for lo, hi in _CJK_RANGES)


def _letter_or_digit(ch: str) -> bool:
    return ch.isalpha() or ch.isdecimal()


def text_units(text: str) -> int:
    """CJK characters count one each; runs of other letters/digits count one."""
    count = 0
    in_word = False
    for ch in text:
        if is_cjk(ch):
            count += 1
            in_word = False
        elif _letter_or_digit(ch):
            if not in_word:
                count += 1
                in_word = True
        else:
            in_word = False
    return count


def _blocks(ch: str) -> bool:
    return _letter_or_digit(ch) and not is_cjk(ch)


def keyword_occurrences(text: str, keyword: str) -> int:
    if not keyword:
        return 0
    bounded = not any(is_cjk(ch) for ch in keyword)
    count = 0
    start = 0
    while True:
        idx = text.find(keyword, start)
        if idx < 0:
            return count
        end = idx + len(keyword)
        if not bounded or (
            (idx == 0 or not _blocks(text[idx - 1]))
            and (end == len(text) or not _blocks(text[end]))
        ):
            count += 1
        start = end


def sequence_found(text: str, sequences: list[list[str]], case_sensitive: bool) -> bool:
    candidate = text if case_sensitive else text.lower()
    for seq in sequences:
        if not seq:
            continue
        pos = 0
        for marker in seq:
            m = marker if case_sensitive else marker.lower()
            idx = candidate.find(m, pos)
            if idx < 0:
                break
            pos = idx + len(m)
        else:
            return True
    return False


class StructureRule:
    def __init__(self, sig: StructureSignal) -> None:
        self.sig = sig
        src = sig.feature.source
        self.regex: re.Pattern[str] | None = None
        if src.type == "regex":
            self.regex = re.compile(src.pattern or "", 0 if src.case_sensitive else re.IGNORECASE)
        self.keywords = src.keywords if src.case_sensitive else [k.lower() for k in src.keywords]

    def count(self, text: str, user_text: str) -> int:
        src = self.sig.feature.source
        if src.type == "regex":
            assert self.regex is not None
            return sum(1 for _ in self.regex.finditer(text))
        if src.type == "keyword_set":
            candidate = text if src.case_sensitive else text.lower()
            return sum(keyword_occurrences(candidate, k) for k in self.keywords)
        if src.type == "sequence":
            return 1 if sequence_found(text, src.sequences, src.case_sensitive) else 0
        return len(user_text.encode("utf-8"))  # text_bytes

    def value(self, text: str, user_text: str) -> float:
        kind = self.sig.feature.type
        if kind == "sequence":
            src = self.sig.feature.source
            return 1.0 if sequence_found(text, src.sequences, src.case_sensitive) else 0.0
        if kind == "density":
            units = text_units(text)
            return self.count(text, user_text) / units if units > 0 else 0.0
        n = self.count(text, user_text)
        if kind == "exists":
            return 1.0 if n > 0 else 0.0
        return float(n)

    def result(self, text: str, user_text: str) -> SignalResult:
        """``text``: the request text; ``user_text``: the current user text (text_bytes)."""
        value = self.value(text, user_text)
        pred = self.sig.predicate
        if pred is None:
            matched = value > 0
            return SignalResult(matched, 1.0 if matched else 0.0, value)
        if not pred.holds(value):
            return SignalResult(False, 0.0, value)
        distance = abs(value - pred.first_bound())
        confidence = max(0.5, 1.0 / (1.0 + math.exp(-4.0 * distance)))
        return SignalResult(True, confidence, value)
