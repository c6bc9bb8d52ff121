"""WorkerProcess: the supervisor's handle on one worker child.

The child is started with exec (``asyncio.create_subprocess_exec``), never a bare fork of this
process: a forked asyncio service would carry its loop, sockets and threads into the child. CPU
pinning uses ``taskset -c`` in front of the command, so the worker's threads are born on their
CPU set; without taskset it falls back to psutil right after the spawn.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import shutil
import signal
import sys
from collections.abc import Mapping, Sequence

import psutil

from vllm_sr.plan import ReplicaSpec

log = logging.getLogger("vllm_sr.supervisor")

# The worker reads this to exit when its supervisor is gone (no orphans).
PARENT_PID_ENV = "VLLM_SR_PARENT_PID"


def worker_command(
    spec: ReplicaSpec,
    socket_path: str,
    base: Sequence[str] | None = None,
    result_cache_bytes: int = 0,
) -> list[str]:
    """The argv that runs ``vllm-sr worker`` for ``spec``."""
    argv = list(base) if base else [sys.executable, "-m", "vllm_sr.cli", "worker"]
    argv += [str(spec.artifact), "--uds", socket_path]
    # A GPU worker sees exactly its own GPU (the plan's *_VISIBLE_DEVICES), so it is index 0
    # inside: ``torch_device`` says so.
    if spec.torch_device:
        argv += ["--device", spec.torch_device]
    if spec.threads:
        argv += ["--threads", str(spec.threads)]
    for flag, value in (
        ("--max-num-seqs", spec.max_num_seqs),
        ("--max-num-batched-tokens", spec.max_num_batched_tokens),
        ("--dtype", spec.dtype),
        ("--max-input-tokens", spec.max_input_tokens),
    ):
        if value is not None and value != "auto":  # auto is the worker's own default
            argv += [flag, str(value)]
    if spec.overflow != "reject":  # reject is the worker's own default
        argv += ["--overflow", spec.overflow]
    if spec.revision:
        argv += ["--revision", str(spec.revision)]
    if result_cache_bytes > 0:  # several replicas: each keeps its own result cache (the page)
        argv += ["--result-cache-bytes", str(result_cache_bytes)]
    argv += ["--replica-id", str(spec.id)]
    # Requests name the deployment in "model"; the worker must accept that name as its own.
    if spec.deployment:
        argv += ["--served-model-name", str(spec.deployment)]
    if spec.public_name:
        argv += ["--served-model-name", spec.public_name]
    return argv


class WorkerProcess:
    """One child process. ``start`` spawns it, ``wait`` returns its exit code, ``stop``
    escalates SIGTERM -> grace -> SIGKILL."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cpus: Sequence[int] | None = None,
        socket_path: str = "",
        name: str = "",
        pass_fds: Sequence[int] = (),
    ) -> None:
        self.argv = list(argv)
        self.pass_fds = tuple(pass_fds)  # inherited descriptors (a signal process's socket)
        self.env = dict(env or {})
        self.cpus = list(cpus) if cpus else None
        self.socket_path = socket_path
        self.name = name
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self, stderr_sink: collections.deque[str] | None = None) -> int:
        """Spawn the child. With ``stderr_sink`` its stderr is copied line by line to ours and
        the last lines kept there (the reason a worker gives before it exits)."""
        env = dict(os.environ)
        env.update(self.env)
        env[PARENT_PID_ENV] = str(os.getpid())
        argv = self.argv
        taskset = shutil.which("taskset") if self.cpus else None
        if self.cpus and taskset:
            argv = [taskset, "-c", ",".join(str(c) for c in self.cpus), *argv]
        if self.socket_path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)  # a stale socket from a dead predecessor
        self._proc = await asyncio.create_subprocess_exec(
            *argv,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            # Its own session: a terminal's Ctrl-C reaches the supervisor alone, which drains
            # first and then stops the workers itself (they still die with it: PDEATHSIG).
            start_new_session=True,
            stderr=asyncio.subprocess.PIPE if stderr_sink is not None else None,
            pass_fds=self.pass_fds,
        )
        if stderr_sink is not None and self._proc.stderr is not None:
            self._reader = asyncio.create_task(_pump(self._proc.stderr, stderr_sink))
        if self.cpus and not taskset:
            with contextlib.suppress(psutil.Error, OSError):
                psutil.Process(self._proc.pid).cpu_affinity(self.cpus)
        log.debug("spawned %s pid %s: %s", self.name, self._proc.pid, " ".join(argv))
        return self._proc.pid

    async def wait(self) -> int:
        assert self._proc is not None, "wait() before start()"
        code = await self._proc.wait()
        if self._reader is not None:
            # The pipe ends with the child; let the last lines land in the sink.
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._reader), 1.0)
        return code

    def send(self, sig: int) -> None:
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(sig)

    async def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM, wait up to ``grace_s``, then SIGKILL. Returns the exit code."""
        if self._proc is None:
            return None
        if self._proc.returncode is None:
            self.send(signal.SIGTERM)
            try:
                await asyncio.wait_for(self._proc.wait(), grace_s)
            except TimeoutError:
                log.warning(
                    "%s pid %s ignored SIGTERM for %.1f s; SIGKILL", self.name, self.pid, grace_s
                )
                self.send(signal.SIGKILL)
                await self._proc.wait()
        if self.socket_path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
        return self._proc.returncode

    def kill_now(self) -> None:
        """Last resort on the way out (e.g. the supervisor is crashing): SIGKILL, no wait."""
        self.send(signal.SIGKILL)


async def _pump(stream: asyncio.StreamReader, sink: collections.deque[str]) -> None:
    """Copy a child's stderr to ours, keeping the last lines (bounded: a line is cut at 64 KiB)."""
    out = sys.stderr.buffer
    while True:
        try:
            line = await stream.readline()
        except ValueError:  # a line over the stream limit: take what is there
            line = await stream.read(65536)
        if not line:
            return
        with contextlib.suppress(OSError, ValueError):
            out.write(line)
            out.flush()
        sink.append(line.decode("utf-8", "replace").rstrip())
