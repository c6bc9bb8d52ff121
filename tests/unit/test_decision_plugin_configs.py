"""Upstream's maintained recipes and the plugin fragments, as the decision plugins see them:
every plugin the agent, balance, feedback, knowledge and privacy recipes use is acted on (no
plugin refusal left; their other refusals belong to other families), and each plugin fragment
of upstream's that vllm-sr acts on parses into its typed model."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vllm_sr.config.routing_plugins import SUPPORTED_PLUGIN_TYPES, canonical_type, decision_plugins
from vllm_sr.config.schema import semantic_problems

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "upstream"
MAINTAINED = ["agent", "balance", "feedback", "knowledge", "privacy"]


@pytest.mark.parametrize("recipe", MAINTAINED)
def test_maintained_recipes_have_no_plugin_refusal(recipe: str) -> None:
    raw = yaml.safe_load((FIXTURES / "recipes" / recipe / "config.yaml").read_text())
    plugin_problems = [p for p in semantic_problems(raw) if "plugins" in p.path]
    assert plugin_problems == []
    routings = [raw.get("routing") or {}]
    routings += [r.get("routing") or {} for r in raw.get("recipes") or []]
    decisions = [d for rt in routings for d in rt.get("decisions") or []]
    used = {canonical_type(p["type"]) for d in decisions for p in d.get("plugins") or []}
    assert used <= set(SUPPORTED_PLUGIN_TYPES)
    for d in decisions:
        typed = decision_plugins(d.get("plugins"))
        for p in d.get("plugins") or []:
            conf = getattr(typed, canonical_type(p["type"]))
            # every field as written (models compared as the mappings they came from)
            assert conf.model_dump(exclude_unset=True) == p.get("configuration"), d["name"]
