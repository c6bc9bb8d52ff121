"""Where the service process itself runs: off the CPUs its workers are pinned to."""

from __future__ import annotations

import contextlib
from typing import Any

import psutil


def place_service(plan: Any, own_cpus: list[int]) -> list[int]:
    """Keep the service's own per-request work off the workers' pinned CPUs when some are
    left over (the page: per-request work small and off the forward's cores). Returns the
    CPU set the service started with (remembered across reloads)."""
    if plan is None:
        return own_cpus
    specs = [s for s in plan.specs() if not getattr(s, "endpoint", None)]
    if not specs or not all(getattr(s, "cpus", None) for s in specs):
        return own_cpus  # an unpinned worker would inherit a narrowed set: leave it all
    pinned = {c for spec in specs for c in spec.cpus}
    with contextlib.suppress(psutil.Error, OSError, AttributeError):
        me = psutil.Process()
        if not own_cpus:
            own_cpus = list(me.cpu_affinity() or [])
        rest = [c for c in own_cpus if c not in pinned]
        me.cpu_affinity(rest or own_cpus)
    return own_cpus
