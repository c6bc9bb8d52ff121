"""One exchange through a deployment's pool: admit, pick, forward the caller's bytes, and feed
the outcome back (success / timeout / failure / cancelled / refused) so backoff and outlier
ejection see every exchange. A dead worker gives ``WorkerFailed`` (502), a deadline
``DeadlineExceeded`` (504); the lease is always released, so in-flight and outstanding bytes
return to 0 whatever happens."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from vllm_sr.errors import DeadlineExceeded, WorkerFailed
from vllm_sr.pool.client import WorkerResponse
from vllm_sr.pool.pool import ReplicaPool
from vllm_sr.pool.replica import Outcome

if TYPE_CHECKING:
    from vllm_sr.supervisor.supervisor import Supervisor


def with_model(body: bytes, model: str) -> bytes:
    """The body with ``model`` set to what an attached runtime serves (its own name for the
    deployment's model)."""
    doc = json.loads(body)
    doc["model"] = model
    return json.dumps(doc, separators=(",", ":")).encode()


def outcome_of(status: int) -> Outcome:
    if status == 429:
        return "refused"  # the worker's own admission said no: neither a success nor a fault
    if status >= 500:
        return "failure"
    return "success"  # 2xx and the worker's 4xx verdicts on the input are answers


async def forward(
    sup: Supervisor,
    pool: ReplicaPool,
    path: str,
    body: bytes,
    caller_timeout_ms: float | None,
) -> tuple[WorkerResponse, str]:
    """Send ``body`` to the replica the pool picks. Returns (response, replica id)."""
    timeout_s = pool.settings.deadline_s(caller_timeout_ms)
    lease = pool.acquire(len(body))
    rep = sup.replicas.get(lease.replica_id)
    if rep is None:  # published pools only hold live workers; be safe anyway
        pool.release(lease, "failure")
        raise WorkerFailed(f"replica {lease.replica_id} has no worker", replica=lease.replica_id)
    record: Any = rep.record
    rep.active += 1
    outcome: Outcome = "failure"
    try:
        if rep.served_model is not None:
            body = with_model(body, rep.served_model)
        resp = await rep.client.post(path, body, timeout_s=timeout_s)
        outcome = outcome_of(resp.status)
        return resp, rep.id
    except DeadlineExceeded:
        outcome = "timeout"
        raise
    except WorkerFailed:
        outcome = "failure"
        raise
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    finally:
        rep.active -= 1
        # A worker replaced by a reload under the same id: its pool record is gone, and the
        # successor's record must not be charged for this exchange.
        if lease.replica_id in pool and pool.replica(lease.replica_id) is record:
            pool.release(lease, outcome)
