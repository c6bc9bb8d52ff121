"""One exchange with a deployment, owned by its pool: admit and pick a replica, send the
caller's bytes with the exchange's deadline, classify how it ended, release, and feed the
outcome back (success / timeout / failure / cancelled / refused / no_forward) so backoff and
outlier ejection see every exchange; only an answer a forward produced is a success
(``outcome_of``).

Retry: an exchange whose worker broke before answering (``WorkerFailed``: it died, the
connection was refused or reset) is sent once more to another replica picked by the same rule,
within what is left of the deadline: every surface is idempotent. A timeout is never retried (it
is the outlier detector's signal), nor an answer (any HTTP status, 4xx or 5xx), nor an
exchange with no deadline left. The retry is admitted like any exchange (429 / 503 when no
other replica can take it: 429 when the others are full; with no other replica that could
serve, the first failure, 502), so the pool's accounting stays exact.

The deadline reaches the worker as ``X-Request-Timeout-Ms`` (the milliseconds left), so the
worker drops rows nobody waits for before they enter a forward.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from vllm_sr import wire
from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.errors import DeadlineExceeded, Unavailable, WorkerFailed
from vllm_sr.pool.connection import WorkerResponse
from vllm_sr.pool.directory import PoolDirectory
from vllm_sr.pool.pool import ReplicaPool
from vllm_sr.pool.replica import Outcome, Replica

DEADLINE_HEADER = wire.DEADLINE_HEADER
MAX_ATTEMPTS = 2  # the first try and one retry on another replica


@dataclass(frozen=True)
class Answer:
    """A worker's answer: its bytes unchanged, which replica gave it, and the retries taken."""

    status: int
    body: bytes
    content_type: str
    headers: dict[str, str]
    replica_id: str
    retries: int = 0
    retried_from: str | None = None


def outcome_of(status: int, forward: bool | None = None) -> Outcome:
    """How an answer counts for the replica that gave it (``forward``: the worker's
    ``X-Vsr-Forward``, None when it does not say).

    Only an answer a forward produced is a ``success``: a worker whose forward hangs still
    answers its result cache and refuses bad input from its HTTP loop, and those answers must
    not reset its timeouts, clear its backoff or vouch for it to its peers (``no_forward``
    neither counts nor resets, like ``refused``). A 504 is the worker's own deadline passing
    with the rows still queued: a ``timeout``, like one the pool saw itself. An answer from a
    runtime that does not say is a success when 2xx (nothing better is known) and a verdict
    on the input (``no_forward``) when 4xx."""
    if status == 429:
        return "refused"  # the worker's own admission said no: neither a success nor a fault
    if status == 504:
        return "timeout"  # deadline_exceeded: the exchange ran out of its deadline there
    if status >= 500:
        return "failure"
    if forward is None:
        return "success" if status < 400 else "no_forward"
    return "success" if forward else "no_forward"


def with_model(body: bytes, model: str) -> bytes:
    """The body with ``model`` set to what an attached runtime serves (its own name for the
    deployment's model)."""
    doc = json.loads(body)
    doc["model"] = model
    return json.dumps(doc, separators=(",", ":")).encode()


async def exchange(
    pool: ReplicaPool,
    path: str,
    body: bytes,
    caller_timeout_ms: float | None = None,
    *,
    kind: str = "native",
    clock: Clock = SYSTEM_CLOCK,
) -> Answer:
    """Send ``body`` to the replica the pool picks (one retry elsewhere, see the module doc).
    Raises ``Overloaded``/``Unavailable`` (admission), ``DeadlineExceeded`` and
    ``WorkerFailed``; the pool's lease is always released, whatever happens."""
    deadline = clock.monotonic() + pool.settings.deadline_s(caller_timeout_ms)
    tried: list[str] = []
    failed: WorkerFailed | None = None
    while True:
        try:
            lease = pool.acquire(len(body), exclude=tried, kind=kind)
        except Unavailable:
            if failed is not None:  # no other replica could take the retry: the first failure
                raise failed from None
            raise
        if failed is not None:
            pool.note_retry(tried[-1], failed.code)
        rep = lease.replica
        assert rep is not None
        remaining = deadline - clock.monotonic()
        outcome: Outcome = "failure"
        try:
            resp = await _send(rep, path, body, remaining)
            outcome = outcome_of(resp.status, resp.forward)
        except DeadlineExceeded:
            outcome = "timeout"
            raise
        except WorkerFailed as exc:
            tried.append(rep.id)
            left = deadline - clock.monotonic()
            # Only an exchange that got no byte of an answer is sent elsewhere: one cut off
            # mid-answer was answered, and is the caller's 502.
            before_answer = exc.details.get("before_answer", True)
            if not before_answer or len(tried) >= MAX_ATTEMPTS or left <= 0:
                raise
            failed = exc
            continue
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            pool.release(lease, outcome)
        retries = len(tried)
        return Answer(
            resp.status,
            resp.body,
            resp.content_type,
            resp.headers,
            rep.id,
            retries,
            tried[0] if tried else None,
        )


async def _send(rep: Replica, path: str, body: bytes, remaining_s: float) -> WorkerResponse:
    if rep.client is None:  # published pools only hold workers with a client; be safe anyway
        raise WorkerFailed(f"replica {rep.id} has no worker client", replica=rep.id)
    if remaining_s <= 0:
        raise DeadlineExceeded(f"no time left for replica {rep.id}", replica=rep.id)
    if rep.served_model is not None:
        body = with_model(body, rep.served_model)
    headers = {DEADLINE_HEADER: wire.deadline_header_value(remaining_s)}
    return await rep.client.post(path, body, timeout_s=remaining_s, headers=headers)


RoutingExchange = Callable[[str, str, bytes, float | None], Awaitable[tuple[int, bytes]]]


def routing_exchange(directory: PoolDirectory) -> RoutingExchange:
    """Router mode's questions to the deployments' workers: ``(deployment, path, body,
    timeout_ms) -> (status, body)`` through ``exchange`` with ``kind="routing"``, on the same
    admission and per-worker accounting as native requests. Made here, in the pool, so that a
    routed chat goes frontend -> router -> pool and never back up through the frontend."""

    async def ask(
        deployment: str, path: str, body: bytes, timeout_ms: float | None
    ) -> tuple[int, bytes]:
        answer = await exchange(
            directory.resolve(deployment), path, body, timeout_ms, kind="routing"
        )
        return answer.status, answer.body

    return ask
