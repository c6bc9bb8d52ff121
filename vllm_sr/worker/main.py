"""The worker process: bind HTTP first (so /health says 503 while it loads), load the artifact
on a loader thread, calibrate, pass the golden check, serve; exit on SIGTERM or when the parent
dies. Signal handlers only set an event; one coroutine does the shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_sr import wire
from vllm_sr.errors import EXIT_OK, ConfigError, GoldenCheckFailed, NotReady, VllmSrError
from vllm_sr.events import Event, log_sink
from vllm_sr.httpserver import HttpServer
from vllm_sr.worker import artifacts, calibrate, goldens, precision, surfaces
from vllm_sr.worker.api import WorkerState, build_server, deliver_to_loop
from vllm_sr.worker.engine import Engine, Faults, Job
from vllm_sr.worker.forming import (
    CPU_FORWARD_TOKENS_PER_THREAD,
    PROBE_WIDTH,
    ForwardCosts,
    probe_shapes,
)
from vllm_sr.worker.policy import policy_from_env
from vllm_sr.worker.result_cache import ResultCache
from vllm_sr.worker.threads import process_context, worker_cpu_budget

log = logging.getLogger("vllm_sr.worker")

DRAIN_GRACE_S = 3.0  # SIGTERM: in-flight forwards get this long to finish
PARENT_POLL_S = 1.0
ENV_FAULTS = "VLLM_SR_ENABLE_FAULTS"
ENV_FAULT_DELAY = "VLLM_SR_FAULT_FORWARD_DELAY_MS"
ENV_READ_TIMEOUT = "VLLM_SR_WORKER_READ_TIMEOUT_S"
ENV_MAX_BODY = "VLLM_SR_WORKER_MAX_BODY_BYTES"
ENV_PARENT_PID = "VLLM_SR_PARENT_PID"  # set by the supervisor (supervisor/process.py)
PR_SET_PDEATHSIG = 1


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


def run(opts: WorkerOptions, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    state = build_state(opts, env)
    return asyncio.run(serve(opts, state, expected_parent(env)))


def _limit_interop_threads() -> None:
    import torch

    with contextlib.suppress(RuntimeError):  # already set once in this process
        torch.set_num_interop_threads(1)


async def serve(opts: WorkerOptions, state: WorkerState, parent: int | None = None) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.create_task(watch_parent(stop, parent))
    server = build_server(state)
    await bind(server, opts)
    log.info("listening on %s", opts.uds or f"{opts.host}:{opts.port}")
    loaded: asyncio.Future[None] = loop.create_future()
    loader = threading.Thread(
        target=_load_thread, args=(opts, state, loop, loaded), name="vllm-sr-loader", daemon=True
    )
    loader.start()
    stopper: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    try:
        waiters: set[asyncio.Future[Any]] = {loaded, stopper}
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        if loaded.done() and loaded.exception() is not None:
            exc = loaded.exception()
            state.set_status("failed", str(exc))
            log.error("startup failed: %s", exc)
            assert exc is not None
            raise exc
        if not stop.is_set():
            state.set_status("ready", None)
            await stop.wait()
        log.info("stopping")
    finally:
        watcher.cancel()
        stopper.cancel()
        await shutdown(state, server, opts, loader)
    return EXIT_OK


async def bind(server: HttpServer, opts: WorkerOptions) -> None:
    if opts.uds:
        _remove_stale_socket(Path(opts.uds))
        await server.listen_unix(opts.uds)
    elif opts.port is not None:
        await server.listen_tcp(opts.host, opts.port)
    else:
        raise ConfigError("the worker needs a Unix socket (--uds PATH) or a port (--port N)")


def _remove_stale_socket(path: Path) -> None:
    """A socket file left by a dead worker would make bind fail; one with a live listener
    behind it is not ours to take."""
    try:
        if not stat.S_ISSOCK(path.lstat().st_mode):
            return
    except FileNotFoundError:
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink(missing_ok=True)
    finally:
        probe.close()


async def shutdown(
    state: WorkerState,
    server: HttpServer,
    opts: WorkerOptions,
    loader: threading.Thread | None = None,
) -> None:
    server.stop_accepting()  # no new connections; those open are still answered
    engine = state.engine
    if engine is not None:
        # Queued and running forwards get the grace; a forward held longer by an injected
        # delay is cut when it ends (the delay waits on the engine's shutdown event).
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, engine.stop, DRAIN_GRACE_S)
        if loader is not None:
            # Still warming: the loader stops after the probe or golden forward it runs (the
            # process must not exit under a forward: torch aborts then).
            await loop.run_in_executor(None, loader.join, DRAIN_GRACE_S)
    await server.close(DRAIN_GRACE_S)
    if opts.uds:
        with contextlib.suppress(OSError):
            Path(opts.uds).unlink()


def expected_parent(env: Mapping[str, str]) -> int | None:
    """The supervisor's pid, when it said so (it may sit behind a wrapper such as taskset)."""
    raw = env.get(ENV_PARENT_PID, "")
    return int(raw) if raw.isdigit() and int(raw) > 1 else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def watch_parent(stop: asyncio.Event, expected: int | None = None) -> None:
    """Exit when the parent dies: PR_SET_PDEATHSIG delivers SIGTERM on Linux; polling
    getppid (and the supervisor's pid from VLLM_SR_PARENT_PID) covers other kernels, a parent
    that died before prctl took effect, and a wrapper process in between."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    parent = os.getppid()
    if parent == 1 and expected is None:
        return  # started under init with no supervisor named: nothing to watch
    while True:
        gone = parent != 1 and os.getppid() != parent
        if gone or (expected is not None and not _pid_alive(expected)):
            log.warning("parent %d is gone; stopping", expected or parent)
            stop.set()
            return
        await asyncio.sleep(PARENT_POLL_S)


def _load_thread(
    opts: WorkerOptions,
    state: WorkerState,
    loop: asyncio.AbstractEventLoop,
    done: asyncio.Future[None],
) -> None:
    def finish(exc: BaseException | None) -> None:
        if done.done():
            return
        if exc is None:
            done.set_result(None)
        else:
            done.set_exception(exc)

    try:
        load_and_check(opts, state, loop)
        error: BaseException | None = None
    except BaseException as exc:  # carried to the loop, which decides the exit code
        if not isinstance(exc, VllmSrError):
            log.exception("startup failed")
        error = exc
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(finish, error)


def load_and_check(
    opts: WorkerOptions, state: WorkerState, loop: asyncio.AbstractEventLoop
) -> None:
    state.set_status("loading", f"loading {opts.artifact} on {opts.device}")
    # torch is imported here, after the socket is bound, so /health says "loading" meanwhile.
    if opts.device == "cpu":
        _limit_interop_threads()
    spec = artifacts.resolve(opts.artifact)
    served = precision.resolve(opts.dtype, precision.facts_for(opts.device))
    if served.warning:
        log.warning("dtype: %s", served.warning)
    loaded = artifacts.load(spec, opts.device, opts.revision, served.dtype)
    if loaded.revision_note:
        log.warning("revision: %s", loaded.revision_note)
    state.set_status(
        "warming", "calibrating limits, measuring forward costs and running the golden check"
    )
    cal = calibrate_for(loaded, opts)
    kind = opts.device.partition(":")[0]  # cpu, cuda or rocm
    state.limits = cal.limits
    state.limit_source = cal.source
    engine = Engine(
        loaded.runner,
        cal.limits,
        policy=state.policy,
        context=process_context(),
        metrics=state.metrics,
        faults=state.faults,
        deliver=deliver_to_loop(loop),
        forward_tokens=forward_tokens(kind, state.threads),
    )
    state.engine = engine  # from here SIGTERM stops the engine, and the probes with it
    max_len = min(loaded.max_length, cal.limits.max_num_batched_tokens)
    measure_forward_costs(loaded, engine, kind, max_len)
    engine.start()
    state.view = surfaces.ModelView(
        name=opts.artifact,
        names=state.served_names,
        dimensions=loaded.dimensions,
        max_length=max_len,
        head_labels=loaded.labels,
        encode=loaded.tokenizer.encode,
        truncate=loaded.tokenizer.truncate,
        vocab_size=loaded.vocab_size,
        token_head=loaded.runner.token,
    )
    state.card = model_card(loaded, max_len)
    state.card["revision_requested"] = opts.revision
    state.card["revision_note"] = loaded.revision_note
    state.card["precision"] = served.to_json()
    state.revision = loaded.revision
    state.capabilities = capabilities(loaded, max_len)
    golden_check(loaded, engine, opts.artifact)
    state.policy.golden_passed()
    log.info(
        "ready: %s on %s, %s (%s), %d threads, limits %s (%s)",
        opts.artifact,
        opts.device,
        served.dtype,
        served.reason,
        state.threads,
        cal.limits.to_json(),
        cal.source,
    )


SURFACES = ("embeddings", "classify")  # a bundle carries tasks of these


def capabilities(loaded: artifacts.LoadedArtifact, max_length: int) -> dict[str, Any]:
    """What this worker can answer, compared across a deployment's replicas: ``labels`` is
    what a classification head classifies, null for an encoder that classifies against the
    labels a caller gives."""
    return {
        "surfaces": list(SURFACES),
        "dimensions": loaded.dimensions,
        "max_length": max_length,
        "labels": list(loaded.labels) if loaded.labels else None,
        "dtype": loaded.dtype,
    }


def model_card(loaded: artifacts.LoadedArtifact, max_length: int) -> dict[str, Any]:
    surfaces_list = list(SURFACES)
    return {
        "artifact": loaded.spec.name,
        "path": str(loaded.spec.path),
        "builtin": loaded.spec.builtin,
        "revision": loaded.revision,
        "sha256": loaded.sha256,
        "dtype": loaded.dtype,
        "dimensions": loaded.dimensions,
        "max_length": max_length,
        "surfaces": surfaces_list,
        "labels": loaded.labels,
        "classify_by": "head" if loaded.labels else "label examples",
    }


def calibrate_for(loaded: artifacts.LoadedArtifact, opts: WorkerOptions) -> calibrate.Calibration:
    kind = opts.device.partition(":")[0]
    probe = None
    free = None
    if kind != "cpu" and opts.max_num_batched_tokens is None:
        from vllm_sr.worker.gpu import torch_probe

        probe, free = torch_probe(loaded)
    return calibrate.calibrate(
        device_kind=kind,
        max_length=loaded.max_length,
        max_num_seqs=opts.max_num_seqs,
        max_num_batched_tokens=opts.max_num_batched_tokens,
        probe=probe,
        free_bytes=free,
    )


CPU_PROBE_TOKENS = 512  # probe forwards up to this size on CPU (about half a second here)
GPU_PROBE_TOKENS = 16384


def forward_tokens(kind: str, threads: int) -> int | None:
    """The padded tokens forwards are formed to on a device of ``kind`` (cpu, cuda, rocm): on
    CPU ``CPU_FORWARD_TOKENS_PER_THREAD`` per thread (past it a token costs more, see
    forming.py); on a GPU only the limits."""
    return CPU_FORWARD_TOKENS_PER_THREAD * threads if kind == "cpu" else None


def measure_forward_costs(
    loaded: artifacts.LoadedArtifact, engine: Engine, kind: str, max_length: int
) -> None:
    """Probe forwards of doubling sizes (before the engine starts), so that the first real
    forwards are formed on measured costs; every forward after keeps them current."""
    ceiling = CPU_PROBE_TOKENS if kind == "cpu" else GPU_PROBE_TOKENS
    limits = engine.limits
    ceiling = min(ceiling, limits.max_num_batched_tokens)
    text = " ".join(goldens.GOLDEN_INPUTS)
    base = loaded.tokenizer.encode([text])[0]
    while len(base) < PROBE_WIDTH:
        text = f"{text} {text}"
        base = loaded.tokenizer.encode([text])[0]
    started = time.perf_counter()
    shapes = [
        (rows, width)
        for rows, width in probe_shapes(ceiling)
        if rows <= limits.max_num_seqs and width <= max_length
    ]
    if shapes:
        rows, width = shapes[-1]
        engine.measure([loaded.tokenizer.truncate(base, width)] * rows)  # warm-up, not kept
        engine.costs = ForwardCosts()
    for rows, width in shapes:
        if engine.stopping:
            raise NotReady("the worker stopped while measuring forward costs")
        engine.measure([loaded.tokenizer.truncate(base, width)] * rows)
    log.info(
        "forward costs measured in %.2f s: %s",
        time.perf_counter() - started,
        engine.costs.to_json()["ms_per_1k_tokens"],
    )


def blocking_forward(engine: Engine) -> goldens.Forward:
    """Run rows through the engine from a non-loop thread and wait for them."""

    def forward(rows: list[list[int]]) -> Any:
        finished = threading.Event()
        job = engine.submit(rows, lambda _job: finished.set())
        if not finished.wait(timeout=600):
            raise GoldenCheckFailed("golden check: the forward did not finish within 600 s")
        return job.result()

    return forward


def golden_check(loaded: artifacts.LoadedArtifact, engine: Engine, artifact: str) -> None:
    forward = blocking_forward(engine)
    texts = goldens.GOLDEN_INPUTS
    rows = [loaded.tokenizer.truncate(r, loaded.max_length) for r in loaded.tokenizer.encode(texts)]
    reference = goldens.load_reference(artifact) if loaded.spec.builtin else None
    if reference is not None:
        goldens.check_reference(rows, forward, reference, loaded.dimensions, loaded.dtype)
    else:
        goldens.check_consistency(rows, forward, loaded.dtype)
    how = "float32 references" if reference else "batched == one-row"
    log.info("golden check passed (%s, %s tolerance)", how, loaded.dtype)


__all__ = ["Job", "WorkerOptions", "run"]
