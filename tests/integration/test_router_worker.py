"""The router's questions answered by a real d3-edge worker process: the bundle format, the
candidates cached after one exchange, and decisions that follow the text's meaning."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from tests.support.workers import WorkerHandle, short_socket_dir, start_worker, stop_worker
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.router.backends import BackendSet
from vllm_sr.router.request_view import RequestView
from vllm_sr.router.route import Router

pytestmark = pytest.mark.slow

ROUTING: dict[str, Any] = {
    "signals": {
        "embeddings": [
            {
                "name": "billing",
                "threshold": 0.5,
                "candidates": ["I want a refund for my order", "I was charged twice on my card"],
            }
        ],
        "domains": [
            {"name": "math", "description": "Mathematics", "examples": ["solve this integral"]},
            {
                "name": "law",
                "description": "Legal questions",
                "examples": ["can I sue my landlord"],
            },
            {"name": "cooking", "description": "Recipes and cooking", "examples": ["bake bread"]},
        ],
    },
    "decisions": [
        {
            "name": "billing",
            "priority": 50,
            "rules": {"operator": "OR", "conditions": [{"type": "embedding", "name": "billing"}]},
            "modelRefs": [{"model": "general"}],
        },
        {
            "name": "maths",
            "priority": 10,
            "rules": {"operator": "OR", "conditions": [{"type": "domain", "name": "math"}]},
            "modelRefs": [{"model": "general"}],
        },
        {
            "name": "legal",
            "priority": 10,
            "rules": {"operator": "OR", "conditions": [{"type": "domain", "name": "law"}]},
            "modelRefs": [{"model": "general"}],
        },
    ],
}
PROVIDERS = Providers.model_validate(
    {
        "defaults": {"default_model": "general"},
        "models": [{"name": "general", "backend_refs": [{"endpoint": "127.0.0.1:9"}]}],
    }
)


@pytest.fixture(scope="module")
def d3() -> Iterator[WorkerHandle]:
    handle = start_worker("vllm-sr/d3-edge", short_socket_dir() / "r.sock")
    yield handle
    stop_worker(handle)


def chat(text: str) -> RequestView:
    return RequestView.from_chat({"messages": [{"role": "user", "content": text}]}, {})


async def test_real_worker_answers_route_by_meaning(d3: WorkerHandle) -> None:
    calls: Counter[str] = Counter()
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(d3.uds))) as s:

        async def exchange(dep: str, path: str, body: bytes, timeout_ms: float | None) -> Any:
            calls[dep] += 1
            async with s.post(f"http://worker{path}", data=body) as r:
                return r.status, await r.read()

        router = Router(
            PROVIDERS,
            Routing.model_validate(ROUTING),
            exchange=exchange,
            backends=BackendSet(PROVIDERS),
            decision_deployment="primary",
        )
        q = router.plan.deployments["primary"]
        assert q.candidates is None
        billing = await router.route(
            chat("Hello, my card was charged twice and I need my money back")
        )
        assert calls["primary"] == 1 and q.candidates is not None  # candidates came along
        assert billing.fallback is None
        assert billing.decision == "billing", billing
        maths = await router.route(chat("What is the derivative of x squared times sine of x?"))
        assert maths.decision == "maths", maths
        legal = await router.route(chat("Is my employment contract legally binding in court?"))
        assert legal.decision == "legal", legal
        assert calls["primary"] == 3  # one exchange per routed request
        assert "domain:math" in maths.matched_signals
