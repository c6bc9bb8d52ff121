"""The worker process: bind HTTP first (so /health says 503 while it loads), load the artifact
on a loader thread, calibrate, pass the golden check, serve; exit on SIGTERM or when the parent
dies. Signal handlers only set an event; one coroutine does the shutdown. The options and the
state built before binding are in ``options``; the loader thread's work in ``startup``."""

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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_sr.errors import EXIT_OK, ConfigError
from vllm_sr.httpserver import HttpServer
from vllm_sr.worker.api import build_server
from vllm_sr.worker.engine_types import Job
from vllm_sr.worker.options import WorkerOptions, build_state, cpu_budget, default_threads
from vllm_sr.worker.startup import load_thread
from vllm_sr.worker.state import WorkerState

log = logging.getLogger("vllm_sr.worker")

DRAIN_GRACE_S = 3.0  # SIGTERM: in-flight forwards get this long to finish
PARENT_POLL_S = 1.0
ENV_PARENT_PID = "VLLM_SR_PARENT_PID"  # set by the supervisor (supervisor/process.py)
PR_SET_PDEATHSIG = 1


def run(opts: WorkerOptions, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    state = build_state(opts, env)
    return asyncio.run(serve(opts, state, expected_parent(env)))


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
        target=load_thread, args=(opts, state, loop, loaded), name="vllm-sr-loader", daemon=True
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


__all__ = ["Job", "WorkerOptions", "cpu_budget", "default_threads", "run"]
