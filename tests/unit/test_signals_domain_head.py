"""Domains answered by a sequence-classification head (``method: classifier``): upstream's
label -> domain mapping and its entropy rule (ROUTER-REFERENCE.md §2.3), on fixed
probabilities; and the question plan that sends them to the head's one classify task."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_signals import MMLU_CATEGORIES, DomainSignal
from vllm_sr.config.upstream_modules import Modules
from vllm_sr.router.questions import QuestionPlan
from vllm_sr.router.request_view import RequestView
from vllm_sr.router.signals_heads import (
    detected_labels,
    domain_name,
    head_domain_results,
    normalized_entropy,
)


def dom(name: str, *cats: str, threshold: float = 0.0) -> DomainSignal:
    return DomainSignal(
        name=name,
        mmlu_categories=list(cats),
        threshold=threshold,
        deployment="intent",
        method="classifier",
    )


DOMAINS = [
    dom("stem", "math", "physics"),
    dom("law"),  # no categories: claims the label named like it
    dom("sciences", "physics"),  # lists physics after stem did
]


def test_a_label_names_the_domain_listing_it_else_the_one_named_like_it_else_itself() -> None:
    assert domain_name(DOMAINS, "math") == "stem"
    assert domain_name(DOMAINS, "physics") == "stem"  # the first domain listing it
    assert domain_name(DOMAINS, "law") == "law"
    assert domain_name(DOMAINS, "LAW") == "law"
    assert domain_name(DOMAINS, "history") == "history"  # no domain: the raw label


def spread(top: float, n: int = len(MMLU_CATEGORIES)) -> dict[str, float]:
    """``top`` on math, the rest shared evenly by n - 1 other labels."""
    others = [c for c in MMLU_CATEGORIES if c != "math"]
    rest = (1.0 - top) / (n - 1)
    return {"math": top, **{lb: rest for lb in others[: n - 1]}}


def test_normalized_entropy_is_zero_when_certain_and_one_when_uniform() -> None:
    assert normalized_entropy([1.0, 0.0, 0.0]) == 0.0
    assert normalized_entropy([0.25] * 4) == pytest.approx(1.0)
    assert normalized_entropy([1.0]) == 0.0
    assert normalized_entropy(list(spread(0.9).values())) < 0.4


def test_a_confident_head_detects_at_most_its_top_label() -> None:
    probs = spread(0.9)  # normalised entropy ~0.22
    assert detected_labels(DOMAINS, probs, 0.5) == {"math": 0.9}
    # still only the top label, even with a threshold every label reaches
    assert detected_labels(DOMAINS, probs, 0.0) == {"math": 0.9}
    # the top label under the threshold: nothing
    assert detected_labels(DOMAINS, probs, 0.95) == {}


def test_a_spread_head_detects_every_label_at_the_threshold() -> None:
    probs = {"math": 0.45, "law": 0.40, "history": 0.10, "biology": 0.05}
    assert normalized_entropy(list(probs.values())) >= 0.4
    assert detected_labels(DOMAINS, probs, 0.35) == {"math": 0.45, "law": 0.40}
    assert detected_labels(DOMAINS, probs, 0.5) == {}  # no fallback category
    # a domain's own threshold (above 0) replaces the module's for its labels
    strict_law = [DOMAINS[0], dom("law", threshold=0.42), DOMAINS[2]]
    assert detected_labels(strict_law, probs, 0.35) == {"math": 0.45}


def test_domain_results_match_by_name_or_by_mmlu_category() -> None:
    res = head_domain_results(DOMAINS, {"physics": 0.95, "law": 0.03, "math": 0.02}, 0.5)
    assert res["stem"].matched and res["stem"].confidence == pytest.approx(0.95)
    # sciences lists physics too: a detected label in its mmlu_categories
    assert res["sciences"].matched and res["sciences"].confidence == pytest.approx(0.95)
    assert not res["law"].matched and res["law"].confidence == 0.0
    spread_res = head_domain_results(DOMAINS, {"math": 0.45, "law": 0.40, "x": 0.15}, 0.35)
    assert spread_res["stem"].matched and spread_res["law"].matched
    assert not spread_res["sciences"].matched  # math is not one of its categories
    assert spread_res["law"].confidence == pytest.approx(0.40)


def test_method_classifier_needs_a_deployment_and_one_method_per_deployment() -> None:
    with pytest.raises(ValidationError, match="method 'classifier' needs deployment"):
        DomainSignal(name="math", method="classifier")
    with pytest.raises(ValidationError, match="one label set, give them one method"):
        Routing.model_validate(
            {
                "signals": {
                    "domains": [
                        {"name": "a", "deployment": "x", "method": "classifier"},
                        {"name": "b", "deployment": "x"},
                    ]
                }
            }
        )


def routing_with(domains: list[dict[str, object]]) -> Routing:
    return Routing.model_validate(
        {
            "signals": {"domains": domains},
            "decisions": [
                {"name": d["name"], "rules": {"type": "domain", "name": d["name"]}} for d in domains
            ],
        }
    )


def test_the_plan_asks_a_headed_deployment_one_classify_task_and_no_embeddings() -> None:
    rt = routing_with(
        [
            {"name": "stem", "mmlu_categories": ["math"], "deployment": "intent",
             "method": "classifier"},
            {"name": "law", "deployment": "intent", "method": "classifier"},
            {"name": "chat", "examples": ["hello there"]},  # centroids on the decision model
        ]
    )  # fmt: skip
    plan = QuestionPlan(rt, "primary")
    assert sorted(plan.deployments) == ["intent", "primary"]
    intent = plan.deployments["intent"]
    assert not intent.embeds and intent.domains == []
    assert intent.signal_keys() == [("domain", "law"), ("domain", "stem")]
    view = RequestView(text="solve x^2 = 4")
    tasks = json.loads(intent.bundle(view.text, view))["tasks"]
    assert [t["id"] for t in tasks] == ["classify"]
    assert plan.deployments["primary"].referenced_domains == frozenset({"chat"})
    answer = {
        "results": [
            {
                "id": "classify",
                "status": 200,
                "body": {"data": [{"label": "math",
                                   "probabilities": {"math": 0.9, "law": 0.05, "other": 0.05}}]},
            }
        ]
    }  # fmt: skip
    out = intent.read(json.dumps(answer).encode(), view=view)
    assert out[("domain", "stem")].matched
    assert out[("domain", "stem")].confidence == pytest.approx(0.9)
    assert not out[("domain", "law")].matched


def test_the_module_threshold_applies_to_headed_domains() -> None:
    modules = Modules.model_validate({"classifier": {"domain": {"threshold": 0.95}}})
    rt = routing_with(
        [{"name": "stem", "mmlu_categories": ["math"], "deployment": "intent",
          "method": "classifier"}]
    )  # fmt: skip
    intent = QuestionPlan(rt, "primary", modules=modules).deployments["intent"]
    assert intent.heads is not None and intent.heads.domain_threshold == 0.95
    default = QuestionPlan(rt, "primary").deployments["intent"].heads
    assert default is not None and default.domain_threshold == 0.5
