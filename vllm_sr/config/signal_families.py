"""pydantic models of the deterministic signal families under ``routing.signals`` that read the
request's text: ``context``, ``structure``, ``conversation`` and ``language`` (``metadata`` and
``role_bindings``, which read the request's metadata and identity, are in ``signal_metadata``).

Field names, defaults and load-time rules are upstream's (vLLM Semantic Router,
``pkg/config/signal_config.go`` and ``validator_{structure,conversation,language,
numeric_predicate}.go``), so an upstream file loads unchanged and a file upstream refuses is
refused here too. One difference on purpose: a ``context`` token count
upstream cannot parse makes upstream skip the rule at request time (it never matches); here it
is a load error naming the value, since such a rule can only be a mistake.

The rules that span several entries (unique names) are checked in ``routing_rules``; the
evaluation lives in ``vllm_sr.router.deterministic``.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_TOKEN_COUNT_RE = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, populate_by_name=True)


# -- shared ---------------------------------------------------------------------------------


class NumericPredicate(_Strict):
    """Bounds on a signal's value; every bound set must hold (upstream ``NumericPredicate``)."""

    gt: float | None = None
    """The value must be greater than this."""

    gte: float | None = None
    """The value must be at least this."""

    lt: float | None = None
    """The value must be less than this."""

    lte: float | None = None
    """The value must be at most this."""

    @model_validator(mode="after")
    def _contract(self) -> NumericPredicate:
        bounds = {"gt": self.gt, "gte": self.gte, "lt": self.lt, "lte": self.lte}
        for key, value in bounds.items():
            if value is not None and not math.isfinite(value):
                raise ValueError(f"predicate.{key} is {value}: predicate values must be finite")
        if all(v is None for v in bounds.values()):
            raise ValueError("predicate must set at least one of gt, gte, lt, lte")
        if self.gt is not None and self.gte is not None:
            raise ValueError("predicate cannot set both gt and gte")
        if self.lt is not None and self.lte is not None:
            raise ValueError("predicate cannot set both lt and lte")
        low, low_strict = (self.gt, True) if self.gt is not None else (self.gte, False)
        high, high_strict = (self.lt, True) if self.lt is not None else (self.lte, False)
        if (
            low is not None
            and high is not None
            and (low > high or (low == high and (low_strict or high_strict)))
        ):
            raise ValueError(f"predicate defines an empty range ({self.describe()})")
        return self

    def holds(self, value: float) -> bool:
        """Every bound holds for ``value`` (NaN and infinities never do)."""
        if not math.isfinite(value):
            return False
        return (
            (self.gt is None or value > self.gt)
            and (self.gte is None or value >= self.gte)
            and (self.lt is None or value < self.lt)
            and (self.lte is None or value <= self.lte)
        )

    def first_bound(self) -> float:
        """The first bound set, in the order gt, gte, lt, lte (upstream's structure confidence
        measures the distance to it)."""
        for value in (self.gt, self.gte, self.lt, self.lte):
            if value is not None:
                return value
        raise AssertionError("a validated predicate has a bound")

    def describe(self) -> str:
        parts = [
            f"{k} {v:g}"
            for k, v in (("gt", self.gt), ("gte", self.gte), ("lt", self.lt), ("lte", self.lte))
            if v is not None
        ]
        return ", ".join(parts)


# -- context --------------------------------------------------------------------------------


def parse_token_count(raw: str | int | float | None) -> int:
    """Upstream's ``TokenCount``: trimmed, upper-cased, an optional ``K`` (x1000) or ``M``
    (x1,000,000) suffix, decimals allowed, truncated to an int; empty (or omitted) is 0.
    Raises ValueError when the text is not such a number."""
    if raw is None:
        return 0
    if isinstance(raw, bool):
        raise ValueError(f"token count {raw!r} is not a number")
    if isinstance(raw, int | float):
        text = repr(raw) if isinstance(raw, float) else str(raw)
    else:
        text = raw
    s = text.strip().upper()
    if s == "":
        return 0
    mult = 1
    if s.endswith("K"):
        mult, s = 1000, s[:-1]
    elif s.endswith("M"):
        mult, s = 1_000_000, s[:-1]
    if not _TOKEN_COUNT_RE.match(s):
        raise ValueError(
            f"token count {text!r} is not a number with an optional K or M suffix (e.g. 8K, "
            f"1.5M, 32000)"
        )
    value = float(s) * mult
    if not math.isfinite(value):
        raise ValueError(f"token count {text!r} is not finite")
    return int(value)


