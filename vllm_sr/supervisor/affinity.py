"""Where the service process itself runs: off the CPUs its workers are pinned to."""

from __future__ import annotations

import contextlib

import psutil

from vllm_sr.plan import ServicePlan


def place_service(plan: ServicePlan | None, own_cpus: list[int]) -> list[int]:
    """Keep the service's own per-request work off the workers' pinned CPUs when some are
    left over (the page: per-request work small and off the forward's cores). Returns the
    CPU set the service started with (remembered across reloads)."""
    if plan is None:
        return own_cpus
    specs = [s for s in plan.specs() if not s.endpoint]
    cpu_sets = [s.cpus for s in specs]
    if not cpu_sets or not all(cpu_sets):
        return own_cpus  # an unpinned worker would inherit a narrowed set: leave it all
    pinned = {c for cpus in cpu_sets for c in cpus or ()}
    with contextlib.suppress(psutil.Error, OSError, AttributeError):
        me = psutil.Process()
        if not own_cpus:
            own_cpus = list(me.cpu_affinity() or [])
        rest = [c for c in own_cpus if c not in pinned]
        me.cpu_affinity(rest or own_cpus)
    return own_cpus
