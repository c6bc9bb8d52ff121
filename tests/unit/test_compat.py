"""Replicas of a deployment share revision and capabilities (the page: "All replicas of a
deployment use the same artifact, revision, engine arguments and capabilities"): a replica that
reports another revision or other capabilities than the ready ones is kept out of dispatch."""

from __future__ import annotations

from typing import Any

from vllm_sr import events as ev
from vllm_sr.clock import FakeClock
from vllm_sr.pool import PoolSettings, ReplicaPool
from vllm_sr.pool.compat import limits_problem, peer_problem

CAPS: dict[str, Any] = {
    "surfaces": ["embeddings", "classify", "bundle"],
    "dimensions": 384,
    "max_length": 256,
    "labels": None,
}


def pool_with(events: list[tuple[str, dict[str, Any]]]) -> ReplicaPool:
    pool = ReplicaPool("primary", clock=FakeClock(), emit=lambda n, **f: events.append((n, f)))
    for i in range(3):
        pool.add_replica(f"primary-{i}", "cpu")
    return pool


def test_same_revision_and_capabilities_serve_together() -> None:
    pool = pool_with([])
    for i in range(3):
        assert pool.mark_ready(f"primary-{i}", i, revision="sha256:abc", capabilities=dict(CAPS))
    assert {pool.acquire(0).replica_id for _ in range(3)} == {f"primary-{i}" for i in range(3)}


def test_another_revision_is_incompatible_and_out_of_dispatch() -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    pool = pool_with(events)
    assert pool.mark_ready("primary-0", 1, revision="sha256:abc", capabilities=CAPS)
    assert not pool.mark_ready("primary-1", 2, revision="sha256:def", capabilities=CAPS)
    doc = pool.inventory()["replicas"][1]
    assert doc["state"] == "incompatible" and not doc["ready"]
    assert doc["last_error"] == "revision sha256:def differs from primary-0's sha256:abc"
    assert [f["replica"] for n, f in events if n == ev.REPLICA_INCOMPATIBLE] == ["primary-1"]
    assert {pool.acquire(0).replica_id for _ in range(3)} == {"primary-0"}


def test_other_capabilities_are_incompatible_with_the_difference_named() -> None:
    pool = pool_with([])
    assert pool.mark_ready("primary-0", 1, capabilities=CAPS)
    other = {**CAPS, "dimensions": 128}
    assert not pool.mark_ready("primary-1", 2, capabilities=other)
    reason = pool.inventory()["replicas"][1]["last_error"]
    assert reason == "capabilities differ from primary-0's: dimensions 128 vs 384"


def test_replicas_that_report_nothing_are_not_compared() -> None:
    assert peer_problem(None, None, [("primary-0", "sha256:abc", CAPS)]) is None
    assert peer_problem("sha256:abc", CAPS, [("primary-0", None, None)]) is None


def test_limits_problem_names_each_value() -> None:
    settings = PoolSettings(configured_max_num_seqs=8, configured_max_num_batched_tokens=512)
    assert limits_problem(settings, {"max_num_seqs": 8, "max_num_batched_tokens": 512}) is None
    assert limits_problem(settings, {"max_num_seqs": 64, "max_num_batched_tokens": 512}) == (
        "reported limits differ from config: max_num_seqs is 64, config sets 8"
    )


def test_a_float32_replica_next_to_bfloat16_ones_is_kept_out_naming_the_dtypes() -> None:
    """The precision a worker resolved is shared like every other capability: one forced to
    float32 beside a bfloat16 peer does not serve, and the inventory says why."""
    events: list[tuple[str, dict[str, Any]]] = []
    pool = pool_with(events)
    bf16 = {**CAPS, "dtype": "bfloat16"}
    assert pool.mark_ready("primary-0", 1, revision="sha256:abc", capabilities=bf16)
    assert pool.mark_ready("primary-1", 2, revision="sha256:abc", capabilities=dict(bf16))
    assert not pool.mark_ready(
        "primary-2", 3, revision="sha256:abc", capabilities={**CAPS, "dtype": "float32"}
    )
    doc = pool.inventory()["replicas"]
    assert [r["dtype"] for r in doc] == ["bfloat16", "bfloat16", "float32"]
    assert doc[2]["state"] == "incompatible" and not doc[2]["ready"]
    assert doc[2]["last_error"] == (
        "capabilities differ from primary-0's: dtype 'float32' vs 'bfloat16'"
    )
    assert [f["replica"] for n, f in events if n == ev.REPLICA_INCOMPATIBLE] == ["primary-2"]
    assert {pool.acquire(0).replica_id for _ in range(6)} == {"primary-0", "primary-1"}
