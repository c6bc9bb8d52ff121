"""Chaos benchmark (`make bench-chaos`): the real `vllm-sr serve` with three d3-edge CPU workers
under steady load (8 callers, distinct texts, each with the deployment's 2 s deadline), then each
fault in turn. For every fault it prints the requests sent during it, failures by HTTP status,
answers later than their deadline + 0.5 s, and the time until the pool was whole again.

Faults: kill -9 of a worker mid-request; SIGSTOP then SIGCONT; a hung forward whose /health
stays 200 (fault knob); a slow replica (forward delay just under the timeout); a flood past
admission (429 only, never a 5xx); `ctl scale` 3 -> 1 -> 3; a reload under load; a spawn that
fails (the service's open-file limit lowered with prlimit, a worker killed, the limit restored);
a hung replica that still answers its result cache and refuses bad input (mixed traffic);
SIGTERM of the service under load (in-flight requests answered, new ones refused).

Each answer is classified: as expected (200; 400 for a deliberately bad request), a timeout
(504 `deadline_exceeded`, from the pool or the worker itself: the exchange ran out of its own
deadline), or lost (anything else). Promises checked (issues 13, 25): kill -9, scale, reload,
SIGTERM, the failed spawn and the hung replica answering its cache lose 0 outside their
timeouts; the hung worker is restarted within 20 s and comes back ready; no answer later than
its deadline + 0.5 s. ``--rows`` runs only some rows (the service starts once either way).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_MS = 2000
LATE_S = TIMEOUT_MS / 1000 + 0.5
REQUEST_NUMBERS = itertools.count(1)


CONFIG = f"""\
global:
  router:
    enabled: false
  model_catalog:
    deployments:
      primary:
        provider: model_runtime
        artifact: vllm-sr/d3-edge
        timeout_ms: {TIMEOUT_MS}   # the deadline checked; the hang bound is then 10 s
    system:
      decision_model:
        deployment: primary
"""


@dataclass
class Record:
    t0: float
    t1: float
    status: int
    code: str = ""  # the error's code when the answer was not a 200
    expect: int = 200  # 400 for a request sent bad on purpose

    @property
    def timeout(self) -> bool:
        """It ran out of its own deadline (the pool's 504 or the worker's own)."""
        return self.status == 504 and self.code == "deadline_exceeded"

    @property
    def lost(self) -> bool:
        return self.status != self.expect and not self.timeout


@dataclass
class Service:
    proc: subprocess.Popen[bytes]
    url: str
    run: Path
    config: Path
    log: Path

    def inventory(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/api/v1/inventory/model-runtime", timeout=5) as r:
            return dict(json.load(r))

    def replicas(self) -> list[dict[str, Any]]:
        return list(self.inventory()["deployments"][0]["replicas"])

    def whole(self, n: int) -> bool:
        try:
            reps = self.replicas()
        except OSError:
            return False
        serving = [r for r in reps if r["state"] == "ready"]
        return len(reps) == n and len(serving) == n

    def ctl(self, *args: str) -> None:
        cmd = [sys.executable, "-m", "vllm_sr.cli", "ctl", *args, "--socket", str(self.run / "c")]
        subprocess.run(cmd, check=True, capture_output=True, timeout=900)

    def worker_socket(self, rid: str) -> str:
        paths = glob.glob(str(self.run / "workers" / f"{rid}*.sock"))
        return max(paths, key=os.path.getmtime)


@dataclass
class Load:
    url: str
    callers: int = 8
    records: list[Record] = field(default_factory=list)
    n: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn) as s:
            await asyncio.gather(*(self._caller(s, stop) for _ in range(self.callers)))

    async def _caller(self, s: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.one(s)

    def body(self) -> tuple[dict[str, Any], int]:
        """The next request and the status it should get."""
        n = next(REQUEST_NUMBERS)  # distinct across every load, so no worker cache answers
        return {"input": f"request {n}: where is my parcel number {n * 7919 % 10007}?"}, 200

    async def one(self, s: aiohttp.ClientSession) -> None:
        self.n += 1
        body, expect = self.body()
        t0 = time.monotonic()
        code = ""
        try:
            async with s.post(self.url + "/v1/embeddings", json=body) as r:
                data = await r.read()
                status = r.status
            if status != 200:
                try:
                    code = str(json.loads(data)["error"]["code"])
                except (ValueError, KeyError, TypeError):
                    code = "?"
        except aiohttp.ClientError:
            status = 0  # connection refused or reset: the service was not there
        self.records.append(Record(t0, time.monotonic(), status, code, expect))


@dataclass
class MixedLoad(Load):
    """What a hung replica can still answer beside the new texts: the same few texts again
    (each worker's result cache has them after its first answer) and bad requests (400 from
    the worker's HTTP loop); no forward produces either."""

    k: int = 0

    def body(self) -> tuple[dict[str, Any], int]:
        self.k += 1
        if self.k % 2:
            return {"input": f"a text every worker has cached {self.k % 6}"}, 200
        return {"input": 7}, 400


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(tmp: Path, replicas: int) -> Service:
    port = free_port()
    run = Path(tempfile.mkdtemp(prefix="vsr-chaos-", dir="/tmp"))
    config = tmp / "config.yaml"
    config.write_text(CONFIG)  # the flags below add the replicas; timeout_ms stays
    env = {**os.environ, "VLLM_SR_ENABLE_FAULTS": "1", "HF_HUB_OFFLINE": "1"}
    argv = [sys.executable, "-m", "vllm_sr.cli", "serve", "vllm-sr/d3-edge", "-e"]
    argv += ["--platform", "cpu", "-dp", str(replicas), "--config", str(config)]
    argv += ["--listen", f"127.0.0.1:{port}", "--runtime-dir", str(run)]
    argv += ["--control-socket", str(run / "c")]
    log = open(tmp / "serve.log", "wb")  # noqa: SIM115 (lives as long as the service)
    proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env, cwd=REPO)
    svc = Service(proc, f"http://127.0.0.1:{port}", run, config, tmp / "serve.log")
    wait(lambda: svc.whole(replicas), 300, "the service ready")
    return svc


