"""A deployment's public_name (upstream v0.4) on a real supervisor and frontend with the
stand-in worker: requests naming it reach the deployment, and the worker is told the name."""

from __future__ import annotations

import aiohttp
import pytest

from tests.integration.test_supervisor_fake import fake_spec, start_service
from vllm_sr.plan import DeploymentPlan, ServicePlan
from vllm_sr.pool.settings import PoolSettings
from vllm_sr.supervisor.process import worker_command

pytestmark = pytest.mark.slow

PUBLIC = "acme/encoder-v2"


def _plan() -> ServicePlan:
    spec = fake_spec("primary", 0, public_name=PUBLIC)
    dep = DeploymentPlan(
        "primary", "fake/artifact", [spec], PoolSettings(timeout_ms=2000), public_name=PUBLIC
    )
    return ServicePlan({"primary": dep}, "primary")


async def test_a_request_naming_the_public_name_reaches_its_deployment() -> None:
    plan = _plan()
    argv = worker_command(plan.deployments["primary"].replicas[0], "/tmp/w.sock")
    assert argv[-2:] == ["--served-model-name", PUBLIC]
    svc = await start_service(lambda: plan)
    try:
        pid = svc.sup.replicas["primary-0"].pid
        async with aiohttp.ClientSession() as s:
            url = f"{svc.url}/v1/embeddings"
            async with s.post(url, json={"model": PUBLIC, "input": "abc"}) as r:
                assert r.status == 200
                doc = await r.json()
            assert doc["model_seen"] == PUBLIC and doc["pid"] == pid
            async with s.post(url, json={"model": "acme/other", "input": "abc"}) as r:
                assert r.status == 404
    finally:
        await svc.stop()
