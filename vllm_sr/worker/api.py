"""The worker's HTTP API, served by ``vllm_sr.httpserver``. Handlers stay small: parse, tokenize,
hand rows to the engine, await the forward thread's answer, write JSON. Every response carries
Server-Timing, and ``X-Vsr-Forward: 1`` or ``0``: whether a forward produced it (a result-cache
hit or a verdict on the input did not), so the pool counts only forwards as successes. The
state the handlers read, and the ``/health`` body, are in ``state``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy

from vllm_sr import jsonbody, wire
from vllm_sr.errors import (
    InvalidRequest,
    NotFound,
    NotReady,
    VllmSrError,
)
from vllm_sr.httpserver import HttpServer, Request, Response, error_response, resolve
from vllm_sr.worker import classify, jsonio, surfaces
from vllm_sr.worker.engine import Engine
from vllm_sr.worker.engine_types import Job
from vllm_sr.worker.metrics import CONTENT_TYPE
from vllm_sr.worker.result_cache import cache_key
from vllm_sr.worker.state import Timing, WorkerState, health_body

log = logging.getLogger("vllm_sr.worker.api")

DEADLINE_HEADER = wire.DEADLINE_HEADER  # the exchange's milliseconds left (frontend sends it)
DEADLINE_HEADER_KEY = wire.DEADLINE_KEY
FORWARD_HEADER = wire.FORWARD_HEADER  # "1": a forward produced this answer; "0": none did


RequestTimeout = jsonbody.RequestTimeout


def _json_response(body: Any, status: int = 200) -> Response:
    return Response(jsonio.dumps(body), status)


Route = Callable[[WorkerState, Request, Timing], Awaitable[Response]]

SURFACE_BY_PATH = {
    "/v1/embeddings": "embeddings",
    "/v1/classify": "classify",
    "/v1/bundle": "bundle",
}


async def dispatch(
    state: WorkerState, routes: dict[str, dict[str, Route]], request: Request
) -> Response:
    """Every request: its route, errors as JSON, Server-Timing, the request counter."""
    timing = Timing()
    try:
        if request.error is not None:  # the body was over the cap or did not come in time
            raise request.error
        resp = await resolve(routes, request)(state, request, timing)
    except VllmSrError as exc:
        resp = error_response(exc)
    except Exception:
        log.exception("internal error on %s %s", request.method, request.path)
        resp = error_response(VllmSrError("internal error"))
    resp.headers["Server-Timing"] = timing.header()
    resp.headers[FORWARD_HEADER] = "1" if timing.forward else "0"
    surface = SURFACE_BY_PATH.get(request.path)
    if surface is not None:
        state.metrics.count_request(surface, resp.status, timing.rows)
    return resp


def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object, or a clear 400: not UTF-8, not JSON, not an object (the
    server has already refused bodies over the cap or too slow to come)."""
    return jsonbody.parse_json(request.body, loads=jsonio.loads)


def deadline_from_header(raw: str | None, now: float) -> float | None:
    """``X-Request-Timeout-Ms`` (positive milliseconds) -> an absolute deadline on the clock
    that gave ``now``; None when the header is absent."""
    ms = wire.deadline_ms(raw)
    return None if ms is None else now + ms / 1000.0


def ready_parts(state: WorkerState) -> tuple[Engine, surfaces.ModelView]:
    if state.status != "ready" or state.engine is None or state.view is None:
        raise NotReady(f"the worker is {state.status}: {state.reason or 'not ready'}")
    return state.engine, state.view