def wait(cond: Any, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if cond():
                return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"chaos: timed out after {timeout} s waiting for {what}")


def post_fault(svc: Service, rid: str, delay_ms: int) -> None:
    sock = svc.worker_socket(rid)
    body = json.dumps({"forward_delay_ms": delay_ms})
    subprocess.run(
        ["curl", "-s", "--unix-socket", sock, "-d", body, "http://w/debug/faults"],
        check=True, capture_output=True, timeout=10,
    )  # fmt: skip


def pid_of(svc: Service, rid: str) -> int | None:
    pid = next(r["pid"] for r in svc.replicas() if r["id"] == rid)
    return int(pid) if pid is not None else None


def report(
    name: str, records: list[Record], recover_s: float | None, note: str = ""
) -> dict[str, Any]:
    lost = Counter(r.status for r in records if r.lost)
    timeouts = sum(1 for r in records if r.timeout)
    late = sum(1 for r in records if r.t1 - r.t0 > LATE_S)
    fails = ", ".join(f"{k}:{v}" for k, v in sorted(lost.items())) or "none"
    rec = f"{recover_s:6.1f} s" if recover_s is not None else "     - "
    print(f"{name:<42} {len(records):>7} {fails:<16} {timeouts:>8} {late:>5}  {rec}  {note}",
          flush=True)  # fmt: skip
    return {"fault": name, "requests": len(records), "failures": dict(lost),
            "timeouts": timeouts, "late": late, "recover_s": recover_s}  # fmt: skip


async def phase(svc: Service, load: Load, name: str, act: Any, n: int = 3) -> dict[str, Any]:
    """Run ``act`` (in a thread) under load; returns the phase's report."""
    mark = len(load.records)
    t = time.monotonic()
    recover, note = await asyncio.to_thread(act)
    await asyncio.sleep(1.0)  # the load after recovery counts too
    window = [r for r in load.records[mark:] if r.t1 >= t]  # in flight at the fault too
    return report(name, window, recover, note)


def steady() -> tuple[None, str]:
    time.sleep(3.0)
    return None, "steady load, 3 s"


def kill9(svc: Service) -> tuple[float, str]:
    pid = pid_of(svc, "primary-1")
    assert pid is not None
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    wait(lambda: pid_of(svc, "primary-1") not in (pid, None) and svc.whole(3), 60, "restart")
    return time.monotonic() - t0, f"pid {pid} killed"


def stop_cont(svc: Service) -> tuple[float, str]:
    pid = pid_of(svc, "primary-1")
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    time.sleep(3.0)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGCONT)
    wait(lambda: svc.whole(3), 120, "ready after SIGCONT")
    return time.monotonic() - t0, "stopped 3 s"


