"""The questions a request asks: only referenced signals, one bundle per deployment, the
candidates once per config generation, answers (in the worker's own format) back to signals."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.backends import answer_bundle
from vllm_sr.config.routing import Routing
from vllm_sr.router.deployment_questions import TASK_CANDIDATES, TASK_QUERY, SignalAnswerError
from vllm_sr.router.questions import QuestionPlan, request_text

ROUTING: dict[str, Any] = {
    "signals": {
        "keywords": [
            {"name": "code", "keywords": ["code"]},
            {"name": "unused_kw", "keywords": ["x"]},
        ],
        "embeddings": [
            {
                "name": "billing",
                "threshold": 0.5,
                "candidates": ["refund my order", "charged twice"],
            },
            {"name": "unused_emb", "threshold": 0.5, "candidates": ["never asked"]},
            {
                "name": "elsewhere",
                "threshold": 0.5,
                "candidates": ["weather"],
                "deployment": "side",
            },
        ],
        "domains": [
            {
                "name": "math",
                "description": "solve integral equation",
                "examples": ["algebra proof"],
            },
            {"name": "law", "description": "contract court lawyer"},
        ],
    },
    "decisions": [
        {
            "name": "d",
            "rules": {
                "operator": "OR",
                "conditions": [
                    {"type": "keyword", "name": "code"},
                    {"type": "embedding", "name": "billing"},
                    {"type": "embedding", "name": "elsewhere"},
                    {"type": "domain", "name": "math"},
                ],
            },
            "modelRefs": [{"model": "m"}],
        }
    ],
}


def plan() -> QuestionPlan:
    return QuestionPlan(Routing.model_validate(ROUTING), "primary")


def tasks(body: bytes) -> dict[str, dict[str, Any]]:
    return {t["id"]: t for t in json.loads(body)["tasks"]}


def test_only_referenced_signals_are_planned() -> None:
    p = plan()
    assert set(p.keywords) == {"code"}
    assert set(p.deployments) == {"primary", "side"}
    primary = p.deployments["primary"]
    # embeddings are planned as a family, as upstream runs them: soft matching and top_k
    # compare every embedding signal
    assert [s.name for s in primary.embeddings] == ["billing", "unused_emb"]
    # the label set is every domain on the deployment; only referenced ones are reported
    assert primary.label_key == (
        ("math", ("solve integral equation", "algebra proof")),
        ("law", ("contract court lawyer",)),
    )
    assert primary.referenced_domains == {"math"}
    # the candidates, then the examples: embedded once per config generation
    assert primary.texts == [
        "refund my order",
        "charged twice",
        "never asked",
        "solve integral equation",
        "algebra proof",
        "contract court lawyer",
    ]
    side = p.deployments["side"]
    assert [s.name for s in side.embeddings] == ["elsewhere"]
    assert side.label_key == () and side.texts == ["weather"]


def test_a_deployments_families_are_worked_out_once_per_generation() -> None:
    """kinds() (every chat's timings read it) is cached on the generation's questions: a new
    generation (a new plan) has its own."""
    primary = plan().deployments["primary"]
    assert primary.kinds() == ["domain", "embedding"]
    assert primary.kinds() is primary.kinds()
    routing = json.loads(json.dumps(ROUTING))
    routing["decisions"][0]["rules"]["conditions"] = [{"type": "embedding", "name": "billing"}]
    reloaded = QuestionPlan(Routing.model_validate(routing), "primary").deployments["primary"]
    assert reloaded.kinds() == ["embedding"]  # the domains are no longer referenced
    assert primary.kinds() == ["domain", "embedding"]


def test_keyword_only_routing_asks_no_deployment() -> None:
    routing = {
        "signals": {"keywords": [{"name": "code", "keywords": ["code"]}]},
        "decisions": [
            {
                "name": "d",
                "rules": {"operator": "AND", "conditions": [{"type": "keyword", "name": "code"}]},
                "modelRefs": [{"model": "m"}],
            }
        ],
    }
    p = QuestionPlan(Routing.model_validate(routing), "primary")
    assert p.deployments == {}
    assert p.keyword_results("some code")[("keyword", "code")].matched


def test_first_bundle_carries_the_cached_texts_then_one_row_per_request() -> None:
    q = plan().deployments["primary"]
    first = tasks(q.bundle("please refund my order"))
    assert set(first) == {TASK_QUERY, TASK_CANDIDATES}
    assert first[TASK_QUERY]["embeddings"]["input"] == ["please refund my order"]
    assert first[TASK_CANDIDATES]["embeddings"]["input"] == q.texts
    results = q.read(answer_bundle(q.bundle("please refund my order")))
    assert results[("embedding", "billing")].matched
    assert q.candidates is not None and q.candidates["billing"].shape[0] == 2
    assert q.centroids is not None and q.centroids.shape[0] == 2
    second = tasks(q.bundle("solve this integral equation"))
    assert set(second) == {TASK_QUERY}  # one row: the request's text
    results = q.read(answer_bundle(q.bundle("solve this integral equation")))
    assert results[("domain", "math")].matched
    assert results[("domain", "math")].confidence > 0.5
    assert not results[("embedding", "billing")].matched
    assert ("domain", "law") not in results  # in the label set, but no decision asks


def test_domains_agree_with_the_workers_classify() -> None:
    """The router's domain answer equals what /v1/classify with the same labels answers."""
    q = plan().deployments["primary"]
    q.read(answer_bundle(q.warm_bundle() or b""), warm=True)
    text = "a proof in algebra"
    ours = q.read(answer_bundle(q.bundle(text)))[("domain", "math")]
    labels = {name: list(ex) for name, ex in q.label_key}
    body = {"tasks": [{"id": "c", "classify": {"input": [text], "labels": labels}}]}
    theirs = json.loads(answer_bundle(json.dumps(body).encode()))["results"][0]["body"]["data"][0]
    assert ours.matched == (theirs["label"] == "math")
    assert ours.confidence == pytest.approx(theirs["probabilities"]["math"], abs=1e-5)


def test_warm_bundle_fills_the_router_cache() -> None:
    q = plan().deployments["primary"]
    warm = q.warm_bundle()
    assert warm is not None and set(tasks(warm)) == {TASK_CANDIDATES}
    assert q.read(answer_bundle(warm), warm=True) == {}
    assert q.cached and q.warm_bundle() is None
    assert set(tasks(q.bundle("x"))) == {TASK_QUERY}


def test_a_refused_task_is_a_typed_error() -> None:
    q = plan().deployments["primary"]
    answer = {
        "object": "bundle",
        "results": [
            {
                "id": "query",
                "status": 400,
                "body": {"error": {"code": "invalid_request", "message": "m"}},
            }
        ],
    }
    with pytest.raises(SignalAnswerError, match="invalid_request"):
        q.read(json.dumps(answer).encode())
    with pytest.raises(SignalAnswerError):
        q.read(b"not json")


def test_request_text_is_the_last_user_message() -> None:
    messages = [
        {"role": "system", "content": "be nice"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look at"},
                {"type": "image_url", "image_url": {"url": "data:..."}},
                {"type": "text", "text": "this code"},
            ],
        },
    ]
    assert request_text(messages) == "look at\nthis code"
    assert request_text(messages[:2]) == "first"
    assert request_text([{"role": "system", "content": "x"}]) == ""
    assert request_text("nope") == ""
