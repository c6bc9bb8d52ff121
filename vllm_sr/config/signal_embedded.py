"""pydantic models of the ``routing.signals`` families answered from embeddings or a
deployment's classifier head (fact_check, user_feedbacks, reasks, preferences, complexity,
jailbreak, kb), pii (presidio's pattern recognizers), and the families vllm-sr refuses
(modality, events, classifiers), with upstream's field names and defaults.

The evaluation of the answered ones lives in ``vllm_sr/router/signals_embedded.py`` (and
``signals_heads``, ``signals_pii``); the refused ones are typed so that a typo is still an
unknown-key error, and ``routing_support`` refuses each one used by name.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vllm_sr.config.routing_base import Description, Strict
from vllm_sr.config.routing_tree import RuleLeaf, RuleNode

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
    """A rule tree over other signals that filters the result."""


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


class ClassifierSignal(Strict):
    name: str = Field(min_length=1, max_length=128)
    """The signal's name."""

    description: str | None = Description
    """Free text for people."""

    type: Literal["local", "llm"]
    """local (a model path) or llm (an external chat model)."""

    model: str | None = Field(default=None, max_length=256)
    """llm: a global.model_catalog.external name."""

    model_path: str | None = Field(default=None, max_length=1000)
    """local: the model's path."""

    labels: list[str] = Field(min_length=1, max_length=256)
    """The labels."""

    instructions: str | None = Field(default=None, max_length=20000)
    """llm: the instructions."""

    use_cpu: bool = False
    """local: run on CPU."""
