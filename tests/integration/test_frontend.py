"""The frontend's contract on real sockets with stand-in workers: deadlines (504), the
single-worker cache and its bypass, bundles as one unit, input errors, 503 with nothing ready."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from tests.integration.test_supervisor_fake import fake_plan, replica_doc, start_service, wait_for
from vllm_sr.errors import InvalidRequest
from vllm_sr.frontend.app import model_of

pytestmark = pytest.mark.slow


async def post(
    s: aiohttp.ClientSession, url: str, body: Any = None, *, raw: bytes | None = None, **kw: Any
) -> tuple[int, dict[str, Any], dict[str, str]]:
    data = raw if raw is not None else None
    async with s.post(url, json=body if raw is None else None, data=data, **kw) as r:
        return r.status, await r.json(), dict(r.headers)


async def test_deadline_is_the_shorter_of_timeout_ms_and_the_callers() -> None:
    env = {"VLLM_SR_FAULT_FORWARD_DELAY_MS": "400"}
    svc = await start_service(lambda: fake_plan(1, env=env, timeout_ms=2000))
    try:
        async with aiohttp.ClientSession() as s:
            url = f"{svc.url}/v1/embeddings"
            status, doc, _ = await post(
                s, url, {"input": "a"}, headers={"X-Request-Timeout-Ms": "100"}
            )
            assert status == 504 and doc["error"]["code"] == "deadline_exceeded"
            # The timeout put the replica in its short failure backoff; wait it out.
            record = svc.sup.pools["primary"].replica("primary-0")
            clock = svc.sup.clock
            await wait_for(lambda: not record.in_backoff(clock.monotonic()), 5, "backoff over")
            status, _, _ = await post(
                s, url, {"input": "b"}, headers={"X-Request-Timeout-Ms": "5000"}
            )
            assert status == 200  # the deployment's 2000 ms is the bound, the forward takes 400
            status, doc, _ = await post(
                s, url, {"input": "c"}, headers={"X-Request-Timeout-Ms": "soon"}
            )
            assert status == 400 and "X-Request-Timeout-Ms" in doc["error"]["message"]
        doc = replica_doc(svc.sup, "primary-0")
        assert doc["inflight"] == 0 and doc["consecutive_timeouts"] == 0  # the success reset it
    finally:
        await svc.stop()


async def test_deployment_timeout_gives_504_when_the_caller_sets_none() -> None:
    env = {"VLLM_SR_FAULT_FORWARD_DELAY_MS": "2000"}
    svc = await start_service(lambda: fake_plan(1, env=env, timeout_ms=150))
    try:
        async with aiohttp.ClientSession() as s:
            status, doc, _ = await post(s, f"{svc.url}/v1/embeddings", {"input": "a"})
        assert status == 504 and doc["error"]["retryable"] is True
        assert replica_doc(svc.sup, "primary-0")["consecutive_timeouts"] == 1
    finally:
        await svc.stop()


async def test_single_worker_caches_and_two_replicas_bypass() -> None:
    one = await start_service(lambda: fake_plan(1))
    try:
        async with aiohttp.ClientSession() as s:
            first = await post(s, f"{one.url}/v1/embeddings", {"input": "same"})
            second = await post(s, f"{one.url}/v1/embeddings", {"input": "same"})
            other = await post(s, f"{one.url}/v1/classify", {"input": "same"})
            # The worker now serves at another precision: its answer is not the cached one's.
            record = one.sup.pools["primary"].replica("primary-0")
            record.capabilities = {**(record.capabilities or {}), "dtype": "bfloat16"}
            third = await post(s, f"{one.url}/v1/embeddings", {"input": "same"})
            fourth = await post(s, f"{one.url}/v1/embeddings", {"input": "same"})
        assert first[1] == second[1] and second[2].get("X-Cache") == "hit"
        assert "X-Cache" not in first[2] and "X-Cache" not in other[2]
        assert "X-Cache" not in third[2] and fourth[2].get("X-Cache") == "hit"
        # embeddings once per dtype, classify once
        assert replica_doc(one.sup, "primary-0")["requests"] == 3
    finally:
        await one.stop()
    two = await start_service(lambda: fake_plan(2))
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(4):
                status, _, headers = await post(s, f"{two.url}/v1/embeddings", {"input": "same"})
                assert status == 200 and "X-Cache" not in headers
        total = sum(replica_doc(two.sup, f"primary-{i}")["requests"] for i in range(2))
        assert total == 4 and not two.frontend.caches
    finally:
        await two.stop()


async def test_bundle_goes_to_one_worker_as_one_exchange() -> None:
    svc = await start_service(lambda: fake_plan(2))
    try:
        body = {
            "tasks": [
                {"id": "a", "embeddings": {"input": "x"}},
                {"id": "b", "classify": {"input": "y"}},
            ]
        }
        async with aiohttp.ClientSession() as s:
            status, _, _ = await post(s, f"{svc.url}/v1/bundle", body)
        assert status == 200
        counts = [replica_doc(svc.sup, f"primary-{i}")["requests"] for i in range(2)]
        assert sorted(counts) == [0, 1]
    finally:
        await svc.stop()


async def test_bad_input_and_nothing_ready() -> None:
    svc = await start_service(
        lambda: fake_plan(1, env={"FAKE_READY_DELAY_S": "3600"}), wait_ready=False
    )
    try:
        await wait_for(lambda: replica_doc(svc.sup, "primary-0")["pid"], 20, "spawned")
        async with aiohttp.ClientSession() as s:
            url = f"{svc.url}/v1/embeddings"
            status, doc, _ = await post(
                s, url, raw=b"{not json", headers={"Content-Type": "application/json"}
            )
            assert status == 400 and doc["error"]["code"] == "invalid_request"
            status, doc, _ = await post(s, url, {"model": 7, "input": "x"})
            assert status == 400 and "'model'" in doc["error"]["message"]
            status, doc, headers = await post(s, url, {"input": "x"})
            assert (
                status == 503 and doc["error"]["code"] == "unavailable" and "Retry-After" in headers
            )
            async with s.get(f"{svc.url}/health") as r:
                assert r.status == 503
            big = b'{"input": "' + b"x" * (9 * 1024 * 1024) + b'"}'
            status, doc, _ = await post(
                s, url, raw=big, headers={"Content-Type": "application/json"}
            )
            assert status == 413 and doc["error"]["code"] == "request_too_large"
            # Refused whatever the route: a body over the cap is not read, even for /health.
            async with s.get(f"{svc.url}/health", data=big) as r:
                assert r.status == 413
            async with s.get(f"{svc.url}/nowhere") as r:
                assert r.status == 404 and (await r.json())["error"]["code"] == "not_found"
    finally:
        await svc.stop()


def test_model_of_reads_only_the_model_field() -> None:
    assert model_of(b'{"model": "primary", "input": [1, 2]}') == "primary"
    assert model_of(b'{"input": "x"}') is None
    with pytest.raises(InvalidRequest, match="JSON object"):
        model_of(b"[1, 2]")
    with pytest.raises(InvalidRequest, match="body: not UTF-8"):
        model_of(b"\xff")
    with pytest.raises(InvalidRequest, match="body: not valid JSON"):
        model_of(b"{nope")


async def test_concurrent_requests_spread_over_replicas() -> None:
    env = {"VLLM_SR_FAULT_FORWARD_DELAY_MS": "200"}
    svc = await start_service(lambda: fake_plan(3, env=env))
    try:
        async with aiohttp.ClientSession() as s:
            results = await asyncio.gather(
                *(post(s, f"{svc.url}/v1/embeddings", {"input": "same size"}) for _ in range(9))
            )
        assert [r[0] for r in results] == [200] * 9
        assert (
            sorted(r[1]["replica"] for r in results)
            == ["primary-0"] * 3 + ["primary-1"] * 3 + ["primary-2"] * 3
        )
    finally:
        await svc.stop()


async def test_caller_hanging_up_frees_the_slot_as_cancelled() -> None:
    env = {"VLLM_SR_FAULT_FORWARD_DELAY_MS": "5000"}
    svc = await start_service(lambda: fake_plan(1, env=env, timeout_ms=10_000))
    try:
        async with aiohttp.ClientSession() as s:
            call = asyncio.ensure_future(post(s, f"{svc.url}/v1/embeddings", {"input": "bye"}))
            await wait_for(
                lambda: replica_doc(svc.sup, "primary-0")["inflight"] == 1, 10, "in flight"
            )
            call.cancel()
        await wait_for(lambda: replica_doc(svc.sup, "primary-0")["inflight"] == 0, 5, "slot freed")
        record = svc.sup.pools["primary"].replica("primary-0")
        assert record.outcomes["cancelled"] == 1 and record.consecutive_timeouts == 0
    finally:
        await svc.stop()