def hung(svc: Service) -> tuple[float, str]:
    pid = pid_of(svc, "primary-2")
    t0 = time.monotonic()
    post_fault(svc, "primary-2", 600_000)
    wait(lambda: pid_of(svc, "primary-2") not in (pid, None), 60, "hung worker restarted")
    t_restart = time.monotonic() - t0
    wait(lambda: svc.whole(3), 120, "ready after the restart")
    return time.monotonic() - t0, f"restarted {t_restart:.1f} s after the hang"


def slow(svc: Service) -> tuple[float, str]:
    post_fault(svc, "primary-0", TIMEOUT_MS - 200)
    time.sleep(6.0)
    post_fault(svc, "primary-0", 0)
    t0 = time.monotonic()
    wait(lambda: svc.whole(3), 120, "whole after the slow spell")
    return time.monotonic() - t0, f"forward delay {TIMEOUT_MS - 200} ms for 6 s"


def prlimit(pid: int, soft: int | str) -> None:
    subprocess.run(["prlimit", "--pid", str(pid), f"--nofile={soft}:"], check=True, timeout=10)


def emfile(svc: Service) -> tuple[float, str]:
    """The serve process's soft open-file limit drops to 3 (every new descriptor fails:
    EMFILE), a worker is killed, its respawn fails; the limit comes back after 3 s and the
    replica must come back by itself."""
    soft = int(subprocess.run(
        ["prlimit", "--pid", str(svc.proc.pid), "--nofile", "--raw", "--noheadings",
         "--output", "SOFT"], check=True, capture_output=True, text=True, timeout=10,
    ).stdout.split()[0])  # fmt: skip
    pid = pid_of(svc, "primary-1")
    assert pid is not None
    seen = svc.log.read_text(errors="replace").count("spawn failed")
    t0 = time.monotonic()
    prlimit(svc.proc.pid, 3)
    try:
        os.kill(pid, signal.SIGKILL)
        wait(lambda: svc.log.read_text(errors="replace").count("spawn failed") > seen, 60,
             "a failed spawn")  # fmt: skip
        t_fail = time.monotonic() - t0
        time.sleep(3.0)
    finally:
        prlimit(svc.proc.pid, soft)
    tries = svc.log.read_text(errors="replace").count("spawn failed") - seen
    wait(lambda: pid_of(svc, "primary-1") not in (pid, None) and svc.whole(3), 120, "respawn")
    return time.monotonic() - t0, (
        f"first spawn failed {t_fail:.1f} s after the kill; {tries} failed log lines; "
        f"limit 3 for {t_fail + 3:.1f} s"
    )


async def hung_cache(svc: Service, load: Load) -> dict[str, Any]:
    """primary-2's forward hangs while mixed traffic keeps reaching it: cached texts and bad
    requests it still answers at once, new texts that time out. It must be ejected like a
    replica that answers nothing, then restarted by the hang bound."""
    mixed = MixedLoad(svc.url, callers=4)
    stop = asyncio.Event()
    task = asyncio.ensure_future(mixed.run(stop))
    await asyncio.sleep(2.0)  # every worker has the cached texts now
    mark, mmark = len(load.records), len(mixed.records)
    pid = pid_of(svc, "primary-2")
    t0 = time.monotonic()

    def act() -> tuple[float, str]:
        post_fault(svc, "primary-2", 600_000)
        states = lambda: {r["id"]: r["state"] for r in svc.replicas()}  # noqa: E731
        wait(lambda: states().get("primary-2") == "ejected", 60, "the hung replica ejected")
        t_eject = time.monotonic() - t0
        wait(lambda: pid_of(svc, "primary-2") not in (pid, None), 60, "hung worker restarted")
        t_restart = time.monotonic() - t0
        wait(lambda: svc.whole(3), 120, "ready after the restart")
        note = f"ejected {t_eject:.1f} s, restarted {t_restart:.1f} s after the hang"
        return time.monotonic() - t0, note

    recover, note = await asyncio.to_thread(act)
    await asyncio.sleep(1.0)
    stop.set()
    await task
    window = [r for r in load.records[mark:] if r.t1 >= t0]
    window += [r for r in mixed.records[mmark:] if r.t1 >= t0]
    return report("hung replica that still answers its cache", window, recover, note)


async def flood(svc: Service, load: Load) -> dict[str, Any]:
    extra = Load(svc.url, callers=200)
    stop = asyncio.Event()
    task = asyncio.ensure_future(extra.run(stop))
    await asyncio.sleep(4.0)
    stop.set()
    await task
    rep = report("flood past admission", extra.records, None, "200 extra callers, 4 s")
    bad = [k for k in rep["failures"] if k != 429] + (["504"] if rep["timeouts"] else [])
    rep["non_429"] = bad
    return rep


