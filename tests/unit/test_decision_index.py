"""vllm_sr/router/decision_index.py: ranking with a decision list's index (only the decisions
the results may make match are evaluated) gives exactly the ranking of evaluating every one
(matches in order with their confidences, the on_unknown policies applied, the unresolved
decisions), on random rule trees and results and on upstream's own decisions."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_sr.config.routing import Decision
from vllm_sr.router.decision_index import DecisionIndex, index_of, needs_a_match
from vllm_sr.router.rules import Ranking, SignalKey, leaves, rank, rank_all
from vllm_sr.router.signals import SignalResult
from vllm_sr.router.unknown import DecisionUnresolved, Unknown

UPSTREAM = Path(__file__).resolve().parents[1] / "fixtures" / "upstream"
KEYS: list[SignalKey] = [
    ("keyword", "a"),
    ("keyword", "b"),
    ("domain", "math"),
    ("classifier", "intent:code"),
    ("projection", "risky"),
]
LATE = Unknown("timeout", "deadline passed")


def leaf_doc(key: SignalKey) -> dict[str, Any]:
    kind, name = key
    if ":" in name:
        name, label = name.split(":")
        return {"type": kind, "name": name, "label": label}
    return {"type": kind, "name": name}


predicates = st.sampled_from(
    [None, None, {"gt": 0.5}, {"gte": 0.5}, {"lt": 0.5}, {"gte": 0.0, "lte": 1.0}, {"gt": 1.5}]
)
leaves_docs = st.builds(
    lambda key, predicate, on_error: {
        **leaf_doc(key),
        **({"predicate": predicate} if predicate else {}),
        **({"on_error": on_error} if on_error else {}),
    },
    st.sampled_from(KEYS),
    predicates,
    st.sampled_from([None, None, None, "no_match", "match"]),
)
trees = st.recursive(
    leaves_docs,
    lambda children: st.one_of(
        st.builds(
            lambda op, cs: {"operator": op, "conditions": cs},
            st.sampled_from(["AND", "OR", "AND", "OR", "NOT"]),
            st.lists(children, max_size=3),
        ),
        st.builds(lambda c: {"operator": "NOT", "conditions": [c]}, children),
    ),
    max_leaves=6,
)
confidences = st.sampled_from([0.0, 0.3, 0.5, 0.8, 1.0])
values = st.one_of(st.none(), st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, math.nan, math.inf]))
results_of = st.one_of(
    st.builds(SignalResult, st.booleans(), confidences, values),
    st.just(SignalResult.miss()),
    st.just(SignalResult.unknown_because(LATE)),
)
results = st.dictionaries(
    st.sampled_from([*KEYS, ("keyword", "unread")]), results_of, max_size=len(KEYS) + 1
)


@st.composite
def decisions(draw: st.DrawFn) -> list[Decision]:
    out = []
    for i in range(draw(st.integers(0, 8))):
        rules = draw(st.one_of(st.none(), trees))
        policy = draw(st.sampled_from([None, None, "no_match", "match", "fail_request"]))
        if rules is not None and policy is not None:
            rules = {**rules, "on_unknown": policy}
        doc: dict[str, Any] = {
            "name": draw(st.sampled_from([f"d{i}", "twin"])),  # twins: ties all the way down
            "priority": draw(st.integers(0, 2)),
            "tier": draw(st.sampled_from([0, 0, 0, 1, 2])),
        }
        if rules is not None:
            doc["rules"] = rules
        out.append(Decision.model_validate(doc))
    return out


def shape(ranking: Ranking) -> tuple[object, ...]:
    """Everything a ranking says, the decisions by identity (twins are told apart)."""
    return (
        [(id(m.decision), m.decision.name, m.confidence) for m in ranking.matches],
        list(ranking.applied.items()),
        ranking.unresolved,
    )


def same_ranking(decs: list[Decision], res: dict[SignalKey, SignalResult]) -> None:
    index = DecisionIndex(decs)
    for strategy in ("priority", "confidence"):
        want = rank_all(decs, res, strategy)
        assert shape(rank_all(decs, res, strategy, index)) == shape(want)
        if want.unresolved:
            with pytest.raises(DecisionUnresolved):
                rank(decs, res, strategy, index)
        else:
            assert [id(m.decision) for m in rank(decs, res, strategy, index)] == [
                id(m.decision) for m in want.matches
            ]


@settings(max_examples=400, deadline=None)
@given(decisions(), results)
def test_the_index_ranks_random_trees_as_evaluating_every_decision(
    decs: list[Decision], res: dict[SignalKey, SignalResult]
) -> None:
    same_ranking(decs, res)


@settings(max_examples=200, deadline=None)
@given(trees, results)
def test_a_tree_that_needs_a_match_does_not_match_without_one(
    raw: dict[str, Any], res: dict[SignalKey, SignalResult]
) -> None:
    dec = Decision.model_validate({"name": "d", "rules": raw})
    assert dec.rules is not None
    keys = set(leaves(dec.rules))
    if needs_a_match(dec.rules) and not any(r.matched for k, r in res.items() if k in keys):
        assert rank_all([dec], res, "priority").matches == []
        assert DecisionIndex([dec]).candidates(res) == []


def upstream_decisions() -> list[Decision]:
    out = []
    for path in sorted(UPSTREAM.rglob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        routing = doc.get("routing") if isinstance(doc, dict) else None
        for raw in (routing or {}).get("decisions") or []:
            keep = {k: raw[k] for k in ("name", "priority", "tier", "rules") if k in raw}
            out.append(Decision.model_validate(keep))
    return out


UPSTREAM_DECISIONS = upstream_decisions()
UPSTREAM_KEYS = sorted({k for d in UPSTREAM_DECISIONS for k in leaves(d.rules)})


def test_upstream_has_decisions_of_both_kinds() -> None:
    index = DecisionIndex(UPSTREAM_DECISIONS)
    assert len(UPSTREAM_DECISIONS) > 50
    assert 0 < bin(index.always).count("1") < len(UPSTREAM_DECISIONS)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(UPSTREAM_KEYS), results_of, max_size=len(UPSTREAM_KEYS)))
def test_the_index_ranks_upstreams_decisions_as_evaluating_every_one(
    res: dict[SignalKey, SignalResult],
) -> None:
    same_ranking(UPSTREAM_DECISIONS, res)


def test_index_of_is_built_once_per_list_and_the_cache_is_bounded() -> None:
    lists = [[Decision.model_validate({"name": f"d{i}"})] for i in range(20)]
    first = index_of(lists[0])
    assert index_of(lists[0]) is first
    assert first.decisions is lists[0]
    for decs in lists[1:]:
        assert index_of(decs).decisions is decs
    assert index_of(lists[-1]) is index_of(lists[-1])
    assert index_of(lists[0]) is not first  # evicted: the cache holds the newest lists only
