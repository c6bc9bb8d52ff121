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
``--stand-in`` serves the stand-in worker instead of d3-edge (the smoke test's mode: the faults
that need a model's forward mean little there) and ``--steady-s`` sets the steady spells.

The service and the load are in bench/chaos_service.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.chaos_service import (  # noqa: E402
    LATE_S,
    TIMEOUT_MS,
    Load,
    MixedLoad,
    Record,
    Service,
    start,
    wait,
)


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


def steady(seconds: float) -> tuple[None, str]:
    time.sleep(seconds)
    return None, f"steady load, {seconds:g} s"


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


async def run_row(row: str, svc: Service, load: Load, steady_s: float) -> dict[str, Any]:
    if row == "baseline":
        return await phase(svc, load, "baseline", lambda: steady(steady_s))
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
    parser.add_argument("--stand-in", action="store_true", help="the stand-in worker, no model")
    parser.add_argument("--steady-s", type=float, default=3.0, help="warm-up and baseline spell")
    args = parser.parse_args()
    rows = parse_rows(args.rows)
    tmp = Path(tempfile.mkdtemp(prefix="vsr-chaos-"))
    svc = start(tmp, 3, stand_in=args.stand_in)
    load = Load(svc.url)
    stop = asyncio.Event()
    task = asyncio.ensure_future(load.run(stop))
    print(f"{'fault':<42} {'requests':>7} {'lost':<16} {'timeouts':>8} {'late':>5}  recover  note")
    results = []
    try:
        await asyncio.sleep(args.steady_s)
        for row in rows:
            results.append(await run_row(row, svc, load, args.steady_s))
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
