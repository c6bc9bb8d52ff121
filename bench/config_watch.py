"""Config watch bench: the time from a write of config.yaml to the new generation serving,
without a signal (issue 40). A real `vllm-sr serve` with the tests' stand-in workers (the
worker's own start is not what is measured: with d3-edge a scale-up adds its load, ~7 s per
worker on a 2-core host), then ``--edits`` edits that scale the deployment 1 -> 2 -> 1 ...,
each written the way ``--how`` says (``rename``: an editor's save; ``inplace``: truncate and
write; ``configmap``: a ConfigMap volume's ``..data`` swap), each timed from the end of the
write until ``GET /health`` reports the next generation.

    python bench/config_watch.py [--edits 20] [--how rename] [--settle-s 2.0]

Prints one line per edit, then p50/p90/max over all edits and per direction. What it is made
of: the settle time (``config_watch_settle_s``: the file must stay unchanged that long), up to
one poll interval (a quarter of the settle time, at most 0.25 s), then the reload (plan, start
and check the new worker, publish).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, free_port, stand_in_serve_env


def config_text(replicas: int, edit: int) -> str:
    items = "".join("          - device: cpu\n" for _ in range(replicas))
    return (
        f"# bench/config_watch.py edit {edit}\n"
        "global:\n  router:\n    enabled: false\n  model_catalog:\n    deployments:\n"
        "      primary:\n        provider: model_runtime\n        artifact: stand-in/noop\n"
        f"        replicas:\n{items}"
    )


class Writer:
    """Writes config.yaml one way; ``path`` is what serve is given."""

    def __init__(self, how: str, workdir: Path) -> None:
        self.how = how
        self.dir = workdir / ("configmap" if how == "configmap" else "etc")
        self.dir.mkdir()
        self.path = self.dir / "config.yaml"
        self.version = 0

    def write(self, text: str) -> None:
        if self.how == "inplace":
            with open(self.path, "r+" if self.path.exists() else "w") as f:
                f.truncate(0)
                f.write(text)
        elif self.how == "rename":
            tmp = self.dir / ".config.yaml.tmp"
            tmp.write_text(text)
            os.replace(tmp, self.path)
        else:  # the kubelet's atomic writer
            self.version += 1
            new = self.dir / f"..v{self.version}"
            new.mkdir()
            (new / "config.yaml").write_text(text)
            old = self.dir / "..data"
            previous = os.readlink(old) if old.is_symlink() else None
            os.symlink(new.name, self.dir / "..data_tmp")
            os.replace(self.dir / "..data_tmp", old)
            if not self.path.is_symlink():
                os.symlink("..data/config.yaml", self.path)
            if previous is not None:
                shutil.rmtree(self.dir / previous)


def health(port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
        return dict(json.load(r))


def wait_generation(port: int, generation: int, timeout_s: float) -> float:
    """Polls /health every 5 ms; -> the monotonic time the generation was first seen."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            doc = health(port)
            if doc.get("generation") == generation and doc.get("ready"):
                return time.monotonic()
        except OSError:
            pass
        time.sleep(0.005)
    raise SystemExit(f"bench: generation {generation} not served within {timeout_s:.0f} s")


def start(writer: Writer, settle_s: float, workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    run = workdir / "run"  # under /tmp: a short path for the Unix sockets
    toml = workdir / "vllm-sr.toml"
    toml.write_text(f"config_watch_settle_s = {settle_s}\n")
    argv = [sys.executable, "-m", "vllm_sr.cli", "serve", "--config", str(writer.path)]
    argv += ["--service-config", str(toml), "--listen", f"127.0.0.1:{port}"]
    argv += ["--runtime-dir", str(run), "--control-socket", str(run / "control.sock")]
    env = {**os.environ, **stand_in_serve_env()}
    log = open(workdir / "serve.log", "wb")  # noqa: SIM115 (kept for the process)
    proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env, cwd=REPO)
    try:
        wait_generation(port, 0, 120)
    except SystemExit:
        proc.kill()
        raise SystemExit(f"bench: serve did not get ready; see {workdir / 'serve.log'}") from None
    return proc, port


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def summary(label: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p90 = ms[min(len(ms) - 1, round(0.9 * (len(ms) - 1)))]
    return (
        f"{label:<18} n={len(ms):<3} p50 {statistics.median(ms):8.1f} ms  "
        f"p90 {p90:8.1f} ms  max {ms[-1]:8.1f} ms"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--edits", type=int, default=20)
    p.add_argument("--how", choices=("rename", "inplace", "configmap"), default="rename")
    p.add_argument("--settle-s", type=float, default=2.0, help="config_watch_settle_s")
    args = p.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="vsr-bench-watch-", dir="/tmp"))
    writer = Writer(args.how, workdir)
    writer.write(config_text(1, 0))
    proc, port = start(writer, args.settle_s, workdir)
    took: dict[str, list[float]] = {"scale 1 -> 2": [], "scale 2 -> 1": []}
    print(f"config watch: {args.edits} edits, written by {args.how}, settle {args.settle_s} s")
    try:
        for edit in range(1, args.edits + 1):
            replicas = 2 if edit % 2 else 1
            writer.write(config_text(replicas, edit))
            written = time.monotonic()
            seconds = wait_generation(port, edit, args.settle_s + 60) - written
            label = "scale 1 -> 2" if replicas == 2 else "scale 2 -> 1"
            took[label].append(seconds)
            print(f"edit {edit:>3} {label}: {seconds * 1000:8.1f} ms")
    finally:
        stop(proc)
    every = [s for values in took.values() for s in values]
    print(summary("write -> serving", every))
    for label, values in took.items():
        if values:
            print(summary(label, values))
    shutil.rmtree(workdir, ignore_errors=True)  # kept, with serve.log, when it failed


if __name__ == "__main__":
    main()