async def run_rows(engine: Engine, rows: list[list[int]], deadline: float | None = None) -> Job:
    """Submit one job and wait for the forward thread to finish it."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Job] = loop.create_future()

    def on_done(job: Job) -> None:  # runs on the loop (see deliver_to_loop)
        if not future.done():
            future.set_result(job)

    engine.submit(rows, on_done, deadline)
    return await future


def deliver_to_loop(loop: asyncio.AbstractEventLoop) -> Any:
    """One thread hop per forward, for all the jobs it finished."""

    def resolve(jobs: list[Job]) -> None:
        for job in jobs:
            if job.on_done is not None:
                job.on_done(job)

    def deliver(jobs: list[Job]) -> None:
        # A closed loop means the process is exiting; nobody waits for these jobs then.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(resolve, jobs)

    return deliver


async def encode(view: surfaces.ModelView, texts: list[str], truncate: bool) -> list[list[int]]:
    if (
        len(texts) <= surfaces.TOKENIZE_INLINE_ROWS
        and sum(map(len, texts)) <= surfaces.TOKENIZE_INLINE_CHARS
    ):
        return surfaces.tokenize(texts, view, truncate)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, surfaces.tokenize, texts, view, truncate)


async def label_centroids(
    state: WorkerState, engine: Engine, view: surfaces.ModelView, key: classify.LabelKey
) -> numpy.ndarray:
    async def compute(k: classify.LabelKey) -> numpy.ndarray:
        examples = [e for _, ex in k for e in ex]
        rows = await encode(view, examples, truncate=True)
        job = await run_rows(engine, rows)
        return classify.centroids_from(job.result()[:, : view.dimensions], k)

    return await state.centroids.get(key, compute)


async def prepare(
    state: WorkerState, surface: str, body: dict[str, Any], timing: Timing
) -> surfaces.Prepared:
    engine, view = ready_parts(state)
    t = time.perf_counter()
    if surface == "embeddings":
        given, truncate, fmt = surfaces.validate_embeddings(body, view)
        t = timing.lap("parse", t)
        if surfaces.is_token_ids(given):
            rows = surfaces.token_rows(given, view, truncate)
        else:
            rows = await encode(view, given, truncate)
        tokens = sum(map(len, rows))
        timing.lap("tokenize", t)
        return surfaces.Prepared(
            surface, rows, tokens, surfaces.embeddings_finisher(view, fmt, tokens)
        )
    texts, truncate, key = surfaces.validate_classify(body, view)
    t = timing.lap("parse", t)
    rows = await encode(view, texts, truncate)
    tokens = sum(map(len, rows))
    t = timing.lap("tokenize", t)
    centroids = None
    if key is not None:
        centroids = await label_centroids(state, engine, view, key)
        timing.lap("labels", t)
    return surfaces.Prepared(
        surface, rows, tokens, surfaces.classify_finisher(view, tokens, centroids, key)
    )


async def handle_surface(state: WorkerState, request: Request, timing: Timing) -> Response:
    surface = SURFACE_BY_PATH[request.path]
    engine, _ = ready_parts(state)
    deadline = deadline_from_header(
        request.headers.get(DEADLINE_HEADER_KEY), engine.clock.monotonic()
    )
    t = time.perf_counter()
    body = read_json(request)
    t = timing.lap("parse", t)
    cache = state.result_cache
    dtype = str((state.capabilities or {}).get("dtype") or "")
    key = cache_key(surface, state.revision or "", dtype, body) if cache.enabled else None
    if key is not None:
        hit = cache.get(key)
        state.metrics.observe_cache(hit is not None, 0, cache.bytes)
        if hit is not None:
            timing.lap("cache", t)
            return Response(hit)
    if surface == "bundle":
        out, cacheable = await answer_bundle(state, body, timing, deadline)
        t = time.perf_counter()
    else:
        task = await prepare(state, surface, body, timing)
        timing.rows = len(task.rows)
        job = await run_rows(engine, task.rows, deadline)
        record_job(timing, job)
        t = time.perf_counter()
        out, cacheable = task.finish(job.result()), True
    data = jsonio.dumps(out)
    if key is not None and cacheable:
        evicted = cache.put(key, data)
        state.metrics.observe_cache(None, evicted, cache.bytes)
    resp = Response(data)
    timing.lap("post", t)
    return resp


def record_job(timing: Timing, job: Job) -> None:
    timing.marks["queue"] = job.queue_s
    timing.forward = job.first_forward_at is not None
    if job.done_at is not None and job.first_forward_at is not None:
        timing.marks["forward"] = job.done_at - job.first_forward_at


async def answer_bundle(
    state: WorkerState,
    body: dict[str, Any],
    timing: Timing,
    deadline: float | None = None,
) -> tuple[dict[str, Any], bool]:
    """The bundle's answer, and whether it may be cached (every task answered 200)."""
    engine, view = ready_parts(state)
    tasks = surfaces.parse_bundle(body, view)
    prepared: list[surfaces.Prepared | VllmSrError] = []
    for _, surface, inner in tasks:
        try:
            prepared.append(await prepare(state, surface, inner, timing))
        except VllmSrError as exc:
            prepared.append(exc)
    rows: list[list[int]] = []
    for p in prepared:
        if isinstance(p, surfaces.Prepared):
            rows.extend(p.rows)
    timing.rows = len(rows)
    outputs = None
    if rows:
        # The whole bundle is one job: its rows enter the queue together.
        job = await run_rows(engine, rows, deadline)
        record_job(timing, job)
        outputs = job.result()
    results = []
    start = 0
    for (task_id, _, _), p in zip(tasks, prepared, strict=True):
        if isinstance(p, VllmSrError):
            results.append({"id": task_id, "status": p.http_status, "body": p.to_json()})
            continue
        assert outputs is not None
        chunk = outputs[start : start + len(p.rows)]
        start += len(p.rows)
        results.append({"id": task_id, "status": 200, "body": p.finish(chunk)})
    every_ok = all(r["status"] == 200 for r in results)
    return {"object": "bundle", "results": results}, every_ok


