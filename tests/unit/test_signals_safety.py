"""v0.4's ``safety`` family: its config (upstream's fields, the refusals by name, the system
defaults), its evaluation on a classification head (unsafe-label risk, hazard narrowing across
deployments) and upstream's mom-v1 v0.4 vault recipe as vllm-sr reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from vllm_sr.config.routing import Routing
from vllm_sr.config.schema import RootConfig, semantic_problems
from vllm_sr.config.signal_safety import SafetyHazard, SafetySignal
from vllm_sr.router.questions import QuestionPlan, declared_keys
from vllm_sr.router.request_view import RequestView
from vllm_sr.router.signals import SignalResult
from vllm_sr.router.signals_heads import Heads
from vllm_sr.router.signals_safety import apply_hazards, hazard_key
from vllm_sr.router.unknown import Unknown

MOM_V04 = Path(__file__).resolve().parents[1] / "fixtures/upstream/v0.4/mom-v1/config.yaml"


DEPLOYMENTS = {n: {"artifact": "vllm-sr/d3-edge"} for n in ("primary", "guard", "hazard")}
SAFETY_LEAF = {"operator": "AND", "conditions": [{"type": "safety", "name": "unsafe"}]}


def config(
    safety: list[dict[str, object]], system: dict[str, object] | None = None
) -> dict[str, object]:
    return {
        "version": "v0.3",
        "global": {
            "model_catalog": {
                "deployments": DEPLOYMENTS,
                "system": {"decision_model": {"deployment": "primary"}, **(system or {})},
            }
        },
        "providers": {
            "defaults": {"model": "a"},
            "models": [{"name": "a", "backend_refs": [{"endpoint": "127.0.0.1:9"}]}],
        },
        "routing": {
            "signals": {"safety": safety},
            "decisions": [
                {"name": "d", "priority": 1, "modelRefs": [{"model": "a"}], "rules": SAFETY_LEAF},
            ],
        },
    }  # fmt: skip


def messages(raw: object) -> dict[str, str]:
    return {".".join(map(str, p.path)): p.message for p in semantic_problems(raw)}


def test_safety_rules_load_with_a_head_or_the_built_in_labels_and_others_are_refused() -> None:
    assert messages(config([{"name": "unsafe", "threshold": 0.5, "deployment": "guard"}])) == {}
    # no head: the built-in sets, which know "unsafe" and the hazard labels only
    assert messages(config([{"name": "unsafe", "threshold": 0.5}])) == {}
    found = messages(
        config([{"name": "unsafe", "unsafe_labels": ["unsafe", "Controversial"],
                 "hazard": {"categories": ["violence", "elections"]}}])
    )  # fmt: skip
    assert set(found) == {
        "routing.signals.safety.0.unsafe_labels.1",
        "routing.signals.safety.0.hazard.categories.1",
    }
    assert (
        "'Controversial' on a safety rule with no head"
        in found["routing.signals.safety.0.unsafe_labels.1"]
    )
    assert "built-in labels unsafe, violence" in found["routing.signals.safety.0.unsafe_labels.1"]
    # a hazard with a head of its own may name any label
    hazard = {"deployment": "hazard", "categories": ["elections"]}
    assert messages(config([{"name": "unsafe", "hazard": hazard}])) == {}
    found = messages(
        config([{"name": "unsafe", "model": "ext", "deployment": "guard",
                 "hazard": {"model": "ext2", "categories": ["violence"]}}])
    )  # fmt: skip
    assert "external classifier" in found["routing.signals.safety.0.model"]
    assert "external classifier" in found["routing.signals.safety.0.hazard.model"]
    found = messages(config([{"name": "unsafe", "deployment": "nope"}]))
    assert "'nope' names no deployment" in found["routing.signals.safety.0.deployment"]


def test_system_safety_and_hazard_are_the_rules_default_heads() -> None:
    raw = config(
        [{"name": "unsafe", "threshold": 0.5, "hazard": {"categories": ["violence"]}}],
        {"safety": "guard", "hazard": "hazard"},
    )
    assert messages(raw) == {}
    cfg = RootConfig.model_validate(raw)
    assert cfg.routing is not None
    rule = cfg.routing.signals.safety[0]
    assert (rule.head, rule.hazard_head) == ("guard", "hazard")
    plan = QuestionPlan(cfg.routing, "primary", wanted=declared_keys(cfg.routing))
    assert sorted(plan.deployments) == ["guard", "hazard"]
    guard, hazard = plan.deployments["guard"].heads, plan.deployments["hazard"].heads
    assert guard is not None and [r.name for r in guard.safety] == ["unsafe"]
    assert hazard is not None and [r.name for r in hazard.hazards] == ["unsafe"]
    view = RequestView.from_chat({"messages": [{"role": "user", "content": "hi"}]}, {})
    tasks = json.loads(plan.deployments["hazard"].bundle(view.text, view))["tasks"]
    assert [t["id"] for t in tasks] == ["classify"]
    bad = messages(config([{"name": "unsafe", "deployment": "guard"}], {"safety": "zz"}))
    assert "'zz' names no deployment" in bad["global.model_catalog.system.safety"]


def test_risk_is_the_unsafe_labels_probability_and_a_hazard_narrows_it() -> None:
    plain = SafetySignal(name="plain", threshold=0.5)
    multi = SafetySignal(name="multi", threshold=0.5, unsafe_labels=["Unsafe", "Controversial"])
    narrowed = SafetySignal(
        name="narrowed", threshold=0.5, hazard=SafetyHazard(categories=["violence"], threshold=0.6)
    )
    view = RequestView(text="x")
    heads = Heads([], safety=[plain, multi, narrowed], hazards=[narrowed])
    rows = [
        {"probabilities": {"safe": 0.4, "unsafe": 0.35, "controversial": 0.25, "violence": 0.7}}
    ]
    res = heads.results(view, rows)
    assert res[("safety", "plain")] == SignalResult(False, 0.35, 0.35)
    assert res[("safety", "multi")] == SignalResult(True, 0.6, 0.6)
    assert res[hazard_key(narrowed)] == SignalResult(True, 0.7, 0.7)
    # the binary verdict alone does not match here, so the hazard changes nothing
    apply_hazards([narrowed], res)
    assert hazard_key(narrowed) not in res and not res[("safety", "narrowed")].matched

    def narrowed_by(hazard: SignalResult) -> SignalResult:
        results = {
            ("safety", "narrowed"): SignalResult(True, 0.9, 0.9),
            hazard_key(narrowed): hazard,
        }
        apply_hazards([narrowed], results)
        return results[("safety", "narrowed")]

    assert narrowed_by(SignalResult(True, 0.7, 0.7)).matched
    assert narrowed_by(SignalResult(False, 0.2, 0.2)) == SignalResult(False, 0.9, 0.9)
    failed = narrowed_by(SignalResult.unknown_because(Unknown("timeout", "t")))
    assert not failed.matched and failed.unknown is not None


def test_mom_v1_v04_vault_safety_loads_with_no_head() -> None:
    raw = yaml.safe_load(MOM_V04.read_text(encoding="utf-8"))
    found = messages(raw)
    assert not any(".safety" in k for k in found)
    vault = next(i for i, r in enumerate(raw["recipes"]) if r["name"] == "vault")
    rule = raw["recipes"][vault]["routing"]["signals"]["safety"]
    signals = Routing.model_validate({"signals": {"safety": rule}}).signals
    assert [r.name for r in signals.safety] == ["unsafe"] and signals.safety[0].head is None


def test_a_multi_label_hazard_head_answers_independent_sigmoids() -> None:
    import numpy

    from vllm_sr.worker.artifacts import ArtifactSpec
    from vllm_sr.worker.surfaces import ModelView, classify_finisher

    spec = ArtifactSpec(
        "h", Path("/nonexistent"), False, {"problem_type": "multi_label_classification"}
    )
    assert spec.multi_label and not ArtifactSpec("s", Path("/x"), False, {}).multi_label
    labels = ["violence", "self_harm", "other"]

    def view(multi: bool) -> ModelView:
        return ModelView(
            name="h", names=frozenset({"h"}), dimensions=2, max_length=16, head_labels=labels,
            encode=lambda t: [[1]], truncate=lambda ids, n: ids[:n], multi_label_head=multi,
        )  # fmt: skip

    row = numpy.array([[0.0, 0.0, 2.0, 2.0, -2.0]])  # 2 pooled dims, then the head's logits
    multi = classify_finisher(view(True), 1, None, None)(row)["data"][0]["probabilities"]
    assert multi["violence"] == multi["self_harm"] == pytest.approx(1 / (1 + numpy.exp(-2.0)))
    assert sum(multi.values()) > 1.0  # independent scores, not a distribution
    single = classify_finisher(view(False), 1, None, None)(row)["data"][0]["probabilities"]
    assert sum(single.values()) == pytest.approx(1.0)
