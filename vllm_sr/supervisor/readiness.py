"""v0.4's ``/ready`` and ``/startup-status``: where each worker of the published generation is
in its start (``starting`` -> ``loading`` -> ``warming`` -> ``ready``, or ``error``), per
deployment, and whether the service is ready: every deployment of the generation (the ones its
routing asks, in Router mode; a routing that needs no model has none) has a serving replica and
none of its workers is still starting, loading or warming.

``/health`` says whether each deployment can answer now (one serving replica is enough);
``/ready`` waits, in addition, for every worker the generation runs to finish loading, so that
a probe or a bench started on ``/ready`` never meets a signal still loading (its answer would
be unknown: vllm_sr/router/unknown.py). A reload's new workers load beside the serving
generation and do not take ``/ready`` back to 503. Pure functions over :class:`WorkerView`; the
supervisor builds the views.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vllm_sr.jsontypes import JsonObject
from vllm_sr.plan import ReplicaState

LOADING = ("starting", "loading", "warming")  # in the order a worker passes them
SERVING_STATES = (ReplicaState.READY, ReplicaState.EJECTED, ReplicaState.DRAINING)


@dataclass(frozen=True)
class WorkerView:
    """One published worker as the supervisor sees it."""

    id: str
    state: ReplicaState  # the supervisor's lifecycle state
    reported: str | None  # the "status" of its last /health body (starting, loading, ...)
    serving: bool  # a member of dispatch (the pool's record: ready and healthy)
    reason: str | None = None  # its last error, or what its /health said it is doing


def worker_phase(state: ReplicaState, reported: str | None) -> str:
    """``starting``, ``loading``, ``warming``, ``ready``, ``error``, or the lifecycle state
    itself for a worker out of its start (``backoff``, ``hung``, ``incompatible``,
    ``stopped``)."""
    if state is ReplicaState.STARTING:
        if reported == "failed":
            return "error"
        if reported == "ready":  # loaded; the supervisor has not yet seen its 200
            return "warming"
        return reported if reported in LOADING else "starting"
    if state in SERVING_STATES:
        return "ready"
    if state is ReplicaState.FAILED:
        return "error"
    return str(state)


def deployment_phase(phases: Iterable[str], serving: int) -> str:
    """The earliest loading phase of its workers; else ``ready`` (all ready), ``degraded``
    (some serve), ``error`` (none serves and one failed for good) or ``unavailable``."""
    seen = list(phases)
    for phase in LOADING:
        if phase in seen:
            return phase
    if seen and all(p == "ready" for p in seen):
        return "ready"
    if serving > 0:
        return "degraded"
    return "error" if "error" in seen else "unavailable"


def startup_status(
    desired: Mapping[str, int],
    workers: Mapping[str, list[WorkerView]],
    *,
    published: bool,
    stopping: bool,
    generation: int,
) -> JsonObject:
    """The ``/startup-status`` document. ``desired``: each deployment of the generation and
    its replica count (a replica with no worker yet counts as ``starting``)."""
    deployments: JsonObject = {}
    loading = False
    every_serves = True
    for name, want in desired.items():
        views = workers.get(name, [])
        phases = [worker_phase(w.state, w.reported) for w in views]
        phases += ["starting"] * max(0, want - len(views))
        serving = sum(1 for w in views if w.serving)
        phase = deployment_phase(phases, serving)
        loading = loading or any(p in LOADING for p in phases)
        every_serves = every_serves and serving > 0
        deployments[name] = {
            "phase": phase,
            "desired_replicas": want,
            "ready_replicas": serving,
            "replicas": [
                {"id": w.id, "phase": p, "state": str(w.state), "reason": w.reason}
                for w, p in zip(views, phases, strict=False)
            ],
        }
    ready = published and not stopping and not loading and every_serves
    return {
        "ready": ready,
        "phase": _service_phase(deployments, ready, published=published, stopping=stopping),
        "generation": generation,
        "deployments": deployments,
    }


def _service_phase(deployments: JsonObject, ready: bool, *, published: bool, stopping: bool) -> str:
    if stopping:
        return "stopping"
    if not published:
        return "starting"
    if ready:
        return "ready"
    phases = [str(d["phase"]) for d in deployments.values() if isinstance(d, dict)]
    for phase in (*LOADING, "error"):
        if phase in phases:
            return phase
    return "unavailable"