async def handle_health(state: WorkerState, request: Request, timing: Timing) -> Response:
    return _json_response(health_body(state), 200 if state.status == "ready" else 503)


async def handle_live(state: WorkerState, request: Request, timing: Timing) -> Response:
    return _json_response({"status": "alive", "pid": os.getpid()})


async def handle_models(state: WorkerState, request: Request, timing: Timing) -> Response:
    card = {
        "id": state.artifact,
        "object": "model",
        "owned_by": "vllm-sr",
        "created": int(state.started_at),
        **state.card,
        "device": state.device,
        "threads": state.threads,
        "limits": state.limits.to_json() if state.limits else None,
        "limits_source": state.limit_source,
        "adaptive_threads": state.policy.report(),
        "status": state.status,
    }
    return _json_response({"object": "list", "data": [card]})


async def handle_metrics(state: WorkerState, request: Request, timing: Timing) -> Response:
    return Response(state.metrics.render(), content_type=CONTENT_TYPE)


async def handle_faults(state: WorkerState, request: Request, timing: Timing) -> Response:
    if not state.faults.enabled:
        raise NotFound("fault injection is off (start the worker with VLLM_SR_ENABLE_FAULTS=1)")
    body = read_json(request)
    delay = body.get("forward_delay_ms")
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
        raise InvalidRequest(
            f"forward_delay_ms: expected a number >= 0, got {classify.json_type(delay)}"
        )
    state.faults.forward_delay_s = float(delay) / 1000.0
    log.warning("fault injection: every forward now waits %g ms", delay)
    return _json_response({"ok": True, "forward_delay_ms": delay})


async def handle_result_cache(state: WorkerState, request: Request, timing: Timing) -> Response:
    """``{"max_bytes": N}``: the result cache's new bound, on the running worker (0: off)."""
    body = read_json(request)
    size = body.get("max_bytes")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InvalidRequest(
            f"max_bytes: expected an integer >= 0 (0 turns the cache off), got "
            f"{classify.json_type(size)}"
        )
    cache = state.result_cache
    evicted = cache.resize(size)
    state.metrics.cache_max_bytes.set(size)
    state.metrics.observe_cache(None, evicted, cache.bytes)
    log.info("result cache bound now %d bytes (%d entries evicted)", size, evicted)
    return _json_response({"ok": True, "result_cache_bytes": size, "evicted": evicted})


ROUTES: dict[str, dict[str, Route]] = {
    "/health": {"GET": handle_health},
    "/health/live": {"GET": handle_live},
    "/v1/models": {"GET": handle_models},
    "/metrics": {"GET": handle_metrics},
    **{path: {"POST": handle_surface} for path in SURFACE_BY_PATH},
    "/debug/faults": {"POST": handle_faults},
    "/admin/result-cache": {"POST": handle_result_cache},
}


def build_server(state: WorkerState) -> HttpServer:
    """The worker's server: ``ROUTES`` through ``dispatch``, bodies capped at the state's
    ``max_body`` and read within its ``read_timeout_s``."""

    async def handler(request: Request) -> Response:
        return await dispatch(state, ROUTES, request)

    return HttpServer(handler, max_body=state.max_body, read_timeout_s=state.read_timeout_s)
