"""pydantic models of the ``routing.signals`` families answered from embeddings or a
deployment's classifier head (fact_check, user_feedbacks, reasks, preferences, complexity,
jailbreak, kb), pii (presidio's pattern recognizers), and the families vllm-sr refuses
(modality, events), with upstream's field names and defaults.

The evaluation of the answered ones lives in ``vllm_sr/router/signals_embedded.py`` (and
``signals_heads``, ``signals_pii``); the refused ones are typed so that a typo is still an
unknown-key error, and ``routing_support`` refuses each one used by name.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from vllm_sr.config.routing_base import Description, Strict
from vllm_sr.config.routing_tree import RuleLeaf, RuleNode
from vllm_sr.config.upstream_catalog import PrototypeScoring

# -- the families answered from embeddings (and pii), then those refused -------------------


class NamedSignal(Strict):
    """fact_check, user_feedbacks, modality: a name the model's label must equal."""

    name: str = Field(min_length=1, max_length=128)
    """The label (e.g. needs_fact_check, wrong_answer, DIFFUSION)."""

    description: str | None = Description
    """Free text for people."""

    deployment: str | None = Field(default=None, max_length=63)
    """vllm-sr (fact_check, user_feedbacks): a deployment whose artifact is a sequence
    classifier with upstream's labels answers the family (the first rule's that names one);
    omitted: vllm-sr's built-in prototypes on the decision deployment."""


class ReaskSignal(Strict):
    name: str = Field(min_length=1, max_length=128)
    """The signal's name."""

    description: str | None = Description
    """Free text for people."""

    threshold: float = Field(default=0.0, ge=0.0, le=1.0)
    """Least similarity to a prior user turn (0: 0.8)."""

    lookback_turns: int = Field(default=0, ge=0, le=64)
    """Prior turns that must be similar (0: 1)."""


class PreferenceSignal(Strict):
    name: str = Field(min_length=1, max_length=128)
    """The signal's name."""

    description: str | None = Description
    """What the preference is."""

    examples: list[str] = Field(default_factory=list, max_length=1024)
    """Example texts."""

    threshold: float = Field(default=0.0, ge=0.0, le=1.0)
    """Least score (0: any)."""


class ComplexityBank(Strict):
    candidates: list[str] = Field(default_factory=list, max_length=1024)
    """Example texts."""

    image_candidates: list[str] = Field(default_factory=list, max_length=1024)
    """Example images."""


COMPLEXITY_LEVELS = ("hard", "medium", "easy")  # a complexity rule's leaves: NAME:LEVEL


class ComplexitySignal(Strict):
    name: str = Field(min_length=1, max_length=128)
    """The rule's name; decisions use NAME:hard / NAME:medium / NAME:easy."""

    threshold: float = 0.0
    """The margin beyond which the level is hard (or, negated, easy)."""

    hard: ComplexityBank = Field(default_factory=ComplexityBank)
    """Hard examples."""

    easy: ComplexityBank = Field(default_factory=ComplexityBank)
    """Easy examples."""

    description: str | None = Description
    """Free text for people."""

    composer: RuleNode | RuleLeaf | None = None
    """A rule tree over other signals that filters the result (v0.4: its root's
    ``on_unknown`` says what an unknown tree counts as)."""

    hard_above: float | None = None
    """v0.4: hard when the margin (hard minus easy similarity) is above this; with
    ``easy_below``, in place of the symmetric ``threshold``."""

    easy_below: float | None = None
    """v0.4: easy when the margin is below this (below ``hard_above``)."""

    hard_below: float | None = None
    """v0.4, the other direction: hard when the margin is below this; with ``easy_above``."""

    easy_above: float | None = None
    """v0.4: easy when the margin is above this (above ``hard_below``)."""

    prototype_scoring: PrototypeScoring | None = None
    """v0.4: this rule's prototype scoring of its hard/easy banks (in place of
    ``global.model_catalog.modules.complexity.prototype_scoring``)."""

    @model_validator(mode="after")
    def _boundaries(self) -> ComplexitySignal:
        self.boundaries()  # upstream's EffectiveBoundaries checks, at load
        return self

    def boundaries(self) -> tuple[float, float, bool]:
        """(hard_at, easy_at, higher_is_harder), as upstream's ``EffectiveBoundaries``: the
        explicit pair when given (one direction, both halves, bands not overlapping, no
        ``threshold`` beside it), else ``threshold`` symmetric about 0."""
        pairs = {
            "hard_above": self.hard_above,
            "easy_below": self.easy_below,
            "hard_below": self.hard_below,
            "easy_above": self.easy_above,
        }
        for key, value in pairs.items():
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{key}: {value} is not finite; accepted: a finite number")
        higher = self.hard_above is not None or self.easy_below is not None
        lower = self.hard_below is not None or self.easy_above is not None
        if higher and lower:
            raise ValueError(
                "hard_above/easy_below and hard_below/easy_above both set; accepted: one "
                "direction (hard_above with easy_below, or hard_below with easy_above)"
            )
        if not higher and not lower:
            return self.threshold, -self.threshold, True
        if self.threshold != 0:
            raise ValueError(
                f"threshold {self.threshold} with an explicit boundary pair; accepted: one of them"
            )
        hard, easy = (
            (self.hard_above, self.easy_below) if higher else (self.hard_below, self.easy_above)
        )
        names = ("hard_above", "easy_below") if higher else ("hard_below", "easy_above")
        if hard is None or easy is None:
            raise ValueError(f"half a boundary pair; accepted: both {names[0]} and {names[1]}")
        if (higher and easy >= hard) or (not higher and hard >= easy):
            low, high = (names[1], names[0]) if higher else names
            raise ValueError(
                f"overlapping bands: {low} ({easy if higher else hard}) is not below "
                f"{high} ({hard if higher else easy}); accepted: {low} < {high}"
            )
        return hard, easy, higher

    def level(self, margin: float) -> str:
        """hard, easy or medium for a margin (hard minus easy similarity)."""
        hard_at, easy_at, higher = self.boundaries()
        if higher:
            return "hard" if margin > hard_at else "easy" if margin < easy_at else "medium"
        return "hard" if margin < hard_at else "easy" if margin > easy_at else "medium"