def scale(svc: Service) -> tuple[float, str]:
    t0 = time.monotonic()
    svc.ctl("scale", "primary", "1")
    svc.ctl("scale", "primary", "3")
    wait(lambda: svc.whole(3), 300, "3 again")
    return time.monotonic() - t0, "3 -> 1 -> 3"


def reload(svc: Service) -> tuple[float, str]:
    t0 = time.monotonic()
    svc.ctl("reload")
    return time.monotonic() - t0, "identities kept"


async def sigterm(svc: Service, load: Load) -> dict[str, Any]:
    mark = len(load.records)
    await asyncio.sleep(1.0)
    t = time.monotonic()
    svc.proc.send_signal(signal.SIGTERM)
    code = await asyncio.to_thread(svc.proc.wait, 120)
    stopped = time.monotonic() - t
    window = [r for r in load.records[mark:] if r.t0 < t <= r.t1]  # in flight at the signal
    after = [r for r in load.records[mark:] if r.t0 > t]
    refused = sum(1 for r in after if r.status in (0, 503))
    note = f"exit {code} after {stopped:.1f} s; {refused}/{len(after)} later ones refused"
    return report("SIGTERM (in flight)", window, None, note)


ROWS = ("baseline", "kill9", "stopcont", "hung", "slow", "flood", "scale", "reload", "emfile",
        "hung-cache", "sigterm")  # fmt: skip
ZERO_LOST = {
    "kill -9 mid-request",
    "ctl scale 3->1->3",
    "reload under load",
    "SIGTERM (in flight)",
    "spawn fails (EMFILE) then recovers",
    "hung replica that still answers its cache",
}


async def run_row(row: str, svc: Service, load: Load) -> dict[str, Any]:
    if row == "baseline":
        return await phase(svc, load, "baseline", steady)
    if row == "kill9":
        return await phase(svc, load, "kill -9 mid-request", lambda: kill9(svc))
    if row == "stopcont":
        return await phase(svc, load, "SIGSTOP then SIGCONT", lambda: stop_cont(svc))
    if row == "hung":
        return await phase(svc, load, "hung forward, /health 200", lambda: hung(svc))
    if row == "slow":
        return await phase(svc, load, "slow replica", lambda: slow(svc))
    if row == "flood":
        return await flood(svc, load)
    if row == "scale":
        return await phase(svc, load, "ctl scale 3->1->3", lambda: scale(svc))
    if row == "reload":
        return await phase(svc, load, "reload under load", lambda: reload(svc))
    if row == "emfile":
        return await phase(svc, load, "spawn fails (EMFILE) then recovers", lambda: emfile(svc))
    if row == "hung-cache":
        return await hung_cache(svc, load)
    return await sigterm(svc, load)


def parse_rows(text: str) -> list[str]:
    rows = [r.strip() for r in text.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS]
    if unknown or not rows:
        raise SystemExit(
            f"chaos: --rows {text!r}: unknown {unknown}; choose from {', '.join(ROWS)}"
        )
    return sorted(rows, key=ROWS.index)  # in the bench's order (sigterm last: it ends the service)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", default=",".join(ROWS), help="comma list; default: every row")
    rows = parse_rows(parser.parse_args().rows)
    tmp = Path(tempfile.mkdtemp(prefix="vsr-chaos-"))
    svc = start(tmp, 3)
    load = Load(svc.url)
    stop = asyncio.Event()
    task = asyncio.ensure_future(load.run(stop))
    print(f"{'fault':<42} {'requests':>7} {'lost':<16} {'timeouts':>8} {'late':>5}  recover  note")
    results = []
    try:
        await asyncio.sleep(3.0)
        for row in rows:
            results.append(await run_row(row, svc, load))
    finally:
        stop.set()
        if svc.proc.poll() is None:
            svc.proc.kill()
        await task
    out = tmp / "chaos.json"
    out.write_text(json.dumps(results, indent=2))
    broken = [r["fault"] for r in results if r["fault"] in ZERO_LOST and r["failures"]]
    broken += [r["fault"] for r in results if r["late"]]
    broken += ["flood (non-429)"] if any(r.get("non_429") for r in results) else []
    print(f"\nraw figures: {out}  (service log: {svc.log})")
    print("promises: " + ("all held" if not broken else "BROKEN: " + ", ".join(broken)))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
