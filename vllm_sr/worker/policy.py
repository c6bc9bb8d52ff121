"""Which thread policy a worker serves with, decided once at startup from its environment."""

from __future__ import annotations

from collections.abc import Mapping

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.worker.learner import AdaptiveThreads, Emit
from vllm_sr.worker.threads import FixedThreads, ThreadPolicy, parse_mode


def policy_from_env(
    configured: int,
    budget: int,
    env: Mapping[str, str],
    emit: Emit | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> ThreadPolicy:
    mode = parse_mode(env)
    if mode == 0:
        return FixedThreads(configured)
    return AdaptiveThreads(mode, configured, budget, emit=emit, clock=clock)
