"""A chat message's text: the one walk over a message's ``content`` (a string, or a list of
parts), with the rule of each place that reads it named here.

Upstream reads a message's text in several places, and not by one rule (which part types
count, whether empty parts count, what joins them); vllm-sr keeps each place's rule, since
routing, eval answers and session ids must stay as upstream's, but owns the walk once:

- :data:`CHAT`: the routed chat's view (``request_view``): parts of type ``text`` (or none),
  non-empty, joined by a space;
- :data:`EVAL`: ``/api/v1/eval``'s request (``eval_view``): ``text`` / ``input_text`` (or
  untyped; the type compared trimmed and lower-cased), non-empty, joined by a space; a content
  that is one part object counts as that part;
- :data:`QUESTION`: the text sent to a worker's model questions (``questions``): ``text``
  parts, empty ones too, joined by a newline;
- :data:`SYSTEM`: a system prompt being extended (``plugins/shapers``): ``text`` /
  ``input_text`` (or untyped) parts, non-empty, joined by a newline;
- :data:`FINGERPRINT`: session ids and Router Learning's context size (``replay/session``,
  ``learning/facts``): every part's ``text`` as a string (``""`` when absent), joined by a
  space.

A string content is its own text; anything else that is not a list is ``""``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class TextRule:
    types: frozenset[str | None] | None  # the part types whose text counts; None: every part
    sep: str = " "
    keep_empty: bool = False  # parts with an empty text count (as "")
    normalise_type: bool = False  # the type trimmed and lower-cased; a non-string type is ""
    single_part: bool = False  # a content that is one part object counts as that part
    stringify: bool = False  # any text value as str(); a missing one as ""


CHAT = TextRule(frozenset({None, "", "text"}))
EVAL = TextRule(frozenset({"", "text", "input_text"}), normalise_type=True, single_part=True)
QUESTION = TextRule(frozenset({"text"}), sep="\n", keep_empty=True)
SYSTEM = TextRule(frozenset({None, "", "text", "input_text"}), sep="\n")
FINGERPRINT = TextRule(None, keep_empty=True, stringify=True)


def message_text(content: object, rule: TextRule = CHAT) -> str:
    """``content``'s text by ``rule``."""
    if isinstance(content, str):
        return content
    parts: list[object]
    if isinstance(content, list):
        parts = content
    elif rule.single_part and isinstance(content, Mapping):
        parts = [content]
    else:
        return ""
    texts = []
    for part in parts:
        if not isinstance(part, Mapping):
            continue
        kind: object = part.get("type")
        if rule.normalise_type:
            kind = kind.strip().lower() if isinstance(kind, str) else ""
        if rule.types is not None and not (
            (kind is None or isinstance(kind, str)) and kind in rule.types
        ):
            continue
        if rule.stringify:
            texts.append(str(part.get("text", "")))
            continue
        text = part.get("text")
        if isinstance(text, str) and (text or rule.keep_empty):
            texts.append(text)
    return rule.sep.join(texts)
