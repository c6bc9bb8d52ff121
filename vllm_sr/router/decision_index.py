"""Which decisions a chat's signal results can make match, worked out once per decision list.

Ranking evaluates every decision's rule tree (vllm_sr/router/rules.py ``rank_all``), but on a
usual chat few signals match and most trees are plain leaves under AND / OR, which cannot match
unless one of their own leaves' signals matched. A :class:`DecisionIndex` maps each signal key
to the decisions of that kind that read it, so a chat evaluates only those whose keys matched,
plus every decision whose value does not follow from its leaves' matches alone (no ``rules``,
``NOT``, a leaf ``predicate``, ``on_error: match``, an ``on_unknown`` policy). The decisions
left out are exactly those that would have been evaluated as not matched with no policy
applied, and the candidates keep the list's order, so the ranking is the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from vllm_sr.config.routing_tree import RuleLeaf
from vllm_sr.router.rules import SignalKey, leaves

if TYPE_CHECKING:
    from vllm_sr.config.routing import Decision
    from vllm_sr.config.routing_tree import RuleNode
    from vllm_sr.router.signals import SignalResult


def needs_a_match(node: RuleNode | RuleLeaf) -> bool:
    """True when the tree can match only if some plain leaf in it has a matched result (an
    unknown result never matches a plain leaf). False where it may match without one: an
    empty AND (matches with 0), NOT, a leaf with a ``predicate`` (it reads the value, matched
    or not) or with ``on_error: match`` (an unknown signal matches it)."""
    if isinstance(node, RuleLeaf):
        return node.predicate is None and node.on_error != "match"
    if node.operator == "NOT":
        return False
    if node.operator == "AND":  # every condition must match: one that needs a match suffices
        return any(needs_a_match(child) for child in node.conditions)
    return all(needs_a_match(child) for child in node.conditions)  # OR: the one that matched


class DecisionIndex:
    """A decision list's evaluation plan: for each signal key, a bit mask of the decisions
    (bit i: ``decisions[i]``) that can match only when one of their leaves' signals matched
    and that read the key; and the mask of those evaluated on every chat."""

    __slots__ = ("always", "by_key", "decisions")

    def __init__(self, decisions: Sequence[Decision]) -> None:
        self.decisions = decisions
        self.always = 0
        self.by_key: dict[SignalKey, int] = {}
        for i, dec in enumerate(decisions):
            rules = dec.rules
            if rules is None or rules.on_unknown is not None or not needs_a_match(rules):
                self.always |= 1 << i
                continue
            for key in leaves(rules):
                self.by_key[key] = self.by_key.get(key, 0) | 1 << i

    def candidates(self, results: Mapping[SignalKey, SignalResult]) -> list[Decision]:
        """The decisions that may match on these results, in the list's order: the others
        evaluate as not matched (and have no ``on_unknown`` policy to apply)."""
        by_key = self.by_key
        mask = self.always
        for key, res in results.items():
            if res.matched:
                mask |= by_key.get(key, 0)
        decisions = self.decisions
        out = []
        while mask:
            low = mask & -mask
            out.append(decisions[low.bit_length() - 1])
            mask ^= low
        return out


_CACHE_SIZE = 8
_cache: dict[int, tuple[Sequence[Decision], DecisionIndex]] = {}


def index_of(decisions: Sequence[Decision]) -> DecisionIndex:
    """The list's index, built on first use. Keyed by the list's id: the entry holds the list,
    so the id is not reused while it is cached (a routing's decisions are not edited in
    place; a reload builds new ones). The oldest entry goes when the cache is full."""
    entry = _cache.get(id(decisions))
    if entry is not None and entry[0] is decisions:
        return entry[1]
    index = DecisionIndex(decisions)
    if len(_cache) >= _CACHE_SIZE:
        del _cache[next(iter(_cache))]
    _cache[id(decisions)] = (decisions, index)
    return index
