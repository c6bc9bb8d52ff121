"""bench/recipe_strip.py: the probe bench's loader removes only what vllm-sr refuses in an
upstream recipe, says what it removed, and leaves a loadable recipe untouched."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from bench.recipe_strip import NotLoadable, strip_refused, summary

BASE = """\
version: v0.3
providers:
  defaults: {default_model: general}
  models:
    - {name: general, backend_refs: [{endpoint: "127.0.0.1:9"}]}
    - {name: coder, backend_refs: [{endpoint: "127.0.0.1:9"}]}
routing:
  signals:
    keywords:
      - {name: code, operator: OR, keywords: [code, debug]}
      - {name: plan, operator: OR, keywords: [plan]}
  decisions:
    - name: coding
      priority: 100
      rules:
        operator: AND
        conditions:
          - {type: keyword, name: code}
          - {operator: NOT, conditions: [{type: keyword, name: plan}]}
      modelRefs: [{model: coder}]
global:
  router: {enabled: true}
  model_catalog: {deployments: {}}
"""


def base() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(BASE)
    return doc


def test_a_loadable_recipe_is_loaded_unchanged() -> None:
    raw = base()
    config, stripped = strip_refused(raw)
    assert stripped == []
    assert [d.name for d in config.routing.decisions] == ["coding"]  # type: ignore[union-attr]


def test_an_unknown_key_in_a_rule_node_is_removed_alone() -> None:
    raw = base()
    raw["routing"]["decisions"][0]["rules"]["tie_breaker"] = "first"  # no such key anywhere
    before = copy.deepcopy(raw)
    config, stripped = strip_refused(raw)
    assert raw == before  # the caller's document is not touched
    assert [s.pattern() for s in stripped] == ["routing.decisions[N].rules.tie_breaker"]
    rules = config.routing.decisions[0].rules  # type: ignore[union-attr]
    assert len(rules.conditions) == 2  # type: ignore[union-attr]  # the rest kept
    assert summary(stripped)[0].startswith("  1 x routing.decisions[N].rules.tie_breaker: ")


def test_a_refused_signal_goes_and_so_do_the_conditions_that_name_it() -> None:
    raw = base()
    raw["routing"]["signals"]["conversation"] = [
        {"name": "tool_required", "feature": {"type": "exists", "source": {"type": "x_new"}}}
    ]
    raw["routing"]["decisions"][0]["rules"]["conditions"].append(
        {"type": "conversation", "name": "tool_required"}
    )
    config, stripped = strip_refused(raw)
    removed = [(s.pattern(), s.path[-1]) for s in stripped]
    assert removed == [
        ("routing.signals.conversation[N]", 0),  # the signal first, then the leaf naming it
        ("routing.decisions[N].rules.conditions[N]", 2),
    ]
    rules = config.routing.decisions[0].rules  # type: ignore[union-attr]
    kept = [getattr(c, "name", None) or c.operator for c in rules.conditions]  # type: ignore[union-attr]
    assert kept == ["code", "NOT"]


def test_what_no_removal_clears_is_raised() -> None:
    with pytest.raises(NotLoadable):
        strip_refused({"version": "v0.3"} | {"providers": "not a mapping"})