class ContextSignal(_Strict):
    """Matches when the request's estimated token count lies in [min_tokens, max_tokens]."""

    name: str = Field(min_length=1, max_length=128)
    """The rule's name; decisions name it as {type: context, name: NAME}."""

    min_tokens: str | int | float | None = None
    """The least token count (inclusive): a number, optionally with K (x1000) or M
    (x1,000,000), e.g. 32K. Omitted = 0."""

    max_tokens: str | int | float | None = None
    """The most token count (inclusive), in the same form. Omitted = 0, as upstream: the rule
    then matches only an empty request, so set it."""

    description: str | None = Field(default=None, max_length=2000)
    """Free text for people."""

    @field_validator("min_tokens", "max_tokens", mode="before")
    @classmethod
    def _parses(cls, value: object) -> object:
        if value is not None and not isinstance(value, str | int | float):
            raise ValueError(f"token count {value!r} is not a number or a string like 32K")
        parse_token_count(value)
        return value

    @property
    def min_count(self) -> int:
        return parse_token_count(self.min_tokens)

    @property
    def max_count(self) -> int:
        return parse_token_count(self.max_tokens)


# -- structure ------------------------------------------------------------------------------

StructureFeatureType = Literal["exists", "count", "density", "sequence"]
StructureSourceType = Literal["regex", "keyword_set", "sequence", "text_bytes"]


def _lower_trim(value: object) -> object:
    return value.strip().lower() if isinstance(value, str) else value


