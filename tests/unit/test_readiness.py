"""v0.4's /ready and /startup-status documents (vllm_sr/supervisor/readiness.py): worker and
deployment phases, and when the service is ready."""

from __future__ import annotations

import pytest

from vllm_sr.plan import ReplicaState as S
from vllm_sr.supervisor.readiness import WorkerView, deployment_phase, startup_status, worker_phase


@pytest.mark.parametrize(
    ("state", "reported", "phase"),
    [
        (S.STARTING, None, "starting"),  # not listening yet
        (S.STARTING, "starting", "starting"),
        (S.STARTING, "loading", "loading"),
        (S.STARTING, "warming", "warming"),
        (S.STARTING, "failed", "error"),
        (S.STARTING, "ready", "warming"),  # 200 seen by the worker, not yet by the supervisor
        (S.READY, "ready", "ready"),
        (S.EJECTED, "ready", "ready"),
        (S.DRAINING, "ready", "ready"),
        (S.FAILED, "loading", "error"),
        (S.BACKOFF, "loading", "backoff"),
        (S.HUNG, "ready", "hung"),
        (S.INCOMPATIBLE, "ready", "incompatible"),
    ],
)
def test_worker_phase(state: S, reported: str | None, phase: str) -> None:
    assert worker_phase(state, reported) == phase


def test_deployment_phase_is_its_earliest_loading_worker_else_how_it_serves() -> None:
    assert deployment_phase(["ready", "warming", "loading"], 1) == "loading"
    assert deployment_phase(["warming", "starting"], 0) == "starting"
    assert deployment_phase(["ready", "ready"], 2) == "ready"
    assert deployment_phase(["ready", "backoff"], 1) == "degraded"
    assert deployment_phase(["error", "backoff"], 0) == "error"
    assert deployment_phase(["backoff"], 0) == "unavailable"


def view(rid: str, state: S, reported: str | None = None) -> WorkerView:
    return WorkerView(rid, state, reported, serving=state is S.READY, reason=None)


def status(
    workers: dict[str, list[WorkerView]],
    desired: dict[str, int] | None = None,
    *,
    published: bool = True,
    stopping: bool = False,
) -> dict[str, object]:
    want = desired if desired is not None else {n: len(w) for n, w in workers.items()}
    return startup_status(want, workers, published=published, stopping=stopping, generation=3)


def test_one_serving_replica_is_not_ready_while_another_loads() -> None:
    doc = status({"primary": [view("p-0", S.READY, "ready"), view("p-1", S.STARTING, "loading")]})
    assert doc["ready"] is False and doc["phase"] == "loading" and doc["generation"] == 3
    dep = doc["deployments"]["primary"]  # type: ignore[index]
    assert dep["phase"] == "loading" and dep["ready_replicas"] == 1
    assert [r["phase"] for r in dep["replicas"]] == ["ready", "loading"]
    assert dep["replicas"][1] == {
        "id": "p-1",
        "phase": "loading",
        "state": "starting",
        "reason": None,
    }


def test_ready_once_every_worker_finished_loading_and_each_deployment_serves() -> None:
    doc = status(
        {
            "primary": [view("p-0", S.READY, "ready"), view("p-1", S.READY, "ready")],
            "classifier": [view("c-0", S.READY, "ready")],
        }
    )
    assert doc["ready"] is True and doc["phase"] == "ready"
    # A worker that failed for good beside a serving one: ready, the deployment degraded.
    doc = status({"primary": [view("p-0", S.READY), view("p-1", S.FAILED, "failed")]})
    assert doc["ready"] is True
    assert doc["deployments"]["primary"]["phase"] == "degraded"  # type: ignore[index]


def test_a_deployment_with_no_serving_replica_is_not_ready() -> None:
    doc = status({"primary": [view("p-0", S.READY)], "classifier": [view("c-0", S.FAILED)]})
    assert doc["ready"] is False and doc["phase"] == "error"
    doc = status({"primary": [view("p-0", S.BACKOFF)]})
    assert doc["ready"] is False and doc["phase"] == "unavailable"


def test_replicas_with_no_worker_yet_count_as_starting() -> None:
    doc = status({"primary": [view("p-0", S.READY)]}, {"primary": 2})
    assert doc["ready"] is False and doc["phase"] == "starting"
    assert doc["deployments"]["primary"]["desired_replicas"] == 2  # type: ignore[index]


def test_before_the_first_generation_and_while_stopping() -> None:
    assert status({}, published=False) == {
        "ready": False,
        "phase": "starting",
        "generation": 3,
        "deployments": {},
    }
    stopping = status({"primary": [view("p-0", S.READY)]}, stopping=True)
    assert stopping["ready"] is False and stopping["phase"] == "stopping"


def test_a_routing_that_needs_no_worker_is_ready_at_once() -> None:
    assert status({}, {})["ready"] is True
