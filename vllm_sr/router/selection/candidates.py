"""v0.4's ``routing.candidate_requirements``: a decision's modelRefs filtered by what the request
needs before the choice (static or a selector), on what the model cards declare. A card that
declares nothing about a need passes it (``declared`` / ``known_limits``: only what is known
excludes).

- ``context: known_limits``: a candidate whose card has ``context_window_size`` is dropped when
  the request's estimated tokens (the context signal's count, which includes the asked output:
  vllm_sr/router/context_estimate.py) exceed it; one with ``max_output_tokens`` is dropped when
  the request asks for more output (``max_completion_tokens``, else ``max_tokens``).
- ``capabilities: declared``: the request needs ``tool_use`` when it defines tools or functions,
  ``vision`` when a user message has an image part, ``audio`` when it has an audio part. A card
  that declares capabilities or ``modalities.input`` must declare each need: ``tool_use``
  (or ``tools``, ``function_calling``) among its capabilities; ``vision`` among its capabilities
  or ``image`` in ``modalities.input``; ``audio`` likewise.

The filter works as a health predicate: a dropped candidate is passed over like an unhealthy
one, so a decision left with none goes to the default model (reason ``models_unhealthy``, as
when no candidate is healthy)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from vllm_sr.config.routing import ModelCard, Routing
from vllm_sr.config.routing_catalog import CandidateRequirements
from vllm_sr.router.request_view import RequestView

TOOL_WORDS = frozenset({"tool_use", "tools", "function_calling"})
AUDIO_PART_TYPES = frozenset({"input_audio", "audio"})


@dataclass(frozen=True)
class Needs:
    tokens: int
    output_tokens: int | None
    tools: bool
    vision: bool
    audio: bool


def needs_of(view: RequestView) -> Needs:
    body = view.body
    asked = body.get("max_completion_tokens", body.get("max_tokens"))
    return Needs(
        tokens=view.context_tokens(),
        output_tokens=asked if isinstance(asked, int) and not isinstance(asked, bool) else None,
        tools=view.facts.tool_definitions > 0,
        vision=view.facts.image_parts > 0,
        audio=_has_audio(body.get("messages")),
    )


def _has_audio(messages: object) -> bool:
    for msg in messages if isinstance(messages, list) else []:
        content = msg.get("content") if isinstance(msg, dict) else None
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and part.get("type") in AUDIO_PART_TYPES:
                return True
    return False


def admits(card: ModelCard, req: CandidateRequirements, needs: Needs) -> bool:
    """Whether ``card``'s model may answer a request with ``needs``."""
    if req.context == "known_limits":
        window = card.context_window_size
        if window and needs.tokens > window:
            return False
        most = card.max_output_tokens
        if most and needs.output_tokens is not None and needs.output_tokens > most:
            return False
    if req.capabilities == "declared":
        caps = {c.lower() for c in card.capabilities}
        inputs = {m.lower() for m in card.modalities.input} if card.modalities else set()
        if not caps and not inputs:
            return True  # nothing declared
        if needs.tools and not caps & TOOL_WORDS:
            return False
        if needs.vision and "vision" not in caps and "image" not in inputs:
            return False
        if needs.audio and "audio" not in caps and "audio" not in inputs:
            return False
    return True


class CandidateFilter:
    """One routing's requirements and cards (cards by model name)."""

    def __init__(self, req: CandidateRequirements | None, cards: Sequence[ModelCard]) -> None:
        self.req = req
        self.cards: Mapping[str, ModelCard] = {c.name: c for c in cards}

    @classmethod
    def of(cls, routing: Routing) -> CandidateFilter:
        return cls(routing.candidate_requirements, routing.model_cards)

    def needs(self, view: RequestView) -> Needs | None:
        """What ``view`` needs of a candidate; None when the routing requires nothing."""
        req = self.req
        if req is None or (req.context is None and req.capabilities is None):
            return None
        return needs_of(view)

    def admit(self, needs: Needs | None, healthy: Callable[[str], bool]) -> Callable[[str], bool]:
        """``healthy`` narrowed to the candidates that meet the requirements for a request
        with ``needs`` (:meth:`needs`; None: ``healthy`` itself)."""
        req = self.req
        if req is None or needs is None:
            return healthy

        def usable(model: str) -> bool:
            card = self.cards.get(model)
            return healthy(model) and (card is None or admits(card, req, needs))

        return usable
