"""DeterministicSignals as a whole, on upstream's six deterministic fragments loaded together:
which families run for which wanted keys, the keys it can produce, and eval's per-family
metrics (timed on a fake clock)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_sr.clock import FakeClock
from vllm_sr.config.routing_signals import Signals
from vllm_sr.router.deterministic import DeterministicSignals
from vllm_sr.router.family_step import FamilyMetric
from vllm_sr.router.request_view import RequestView

FRAGMENTS = Path(__file__).parents[1] / "fixtures" / "upstream" / "fragments" / "signal"
NO_LANGUAGE = (
    "context/long-context.yaml",
    "structure/request-shape.yaml",
    "conversation/agentic-shape.yaml",
    "metadata/routing-hints.yaml",
    "authz/rbac.yaml",
)


def signals(paths: tuple[str, ...] = NO_LANGUAGE) -> Signals:
    merged: dict[str, Any] = {}
    for path in paths:
        merged.update(yaml.safe_load((FRAGMENTS / path).read_text())["routing"]["signals"])
    return Signals.model_validate(merged)


CHAT = {
    "model": "auto",
    "messages": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "First list the steps? Then answer in a table."},
    ],
    "metadata": {"consent": "denied"},
}
IDENTITY = {"x-authz-user-id": "ann", "x-authz-user-groups": "premium-tier"}


def test_configured_keys_cover_every_rule() -> None:
    keys = DeterministicSignals(signals()).configured()
    assert ("context", "long_context") in keys and ("metadata", "consent-denied") in keys
    assert {k for k in keys if k[0] == "authz"} == {("authz", "admin"), ("authz", "premium_user")}
    assert len({k for k in keys if k[0] == "structure"}) == 7
    assert len({k for k in keys if k[0] == "conversation"}) == 6


def test_wanted_keys_pick_families_and_filter_conversation_and_metadata_rules() -> None:
    sigs = DeterministicSignals(signals())
    view = RequestView.from_chat(CHAT, IDENTITY)
    out = sigs.evaluate(view, {("structure", "many_questions"), ("conversation", "TOOL_HEAVY")})
    kinds = {k for k, _ in out}
    assert kinds == {"structure", "conversation"}
    assert len([k for k in out if k[0] == "structure"]) == 7  # the whole family, as upstream
    assert [k for k in out if k[0] == "conversation"] == [("conversation", "tool_heavy")]
    everything = sigs.evaluate(view)
    assert {k for k, _ in everything} == {
        "context",
        "structure",
        "conversation",
        "metadata",
        "authz",
    }
    assert everything[("metadata", "consent-denied")].matched
    assert everything[("authz", "premium_user")].matched
    assert everything[("structure", "first_then_flow")].matched


def test_report_carries_upstreams_metrics_and_the_context_count() -> None:
    clock = FakeClock()
    sigs = DeterministicSignals(signals(), clock=clock)
    report = sigs.report(RequestView.from_chat(CHAT, IDENTITY))
    assert report.context_tokens == RequestView.from_chat(CHAT, {}).context_tokens()
    assert report.language is None  # no language rule
    m = report.metrics
    assert m["context"] == FamilyMetric(0.0, 1.0)
    assert m["authz"] == FamilyMetric(0.0, 1.0)
    assert m["metadata"].confidence == 1.0
    assert m["conversation"].confidence == 0.0  # a single question: no conversation rule
    best = max(
        r.confidence for (k, _), r in report.results.items() if k == "structure" and r.matched
    )
    assert m["structure"].confidence == pytest.approx(best)


def test_eval_skips_authz_even_without_identity() -> None:
    sigs = DeterministicSignals(signals())
    out = sigs.evaluate(RequestView.from_eval({"text": "hi"}), authz=False)
    assert not any(k == "authz" for k, _ in out)
