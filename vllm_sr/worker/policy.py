"""Which thread policy a worker serves with, decided once at startup from its environment.

- ``VLLM_SRUN_CPU_ADAPTIVE_THREADS`` unset, empty or 0: the configured count, always.
- On a GPU worker any adaptive mode is refused with a warning: the count is fixed.
- 1: the learner (mode 1), writing this host's record when it finishes without a drift.
- 2: mode 2 only when this host's record vouches for every count it may serve; otherwise
  mode 1 with a warning naming the missing record (mode 1 then writes it).
- 1 or 2 on a host whose record says a count drifted: retired from the start ("recorded
  drift"), serving the configured count, until the record is removed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.worker.learner import AdaptiveThreads, Emit
from vllm_sr.worker.learner_stats import allowed_counts
from vllm_sr.worker.threads import ENV_ADAPTIVE, FixedThreads, ThreadPolicy, parse_mode
from vllm_sr.worker.threads_record import HostFacts, HostRecords, host_facts, record_dir

log = logging.getLogger("vllm_sr.worker.threads")


def policy_from_env(
    configured: int,
    budget: int,
    env: Mapping[str, str],
    emit: Emit | None = None,
    clock: Clock = SYSTEM_CLOCK,
    *,
    device: str = "cpu",
    facts: Callable[[], HostFacts] | None = None,
    dtype: str = "auto",
) -> ThreadPolicy:
    """``dtype`` is the worker's engine_args.dtype: the host record is kept per served dtype
    (shadow passes rerun the served forward, so they compare at that precision)."""
    mode = parse_mode(env)
    if mode == 0:
        return FixedThreads(configured)
    if device != "cpu":
        log.warning(
            "%s=%d is refused on %s: adaptive threads are a CPU feature; serving every "
            "forward at the fixed count %d",
            ENV_ADAPTIVE,
            mode,
            device,
            configured,
        )
        return FixedThreads(configured)
    records = HostRecords(record_dir(env), facts() if facts else host_facts(dtype))
    fallback = None
    if mode == 2:
        why_not = records.vouches_for(allowed_counts(configured, budget))
        if why_not is not None:
            fallback = (
                f"{ENV_ADAPTIVE}=2 asked, but no record vouches for bit-identity across counts "
                f"on this host ({why_not}): learning in mode 1, which writes the record when "
                "it finishes without a drift"
            )
            log.warning("%s", fallback)
            mode = 1
    drift = records.recorded_drift()
    recorded = None
    if drift is not None:
        recorded = (
            f"recorded drift: the record at {records.path} says a count drifted on this host "
            f"({drift}); remove that file to relearn"
        )
        log.warning("adaptive threads retired at start: %s", recorded)
    return AdaptiveThreads(
        mode,
        configured,
        budget,
        emit=emit,
        clock=clock,
        records=records,
        fallback=fallback,
        recorded_drift=recorded,
        record_path=str(records.path),
    )
