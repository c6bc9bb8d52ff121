"""The ``masking`` plugin: PII in the request to the backend replaced by placeholders, as
upstream's ``pkg/masking`` does, with the ``pii`` family's detector (presidio's pattern
recognizers, vllm_sr/router/signals_pii.py).

- Every message's text is scanned: a string ``content`` and each ``{"type": "text"}`` part
  (any role, so a system prompt or an earlier turn is masked too). Other parts (images,
  audio) and the other body keys go as they were.
- A span counts when its score is at least ``threshold`` and, with ``entity_types`` set, its
  type is listed. Overlapping spans merge into the widest (upstream's ``MergeSpans``).
- Placeholders come from the type's template (``[TYPE_{index}]`` by default); ``{index}``
  counts per type from 0 over the whole request, and one value keeps one placeholder
  everywhere in the request.
- It fails closed (upstream has no fail-open option for a privacy control): a detector that
  fails answers 503 and nothing reaches the backend.

The caller's own copy of the body is not changed (the cache key and replay record see the
request as sent); the backend's answer is not unmasked."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from vllm_sr.config.plugin_request import MASK_INDEX, MaskingPlugin
from vllm_sr.errors import Unavailable
from vllm_sr.jsontypes import JsonObject
from vllm_sr.router.signals_pii import Entity, detector

Scan = Callable[[str], Sequence[Entity]]


class MaskingFailed(Unavailable):
    """The detector failed: the chat is refused rather than sent unmasked."""


@dataclass
class Allocator:
    """One request's placeholders: (type, value) -> placeholder, and the next index per type."""

    conf: MaskingPlugin
    assigned: dict[tuple[str, str], str]
    next_index: dict[str, int]

    @classmethod
    def for_request(cls, conf: MaskingPlugin) -> Allocator:
        return cls(conf, {}, {})

    def placeholder(self, entity_type: str, value: str) -> str:
        key = (entity_type, value)
        if key not in self.assigned:
            index = self.next_index.get(entity_type, 0)
            self.next_index[entity_type] = index + 1
            self.assigned[key] = self.conf.template(entity_type).replace(MASK_INDEX, str(index))
        return self.assigned[key]

    def kept(self, spans: Sequence[Entity]) -> list[Entity]:
        types = set(self.conf.entity_types)
        return [
            s for s in spans if s.score >= self.conf.threshold and (not types or s.type in types)
        ]


def merge_spans(spans: Sequence[Entity]) -> list[Entity]:
    """Ascending by start, overlaps collapsed into the widest covering span (its first
    span's type)."""
    ordered = sorted(spans, key=lambda s: (s.start, -s.end))
    merged: list[Entity] = []
    for span in ordered:
        if merged and span.start < merged[-1].end:
            last = merged[-1]
            if span.end > last.end:
                merged[-1] = Entity(last.type, last.start, span.end, last.score)
            continue
        merged.append(span)
    return merged


def mask_text(text: str, spans: Sequence[Entity], alloc: Allocator) -> str:
    """``text`` with each kept span replaced by its placeholder. Raises ValueError for a span
    outside the text (a detector that cannot be trusted is not skipped)."""
    for span in spans:
        if span.start < 0 or span.end > len(text) or span.start >= span.end:
            raise ValueError(f"span [{span.start}, {span.end}) outside a text of {len(text)}")
    pieces: list[str] = []
    at = 0
    for span in merge_spans(alloc.kept(spans)):
        pieces += [text[at : span.start], alloc.placeholder(span.type, text[span.start : span.end])]
        at = span.end
    return "".join(pieces) + text[at:]


def mask_body(body: JsonObject, conf: MaskingPlugin, scan: Scan) -> tuple[JsonObject, int]:
    """-> (a copy of the chat body with its messages' text masked, spans replaced)."""
    alloc = Allocator.for_request(conf)
    out = copy.deepcopy(body)
    messages = out.get("messages")
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            message["content"] = mask_text(content, scan(content), alloc)
        elif isinstance(content, list):
            for part in content:
                text = part.get("text") if isinstance(part, dict) else None
                if isinstance(part, dict) and part.get("type") == "text" and isinstance(text, str):
                    part["text"] = mask_text(text, scan(text), alloc)
    return out, len(alloc.assigned)


async def apply_masking(
    body: JsonObject, conf: MaskingPlugin | None, scan: Scan | None = None
) -> JsonObject:
    """The body to send (masked when ``conf`` is enabled), the detector run in a thread.
    Raises :class:`MaskingFailed` when the detector fails."""
    if conf is None or not conf.enabled:
        return body
    found = scan or detector().entities
    try:
        masked, _ = await asyncio.to_thread(mask_body, body, conf, found)
    except Exception as exc:  # the detector's failure, whatever it is: fail closed
        raise MaskingFailed(
            f"masking: the PII detector failed ({type(exc).__name__}: {exc}); the request was "
            "not sent"
        ) from exc
    return masked
