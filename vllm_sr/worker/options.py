"""What a worker is told before it binds: its options (``vllm-sr worker``'s flags), the
settings it reads from its environment (fault injection, body and read limits), and the state
built from both (:func:`build_state`), where a bad artifact name or setting fails before any
socket exists (exit 78)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_sr import wire
from vllm_sr.errors import ConfigError, VllmSrError
from vllm_sr.events import Event, log_sink
from vllm_sr.worker import artifacts, precision
from vllm_sr.worker.engine_types import Faults
from vllm_sr.worker.policy import policy_from_env
from vllm_sr.worker.result_cache import ResultCache
from vllm_sr.worker.state import WorkerState
from vllm_sr.worker.threads import worker_cpu_budget

ENV_FAULTS = "VLLM_SR_ENABLE_FAULTS"
ENV_FAULT_DELAY = "VLLM_SR_FAULT_FORWARD_DELAY_MS"
ENV_READ_TIMEOUT = "VLLM_SR_WORKER_READ_TIMEOUT_S"
ENV_MAX_BODY = "VLLM_SR_WORKER_MAX_BODY_BYTES"


@dataclass
class WorkerOptions:
    artifact: str
    uds: str | None = None
    port: int | None = None
    host: str = "127.0.0.1"
    device: str = "cpu"
    threads: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    replica_id: str | None = None
    served_names: tuple[str, ...] = ()
    result_cache_bytes: int = 0  # 0: no result cache
    revision: str | None = None  # the revision asked for (a Hugging Face revision)
    dtype: str = "auto"  # engine_args.dtype: auto, float32, bfloat16 or float16
    max_input_tokens: int | None = None  # input.max_tokens: None = the model's maximum
    overflow: str = "reject"  # input.overflow: reject or truncate


def cpu_budget() -> int:
    """The planner's CPU budget seen from this process (affinity, cgroup quota, machine)."""
    return worker_cpu_budget()


def default_threads(budget: int) -> int:
    """The page's default: half the CPU budget, rounded down, at least 1, at most 16."""
    return min(16, max(1, budget // 2))


def faults_from_env(env: Mapping[str, str]) -> Faults:
    enabled = env.get(ENV_FAULTS) == "1"
    delay_ms = 0.0
    if enabled and env.get(ENV_FAULT_DELAY):
        try:
            delay_ms = float(env[ENV_FAULT_DELAY])
        except ValueError:
            raise VllmSrError(
                f"{ENV_FAULT_DELAY}={env[ENV_FAULT_DELAY]!r} is not a number of milliseconds"
            ) from None
    return Faults(enabled, delay_ms / 1000.0)


def _env_number(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise VllmSrError(f"{name}={raw!r} is not a number") from None
    if value <= 0:
        raise VllmSrError(f"{name}={raw!r} must be positive")
    return value


def build_state(opts: WorkerOptions, env: Mapping[str, str]) -> WorkerState:
    """Everything decided before binding: a bad artifact or setting fails here (exit 78)."""
    artifacts.resolve(opts.artifact)  # fail fast, before any socket exists
    precision.check_requested(opts.dtype)
    budget = cpu_budget()
    threads = opts.threads if opts.threads is not None else default_threads(budget)
    policy = policy_from_env(threads, budget, env, emit=_emit, device=opts.device, dtype=opts.dtype)
    names = {opts.artifact, opts.artifact.rstrip("/").rsplit("/", 1)[-1], *opts.served_names}
    if opts.result_cache_bytes < 0:
        raise ConfigError(
            f"--result-cache-bytes: {opts.result_cache_bytes} is negative; use 0 (off) or a "
            "positive number of bytes"
        )
    state = WorkerState(
        artifact=opts.artifact,
        device=opts.device,
        threads=threads,
        policy=policy,
        faults=faults_from_env(env),
        replica_id=opts.replica_id,
        served_names=frozenset(names),
        max_body=int(_env_number(env, ENV_MAX_BODY, wire.MAX_BODY_BYTES)),
        read_timeout_s=_env_number(env, ENV_READ_TIMEOUT, wire.READ_TIMEOUT_S),
        result_cache=ResultCache(opts.result_cache_bytes),
    )
    state.metrics.cache_max_bytes.set(opts.result_cache_bytes)
    return state


_event_log = log_sink(logging.getLogger("vllm_sr.worker"))


def _emit(name: str, **fields: Any) -> None:
    """Events from the thread policy go to the log (the supervisor reads worker logs)."""
    _event_log(Event(0, time.time(), name, fields))
