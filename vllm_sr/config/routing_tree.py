"""pydantic models of a decision's rule tree (upstream ``RuleNode``): a leaf names a signal
({type, name}, optionally a ``predicate`` on its value), a composite combines conditions with
AND / OR / NOT. Shared by decisions and by complexity composers.

Leaf types are every type upstream has (lowercased on load, as upstream compares them);
``routing_support`` refuses the ones vllm-sr does not evaluate."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, field_validator

from vllm_sr.config.routing_base import Strict
from vllm_sr.config.signal_families import NumericPredicate

# Every leaf type upstream's decisions name (``routing_surface_catalog.go`` + projection).
LeafType = Literal[
    "keyword",
    "embedding",
    "domain",
    "fact_check",
    "user_feedback",
    "reask",
    "preference",
    "language",
    "context",
    "structure",
    "complexity",
    "modality",
    "authz",
    "jailbreak",
    "pii",
    "kb",
    "conversation",
    "event",
    "metadata",
    "classifier",
    "projection",
    "input_modality",
    "decision",
    "safety",
]
LEAF_TYPES: tuple[str, ...] = get_args(LeafType)

UnknownPolicy = Literal["no_match", "match", "fail_request"]
"""v0.4's ``rules.on_unknown``: what a decision (or complexity composer) whose rule tree is
unknown on a request counts as (vllm_sr/router/rules.py)."""

Predicate = NumericPredicate
"""Bounds on a signal's value: at least one of gt, gte, lt, lte; not gt with gte nor lt with
lte (upstream ``NumericPredicate``)."""


class RuleLeaf(Strict):
    type: LeafType
    """The signal's type (case-insensitive, stored lowercase)."""

    name: str = Field(min_length=1, max_length=256)
    """The signal's name (for authz: the role; for complexity: RULE:LEVEL)."""

    label: str | None = Field(default=None, min_length=1, max_length=128)
    """classifier leaves only: the label whose score the predicate reads."""

    predicate: Predicate | None = None
    """Match on the signal's value (else its confidence) within these bounds, instead of on
    the signal's own match; the leaf's confidence is then 1.0."""

    on_error: Literal["no_match", "match"] | None = None
    """classifier leaves only: what a failed evaluation counts as (default no_match)."""

    on_unknown: UnknownPolicy | None = None
    """v0.4, on the root node only (a decision's ``rules`` that is a single leaf): see
    :attr:`RuleNode.on_unknown`."""

    @field_validator("type", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value


class RuleNode(Strict):
    operator: Literal["AND", "OR", "NOT"]
    """AND: every condition (confidence: their mean; none: matches with 0); OR: any
    (confidence: the best); NOT: exactly one condition, negated (confidence 1.0)."""

    conditions: list[RuleLeaf | RuleNode] = Field(default_factory=list, max_length=256)
    """Signals ({type, name}) or nested rules ({operator, conditions})."""

    on_unknown: UnknownPolicy | None = None
    """v0.4, on the root node only: set, the tree is evaluated in three values (a leaf whose
    signal is unknown is unknown; NOT of unknown is unknown; AND is false when a condition is
    false, else unknown when one is; OR is true when one is, else unknown when one is) and an
    unknown root counts as ``no_match`` (not matched), ``match`` (matched, confidence 1.0) or
    ``fail_request`` (the request fails: 503). Omitted: an unknown leaf does not match (its
    ``on_error: match`` matches), as before v0.4."""


RuleNode.model_rebuild()
