"""Domains answered by a deployment's classifier artifact (``method: classifier``), in a real
worker process: a tiny BertForSequenceClassification saved by save_pretrained (random
weights, the real loading code) whose id2label are upstream's 14 MMLU-Pro category names.
A chat's domain decision follows the head's probabilities (the numbers the worker's
/v1/classify gives for the same text), and the bundle stays one exchange per deployment:
the head's deployment answers the domains and a jailbreak rule in one classify task, while
the decision deployment (a tiny embedding model) answers an embedding signal and a
centroid domain in its own one exchange."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from tests.support.models import build_tiny_bert
from tests.support.workers import WorkerHandle, short_socket_dir, start_worker, stop_worker
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.config.routing_signals import MMLU_CATEGORIES
from vllm_sr.router.backends import BackendSet
from vllm_sr.router.request_view import RequestView
from vllm_sr.router.route import Router
from vllm_sr.router.signals_heads import normalized_entropy

pytestmark = pytest.mark.slow

TEXT = "what is the derivative of x squared"
PROVIDERS = Providers.model_validate(
    {
        "defaults": {"default_model": "general"},
        "models": [
            {"name": "general", "backend_refs": [{"endpoint": "127.0.0.1:9"}]},
            {"name": "specialist", "backend_refs": [{"endpoint": "127.0.0.1:9"}]},
        ],
    }
)


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, WorkerHandle]]:
    head = build_tiny_bert(
        tmp_path_factory.mktemp("intent") / "model", classifier=True, labels=MMLU_CATEGORIES
    )
    embedder = build_tiny_bert(tmp_path_factory.mktemp("primary") / "model")
    sockets = short_socket_dir()
    handles: dict[str, WorkerHandle] = {}
    try:
        handles["intent"] = start_worker(str(head), sockets / "i.sock")
        handles["primary"] = start_worker(str(embedder), sockets / "p.sock")
        yield handles
    finally:
        for handle in handles.values():
            stop_worker(handle)


def routing(picked: tuple[str, float], unpicked: tuple[str, float]) -> Routing:
    """Two headed domains (one MMLU label each, with their thresholds), a jailbreak rule on
    the same head, and on the decision deployment an embedding signal and a centroid
    domain."""

    def headed(name: str, label: str, threshold: float) -> dict[str, Any]:
        return {"name": name, "mmlu_categories": [label], "threshold": threshold,
                "deployment": "intent", "method": "classifier"}  # fmt: skip

    def decision(name: str, leaf: dict[str, str], model: str, priority: int) -> dict[str, Any]:
        return {"name": name, "priority": priority, "rules": leaf,
                "modelRefs": [{"model": model}]}  # fmt: skip

    guard = {"name": "guard", "method": "classifier", "threshold": 0.5, "deployment": "intent"}
    return Routing.model_validate(
        {
            "signals": {
                "domains": [
                    headed("picked", *picked),
                    headed("unpicked", *unpicked),
                    {"name": "chatty", "examples": ["hello there", "how are you"]},
                ],
                "jailbreak": [guard],
                "embeddings": [{"name": "emb", "candidates": ["calculus"], "threshold": 0.0}],
            },
            "decisions": [
                decision("picked", {"type": "domain", "name": "picked"}, "specialist", 10),
                decision("unpicked", {"type": "domain", "name": "unpicked"}, "general", 10),
                decision("blocked", {"type": "jailbreak", "name": "guard"}, "general", 5),
                decision("chatty", {"type": "domain", "name": "chatty"}, "general", 1),
                decision("emb", {"type": "embedding", "name": "emb"}, "general", 1),
            ],
        }
    )


async def test_a_classifier_artifact_answers_domains_in_one_exchange(
    workers: dict[str, WorkerHandle],
) -> None:
    calls: Counter[str] = Counter()
    sessions = {
        dep: aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(h.uds)))
        for dep, h in workers.items()
    }
    try:

        async def exchange(dep: str, path: str, body: bytes, timeout_ms: float | None) -> Any:
            calls[dep] += 1
            async with sessions[dep].post(f"http://worker{path}", data=body) as r:
                return r.status, await r.read()

        async with sessions["intent"].post(
            "http://worker/v1/classify", json={"input": [TEXT]}
        ) as r:
            assert r.status == 200
            (row,) = (await r.json())["data"]
        direct: dict[str, float] = row["probabilities"]
        assert sorted(direct) == sorted(MMLU_CATEGORIES)
        # a random head spreads its probability: upstream's rule then detects every label
        # at its threshold (a confident one would detect only its top label)
        assert normalized_entropy(list(direct.values())) >= 0.4
        top, second = sorted(direct, key=lambda lb: -direct[lb])[:2]
        view = RequestView.from_chat({"messages": [{"role": "user", "content": TEXT}]}, {})

        # The top label's domain reaches its threshold, the second's does not.
        router = Router(
            PROVIDERS,
            routing((top, direct[top] - 1e-3), (second, min(1.0, direct[second] + 1e-3))),
            exchange=exchange,
            backends=BackendSet(PROVIDERS),
            decision_deployment="primary",
        )
        assert sorted(router.plan.deployments) == ["intent", "primary"]
        assert not router.plan.deployments["intent"].embeds  # the head alone answers there
        assert await router.warm() == {"intent": None, "primary": None}
        before = Counter(calls)
        run = await router.signals(view, router.plan)
        assert run.unknown() == {}
        picked = run.results[("domain", "picked")]
        assert picked.matched and picked.confidence == pytest.approx(direct[top], abs=1e-5)
        assert not run.results[("domain", "unpicked")].matched
        assert not run.results[("jailbreak", "guard")].matched  # no jailbreak label: risk 0
        assert ("domain", "chatty") in run.results and ("embedding", "emb") in run.results
        # one exchange per deployment: domains + jailbreak on the head, embeddings on primary
        assert calls - before == Counter({"intent": 1, "primary": 1})
        result = await router.route(view)
        assert (result.decision, result.model) == ("picked", "specialist")

        # Thresholds the other way round: the decision follows the head's numbers.
        router = Router(
            PROVIDERS,
            routing((top, min(1.0, direct[top] + 1e-3)), (second, direct[second] - 1e-3)),
            exchange=exchange,
            backends=BackendSet(PROVIDERS),
            decision_deployment="primary",
        )
        before = Counter(calls)
        result = await router.route(view)
        assert calls - before == Counter({"intent": 1, "primary": 1})  # cold cache: still one
        assert (result.decision, result.model) == ("unpicked", "general")
        run = await router.signals(view, router.plan)
        unpicked = run.results[("domain", "unpicked")]
        assert unpicked.matched and unpicked.confidence == pytest.approx(direct[second], abs=1e-5)
        assert not run.results[("domain", "picked")].matched
    finally:
        for s in sessions.values():
            await s.close()
