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
from vllm_sr.router.signals import HAN_RANGES, SignalResult, split_runs

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


def _class(ranges: tuple[tuple[int, int], ...]) -> str:
    return "[" + "".join(f"{re.escape(chr(lo))}-{re.escape(chr(hi))}" for lo, hi in ranges) + "]"


CJK_CLASS = _class(HAN_RANGES + _CJK_RANGES)
CJK_RE = re.compile(CJK_CLASS)
# One unit: a CJK character, or a run of other letters/digits.
UNIT_RE = re.compile(rf"{CJK_CLASS}|(?:(?!{CJK_CLASS})[^\W_])+")
ASCII_UNIT_RE = re.compile(r"[A-Za-z0-9]+")


def is_cjk(ch: str) -> bool:
    """Han, Hiragana, Katakana or Hangul."""
    return CJK_RE.match(ch) is not None


def _letter_or_digit(ch: str) -> bool:
    return ch.isalpha() or ch.isdecimal()


def text_units(text: str) -> int:
    """CJK characters count one each; runs of other letters/digits count one."""
    if text.isascii():
        return sum(1 for _ in ASCII_UNIT_RE.finditer(text))
    count = 0
    for unit in UNIT_RE.findall(text):
        count += 1 if len(unit) == 1 and CJK_RE.match(unit) else len(split_runs(unit))
    return count


def _blocks(ch: str) -> bool:
    return _letter_or_digit(ch) and not is_cjk(ch)


def keyword_occurrences(text: str, keyword: str, bounded: bool | None = None) -> int:
    """Non-overlapping occurrences; ``bounded`` (default: the keyword has no CJK character)
    counts only those with no non-CJK letter/digit on either side."""
    if not keyword:
        return 0
    if bounded is None:
        bounded = CJK_RE.search(keyword) is None
    count = 0
    start = 0
    while True:
        idx = text.find(keyword, start)
        if idx < 0:
            return count
        end = idx + len(keyword)
        before_ok = idx == 0 or not _blocks(text[idx - 1])
        after_ok = end == len(text) or not _blocks(text[end])
        if not bounded or (before_ok and after_ok):
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
        keywords = src.keywords if src.case_sensitive else [k.lower() for k in src.keywords]
        self.keywords = [(k, CJK_RE.search(k) is None) for k in keywords]
        self.needs_units = sig.feature.type == "density"

    def count(self, text: str, user_text: str) -> int:
        src = self.sig.feature.source
        if src.type == "regex":
            assert self.regex is not None
            return sum(1 for _ in self.regex.finditer(text))
        if src.type == "keyword_set":
            candidate = text if src.case_sensitive else text.lower()
            return sum(keyword_occurrences(candidate, k, bounded) for k, bounded in self.keywords)
        if src.type == "sequence":
            return 1 if sequence_found(text, src.sequences, src.case_sensitive) else 0
        return len(user_text.encode("utf-8"))  # text_bytes

    def value(self, text: str, user_text: str, units: int | None = None) -> float:
        kind = self.sig.feature.type
        if kind == "sequence":
            src = self.sig.feature.source
            return 1.0 if sequence_found(text, src.sequences, src.case_sensitive) else 0.0
        if kind == "density":
            units = text_units(text) if units is None else units
            return self.count(text, user_text) / units if units > 0 else 0.0
        n = self.count(text, user_text)
        if kind == "exists":
            return 1.0 if n > 0 else 0.0
        return float(n)

    def result(self, text: str, user_text: str, units: int | None = None) -> SignalResult:
        """``text``: the request text; ``user_text``: the current user text (text_bytes);
        ``units``: ``text_units(text)`` when the caller has it already."""
        value = self.value(text, user_text, units)
        pred = self.sig.predicate
        if pred is None:
            matched = value > 0
            return SignalResult(matched, 1.0 if matched else 0.0, value)
        if not pred.holds(value):
            return SignalResult(False, 0.0, value)
        distance = abs(value - pred.first_bound())
        confidence = max(0.5, 1.0 / (1.0 + math.exp(-4.0 * distance)))
        return SignalResult(True, confidence, value)
