"""What several benches share: the repository root, a free TCP port, and the stand-in worker
(tests/integration/test_supervisor_fake.py: the worker HTTP API over a Unix socket, answering at
once, no model) that ``--stand-in`` runs put in place of d3-edge."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAND_IN_MODULE = "tests.integration.test_supervisor_fake"
STAND_IN_ENV = "VLLM_SR_WORKER_ARGV"  # what `vllm-sr serve` runs instead of `vllm-sr worker`


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stand_in_argv() -> list[str]:
    """The stand-in worker's command line, up to (not including) the artifact: the same
    arguments as ``vllm-sr worker`` follow."""
    return [sys.executable, "-m", STAND_IN_MODULE, "worker"]


def stand_in_serve_env() -> dict[str, str]:
    """Environment for `vllm-sr serve` to spawn stand-in workers (that import tests/)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {STAND_IN_ENV: " ".join(stand_in_argv()), "PYTHONPATH": path}