class StructureSource(_Strict):
    type: StructureSourceType
    """What is counted: regex (non-overlapping matches of pattern), keyword_set (occurrences of
    keywords), sequence (1 when some sequence's markers occur in order), text_bytes (the
    text's UTF-8 length; only with feature type count). Case and surrounding space ignored."""

    pattern: str | None = None
    """regex: the regular expression (case-insensitive unless case_sensitive)."""

    keywords: list[str] = Field(default_factory=list, max_length=1024)
    """keyword_set: the keywords; a keyword with no CJK character counts only between
    non-letter/digit neighbours."""

    case_sensitive: bool = False
    """Match case exactly (default: case-insensitive)."""

    sequences: list[list[str]] = Field(default_factory=list, max_length=256)
    """sequence: marker lists (each at least 2 markers) looked for in order."""

    @field_validator("type", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return _lower_trim(value)


class StructureFeature(_Strict):
    type: StructureFeatureType
    """exists (0/1), count, density (count per text unit: CJK characters plus runs of other
    letters/digits) or sequence (0/1; needs a sequence source). Case and space ignored."""

    source: StructureSource
    """What the feature counts."""

    @field_validator("type", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return _lower_trim(value)


class StructureSignal(_Strict):
    """A feature of the request text's shape (questions, numbered steps, keyword density...)
    compared with a predicate."""

    name: str = Field(min_length=1, max_length=128)
    """The rule's name; decisions name it as {type: structure, name: NAME}."""

    description: str | None = Field(default=None, max_length=2000)
    """Free text for people."""

    feature: StructureFeature
    """The measured value."""

    predicate: NumericPredicate | None = None
    """Bounds on the value; omitted: matches when the value is above 0. Not with exists."""

    @model_validator(mode="after")
    def _contract(self) -> StructureSignal:
        src, kind = self.feature.source, self.feature.type
        if src.type == "regex":
            if not (src.pattern or "").strip():
                raise ValueError("feature.source.type regex requires pattern")
            flags = 0 if src.case_sensitive else re.IGNORECASE
            try:
                re.compile(src.pattern or "", flags)
            except re.error as exc:
                raise ValueError(
                    f"feature.source.pattern {src.pattern!r} does not compile: {exc}"
                ) from None
        elif src.type == "keyword_set" and not src.keywords:
            raise ValueError("feature.source.type keyword_set requires keywords")
        elif src.type == "sequence":
            if not src.sequences:
                raise ValueError("feature.source.type sequence requires sequences")
            if any(len(seq) < 2 for seq in src.sequences):
                raise ValueError("feature.source.sequences entries need at least 2 markers each")
        if kind == "sequence" and src.type != "sequence":
            raise ValueError("feature.type sequence requires feature.source.type sequence")
        if src.type == "text_bytes" and kind != "count":
            raise ValueError("feature.source.type text_bytes requires feature.type count")
        if kind == "exists" and self.predicate is not None:
            raise ValueError("feature.type exists does not accept a predicate")
        return self


# -- conversation ---------------------------------------------------------------------------

ConversationSourceType = Literal[
    "message",
    "tool_definition",
    "assistant_tool_call",
    "assistant_tool_cycle",
    "active_tool_loop",
    "image_content",
    "tool_choice_required",
    "tool_choice_none",
    "flow_tool_state",
]
ConversationRole = Literal["user", "assistant", "system", "developer", "tool", "non_user"]


class ConversationSource(_Strict):
    type: ConversationSourceType
    """message (messages, by role), tool_definition (tools + functions), assistant_tool_call
    (assistant tool_calls entries), assistant_tool_cycle (tool messages), active_tool_loop (1
    while a tool loop is open), image_content (image parts in user messages); v0.4:
    tool_choice_required (1 when tool_choice is "required" or names a tool), tool_choice_none
    (1 when it is "none"), flow_tool_state (upstream's Router-owned Flow state: vllm-sr runs
    no Flow, so no request carries it: always 0)."""

    role: ConversationRole | None = None
    """message only: count this role's messages (non_user = assistant + system + tool +
    developer); omitted = every message."""

    @field_validator("role", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value  # upstream reads "" as no role


class ConversationFeature(_Strict):
    type: Literal["count", "exists"]
    """count (the number) or exists (matches when above 0)."""

    source: ConversationSource
    """What the feature counts."""


class ConversationSignal(_Strict):
    """A count over the conversation's shape (turns, tool definitions, tool loop, images)."""

    name: str = Field(min_length=1, max_length=128)
    """The rule's name; decisions name it as {type: conversation, name: NAME}."""

    description: str | None = Field(default=None, max_length=2000)
    """Free text for people."""

    feature: ConversationFeature
    """The counted value."""

    predicate: NumericPredicate | None = None
    """Bounds on the count; omitted with count: always matches. Not with exists."""

    @model_validator(mode="after")
    def _contract(self) -> ConversationSignal:
        src = self.feature.source
        if src.role is not None and src.type != "message":
            raise ValueError(
                f"feature.source.role is only valid with feature.source.type message, "
                f"not {src.type!r}"
            )
        if self.feature.type == "exists" and self.predicate is not None:
            raise ValueError("feature.type exists does not accept a predicate")
        return self


# -- input modality (v0.4) ------------------------------------------------------------------


class InputModalitySignal(_Strict):
    """v0.4: matches when a user message carries a content part of this modality (no model)."""

    name: str = Field(min_length=1, max_length=128)
    """The rule's name; decisions name it as {type: input_modality, name: NAME}."""

    description: str | None = Field(default=None, max_length=2000)
    """Free text for people."""

    modality: Literal["text", "image", "audio", "video"]
    """text (a non-empty string content or text part), image (image_url / input_image),
    audio (input_audio; the preview also audio_url), video (the preview's video_url /
    input_video: no chat part carries video, as upstream)."""

    @field_validator("name")
    @classmethod
    def _trimmed(cls, value: str) -> str:
        if value != value.strip():
            raise ValueError(f"{value!r} has surrounding spaces; accepted: a trimmed name")
        return value


# -- language -------------------------------------------------------------------------------


@functools.cache
def lingua_codes() -> frozenset[str]:
    """The lowercase ISO 639-1 codes the language detector knows."""
    from lingua import Language

    return frozenset(lang.iso_code_639_1.name.lower() for lang in Language.all())


class LanguageSignal(_Strict):
    """Matches when the request text is detected as this language."""

    name: str = Field(min_length=1, max_length=16)
    """The language as a lowercase ISO 639-1 code (en, zh, es, fr, ja, de...); decisions name
    it as {type: language, name: CODE}."""

    description: str | None = Field(default=None, max_length=2000)
    """Free text for people."""

    threshold: float = Field(default=0.0, ge=0.0, le=1.0)
    """The least detection confidence for this rule to match (0 = the detector's floor, 0.3;
    the smallest non-zero threshold of all rules becomes the floor)."""

    @field_validator("name")
    @classmethod
    def _known_code(cls, value: str) -> str:
        code = value.strip()
        if code != code.lower() or code not in lingua_codes():
            raise ValueError(
                f"name {value!r} must be a supported lowercase ISO 639-1 code such as en, zh, "
                f"es, fr, ja or de (supported: {', '.join(sorted(lingua_codes()))})"
            )
        return code
