"""engine_args.dtype with real worker processes: a worker at ``auto`` on this host reports the
dtype it resolved (and why), and a worker forced to float32 next to one at bfloat16 in one
deployment is kept out of dispatch with the difference named."""

from __future__ import annotations

import dataclasses
import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.test_supervisor_fake import fake_plan, replica_doc, start_service, wait_for
from tests.support.workers import short_socket_dir, start_worker, stop_worker
from vllm_sr.worker import precision

pytestmark = pytest.mark.slow

WORKER_ARGV = [sys.executable, "-m", "vllm_sr.cli", "worker"]


def _get(port: int, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        doc: dict[str, Any] = json.load(r)
    return doc


def test_a_d3_edge_worker_at_auto_serves_this_hosts_dtype_and_says_why(tmp_path: Path) -> None:
    """The real d3-edge worker at auto: the dtype this host resolves to (bfloat16 on a CPU
    with AMX or AVX512-BF16), in /health's capabilities and /v1/models, with the reason in the
    ready line; it passed the golden check against the float32 references to get there."""
    expected = precision.resolve("auto", precision.facts_for("cpu"))
    log = tmp_path / "worker.log"
    handle = start_worker(
        "vllm-sr/d3-edge", short_socket_dir() / "w.sock", port=_free_port(), log_path=log
    )
    try:
        assert handle.port is not None
        health = _get(handle.port, "/health")
        assert health["capabilities"]["dtype"] == expected.dtype
        card = _get(handle.port, "/v1/models")["data"][0]
        assert card["dtype"] == expected.dtype
        assert card["precision"] == expected.to_json()
    finally:
        stop_worker(handle)
    text = log.read_text()
    ready = next(line for line in text.splitlines() if "ready: vllm-sr/d3-edge" in line)
    assert f"{expected.dtype} ({expected.reason})" in ready
    assert f"golden check passed (float32 references, {expected.dtype} tolerance)" in text


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_float32_worker_next_to_a_bfloat16_one_is_kept_out_of_dispatch(
    tiny_bert_dir: Path,
) -> None:
    plan = fake_plan(2, artifact=str(tiny_bert_dir), timeout_ms=10_000)
    specs = plan.deployments["primary"].replicas
    # As if one replica's host resolved auto differently: one forced to each precision.
    specs[0] = dataclasses.replace(specs[0], dtype="bfloat16")
    specs[1] = dataclasses.replace(specs[1], dtype="float32")
    svc = await start_service(lambda: plan, worker_argv=WORKER_ARGV, wait_ready=False)
    try:
        docs = await wait_for(
            lambda: (
                sorted(
                    (replica_doc(svc.sup, f"primary-{i}") for i in range(2)),
                    key=lambda r: r["state"],
                )
                if {replica_doc(svc.sup, f"primary-{i}")["state"] for i in range(2)}
                == {"ready", "incompatible"}
                else None
            ),
            240,
            "one replica ready, the other incompatible",
            svc.sup.inventory,
        )
        out, ready = docs  # "incompatible" sorts before "ready"
        dtypes = {"primary-0": "bfloat16", "primary-1": "float32"}
        assert (out["dtype"], ready["dtype"]) == (dtypes[out["id"]], dtypes[ready["id"]])
        assert out["last_error"] == (
            f"capabilities differ from {ready['id']}'s: "
            f"dtype {out['dtype']!r} vs {ready['dtype']!r}"
        )
        async with aiohttp.ClientSession() as s:
            for i in range(4):
                async with s.post(f"{svc.url}/v1/embeddings", json={"input": f"t{i}"}) as r:
                    assert r.status == 200
        served = {replica_doc(svc.sup, f"primary-{i}")["requests"] for i in range(2)}
        assert replica_doc(svc.sup, ready["id"])["requests"] == 4
        assert replica_doc(svc.sup, out["id"])["requests"] == 0 and served == {0, 4}
    finally:
        await svc.stop()
