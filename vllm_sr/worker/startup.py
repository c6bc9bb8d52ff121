"""A worker's startup on its loader thread: load the artifact, calibrate the batch limits,
measure forward costs with probe forwards, build the engine and its model view, and pass the
golden check; the event loop (``main``) learns the outcome through a future and serves or exits
with it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from typing import Any

from vllm_sr.errors import GoldenCheckFailed, NotReady, VllmSrError
from vllm_sr.worker import artifacts, calibrate, goldens, precision, surfaces
from vllm_sr.worker.api import deliver_to_loop
from vllm_sr.worker.engine import Engine
from vllm_sr.worker.forming import (
    CPU_FORWARD_TOKENS_PER_THREAD,
    CPU_FORWARD_TOKENS_PER_THREAD_HALF,
    PROBE_WIDTH,
    ForwardCosts,
    probe_shapes,
)
from vllm_sr.worker.options import WorkerOptions
from vllm_sr.worker.state import WorkerState
from vllm_sr.worker.threads import process_context

log = logging.getLogger("vllm_sr.worker")


def _limit_interop_threads() -> None:
    import torch

    with contextlib.suppress(RuntimeError):  # already set once in this process
        torch.set_num_interop_threads(1)


def load_thread(
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
        forward_tokens=forward_tokens(kind, state.threads, served.dtype),
    )
    state.engine = engine  # from here SIGTERM stops the engine, and the probes with it
    max_len = min(loaded.max_length, cal.limits.max_num_batched_tokens)
    measure_forward_costs(loaded, engine, kind, max_len)
    limit = surfaces.input_limit(max_len, opts.max_input_tokens)
    engine.start()
    state.view = surfaces.ModelView(
        name=opts.artifact,
        names=state.served_names,
        dimensions=loaded.dimensions,
        max_length=limit.tokens,
        head_labels=loaded.labels,
        encode=loaded.tokenizer.encode,
        truncate=loaded.tokenizer.truncate,
        vocab_size=loaded.vocab_size,
        token_head=loaded.runner.token,
        multi_label_head=loaded.spec.multi_label and not loaded.runner.token,
        limit_name=limit.name,
        overflow_truncates=opts.overflow == "truncate",
    )
    state.card = model_card(loaded, max_len)
    state.card["revision_requested"] = opts.revision
    state.card["revision_note"] = loaded.revision_note
    state.card["precision"] = served.to_json()
    state.card["input"] = {"max_tokens": limit.tokens, "overflow": opts.overflow}
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


def forward_tokens(kind: str, threads: int, dtype: str = "float32") -> int | None:
    """The padded tokens forwards are formed to on a device of ``kind`` (cpu, cuda, rocm): on
    CPU ``CPU_FORWARD_TOKENS_PER_THREAD`` per thread at float32 (past it a token costs more,
    see forming.py) and ``CPU_FORWARD_TOKENS_PER_THREAD_HALF`` at a served dtype below it; on
    a GPU only the limits."""
    if kind != "cpu":
        return None
    per_thread = (
        CPU_FORWARD_TOKENS_PER_THREAD if dtype == "float32" else CPU_FORWARD_TOKENS_PER_THREAD_HALF
    )
    return per_thread * threads


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