class JailbreakSignal(Strict):
    name: str = Field(min_length=1, max_length=128)
    """The signal's name."""

    method: Literal["classifier", "hybrid", "contrastive"] | None = None
    """contrastive: jailbreak_patterns against benign_patterns; classifier, hybrid or omitted:
    upstream's trained classifier (vllm-sr: its built-in jailbreak/benign prototypes)."""

    threshold: float = 0.0
    """contrastive: the least margin (<= 0: 0.10); otherwise the least risk probability."""

    include_history: bool = False
    """Also score prior turns."""

    description: str | None = Description
    """Free text for people."""

    jailbreak_patterns: list[str] = Field(default_factory=list, max_length=1024)
    """contrastive: jailbreak examples."""

    benign_patterns: list[str] = Field(default_factory=list, max_length=1024)
    """contrastive: benign examples."""

    direction: Literal["request", "response"] | None = None
    """v0.4: request (or omitted) scores the prompt; response (the model's answer, for the
    response_jailbreak plugin) is refused."""

    deployment: str | None = Field(default=None, max_length=63)
    """vllm-sr, classifier/hybrid: a deployment whose artifact is a sequence classifier
    (labels from its config.json id2label); the risk is the probability of its ``jailbreak``
    label (upstream's default positive label). Omitted: vllm-sr's built-in prototypes on the
    decision deployment."""


class PIISignal(Strict):
    name: str = Field(min_length=1, max_length=128)
    """The signal's name."""

    threshold: float = 0.0
    """Least entity confidence."""

    pii_types_allowed: list[str] = Field(default_factory=list, max_length=64)
    """Types that do not count."""

    include_history: bool = False
    """Also scan prior turns."""

    deployment: str | None = Field(default=None, max_length=63)
    """vllm-sr: a deployment whose artifact is a token classifier (BIO labels such as
    B-EMAIL_ADDRESS) answers this rule; omitted: presidio's pattern recognizers."""

    description: str | None = Description
    """Free text for people."""


class KBTarget(Strict):
    kind: Literal["label", "group"]
    """What value names."""

    value: str = Field(min_length=1, max_length=256)
    """The label or group."""


class KBSignal(Strict):
    name: str = Field(min_length=1, max_length=128)
    """The signal's name."""

    kb: str = Field(min_length=1, max_length=128)
    """A global.model_catalog.kbs name."""

    target: KBTarget
    """The label or group to match."""

    match: Literal["threshold", "best"] | None = None
    """threshold (default) or best."""


class EventSignal(Strict):
    name: str = Field(min_length=1, max_length=128)
    """The signal's name."""

    description: str | None = Description
    """Free text for people."""

    event_types: list[str] = Field(default_factory=list, max_length=1024)
    """Event words."""

    severities: list[str] = Field(default_factory=list, max_length=16)
    """critical / high / medium / low."""

    action_codes: list[str] = Field(default_factory=list, max_length=1024)
    """Domain-specific codes."""

    temporal: bool = False
    """Match time-sensitive markers."""


class HallucinationSignal(Strict):
    """v0.4: checks the model's answer against the request's grounding context, at the
    response stage, for the hallucination plugin; decisions cannot read it (refused by
    vllm-sr, which has no response-stage signals)."""

    name: str = Field(min_length=1, max_length=128)
    """The rule's name."""

    description: str | None = Description
    """Free text for people."""

    use_nli: bool = False
    """Upstream: span-level NLI explanations."""
