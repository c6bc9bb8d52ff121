"""Host records for adaptive threads: mode 2 serves learned counts only on a host whose
bit-identity across counts a record vouches for (docs/adaptive-threads.md).

Mode 1, when every bucket it saw is learned without a drift, writes (or widens) this host's
record: CPU model, torch version, kernel version, the served dtype when it is not float32 (bf16
kernels are other kernels: a float32 record vouches for nothing at bfloat16), the counts checked
and the result. Any drift seen in mode 1 or 2 writes ``drifted``, which no later
``bit-identical`` write undoes, and which retires the learning of every later worker start on
this host (mode 1 too) until the file is removed: one count that drifts on a host retires the
learning there for good. A record
is one JSON file per host identity in ``VLLM_SR_THREADS_RECORD_DIR`` (default
``$XDG_STATE_HOME/vllm-sr``, else ``~/.local/state/vllm-sr``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("vllm_sr.worker.threads")

ENV_RECORD_DIR = "VLLM_SR_THREADS_RECORD_DIR"
IDENTICAL = "bit-identical"
DRIFTED = "drifted"


@dataclass(frozen=True)
class HostFacts:
    """What a record is keyed by: a change of any of them voids it."""

    cpu_model: str
    torch_version: str
    kernel: str
    dtype: str = "float32"  # the served precision; float32 leaves the key as it always was

    def _parts(self) -> tuple[str, ...]:
        base = (self.cpu_model, self.torch_version, self.kernel)
        return base if self.dtype == "float32" else (*base, self.dtype)

    def key(self) -> str:
        text = "\0".join(self._parts())
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        text = f"CPU {self.cpu_model!r}, torch {self.torch_version}, kernel {self.kernel}"
        return text if self.dtype == "float32" else f"{text}, dtype {self.dtype}"


def _cpu_model(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("model name", "Model", "cpu model") and value.strip():
            return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def host_facts(dtype: str = "float32") -> HostFacts:
    """This host's facts at the worker's ``engine_args.dtype`` (``auto`` resolved as the worker
    will; imports torch: called once at worker start, torch is loaded then)."""
    import torch

    from vllm_sr.worker import precision

    served = precision.resolve(dtype, precision.facts_for("cpu")).dtype
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        cpuinfo = ""
    return HostFacts(_cpu_model(cpuinfo), str(torch.__version__), platform.release(), served)


def record_dir(env: Mapping[str, str]) -> Path:
    if env.get(ENV_RECORD_DIR):
        return Path(env[ENV_RECORD_DIR]).expanduser()
    if env.get("XDG_STATE_HOME"):
        return Path(env["XDG_STATE_HOME"]) / "vllm-sr"
    return Path(env.get("HOME") or Path.home()) / ".local" / "state" / "vllm-sr"


class HostRecords:
    """Reads and writes this host's record in one directory."""

    def __init__(self, directory: Path, facts: HostFacts) -> None:
        self.directory, self.facts = directory, facts

    @property
    def path(self) -> Path:
        return self.directory / f"threads-{self.facts.key()}.json"

    def read(self) -> dict[str, Any] | None:
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def vouches_for(self, counts: Iterable[int]) -> str | None:
        """None when a record of this host says bit-identical for every count in ``counts``;
        else why not (naming the record file)."""
        doc = self.read()
        wanted = sorted(set(counts))
        where = f"{self.path} ({self.facts.describe()})"
        if doc is None:
            return f"no record at {where}"
        if doc.get("host") != self._host():
            return f"the record at {where} is of another host: {doc.get('host')}"
        if doc.get("result") != IDENTICAL:
            return f"the record at {where} says {doc.get('result')!r}: {doc.get('detail')}"
        checked = set(doc.get("counts_checked") or [])
        missing = [c for c in wanted if c not in checked]
        if missing:
            return f"the record at {where} never checked counts {missing}"
        return None

    def recorded_drift(self) -> str | None:
        """The record's detail when this host's record says ``drifted``; else None."""
        doc = self.read()
        if doc is None or doc.get("host") != self._host() or doc.get("result") != DRIFTED:
            return None
        return str(doc.get("detail") or "a count drifted")

    def learned(self, counts: Iterable[int], buckets: Iterable[str]) -> None:
        """Mode 1 finished learning without a drift: widen (or start) the record, unless it
        already says ``drifted``."""
        doc = self.read()
        if doc is not None and doc.get("host") == self._host() and doc.get("result") == DRIFTED:
            return
        old = doc if doc is not None and doc.get("result") == IDENTICAL else {}
        self._write(
            IDENTICAL,
            sorted(set(counts) | set(old.get("counts_checked") or [])),
            sorted(set(buckets) | set(old.get("buckets") or [])),
            "every shadow pass reproduced the served answer bit for bit",
        )

    def drifted(self, counts: Iterable[int], detail: str) -> None:
        self._write(DRIFTED, sorted(set(counts)), [], detail)

    def _host(self) -> dict[str, str]:
        f = self.facts
        host = {"cpu_model": f.cpu_model, "torch_version": f.torch_version, "kernel": f.kernel}
        return host if f.dtype == "float32" else {**host, "dtype": f.dtype}

    def _write(self, result: str, counts: list[int], buckets: list[str], detail: str) -> None:
        doc = {
            "host": self._host(),
            "counts_checked": counts,
            "buckets": buckets,
            "result": result,
            "detail": detail,
            "written_at": time.time(),
        }
        tmp: str | None = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".threads-", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1)
            os.replace(tmp, self.path)
        except OSError as exc:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            log.warning("threads record: cannot write %s: %s", self.path, exc)
            return
        log.info("threads record: %s for counts %s written to %s", result, counts, self.path)
