"""Every bench in bench/ runs, at its smallest, and prints its result lines: a bench that no
longer starts (an import that moved, a server it drives that changed) fails here instead of on
the day someone wants its figures. The figures themselves are not checked (they need a quiet
machine and a full run); what is checked is that each result line comes out with numbers in it,
and where a bench can say so cheaply, that what it measured worked (the routed chats got their
decision, the exact cache hits hit).

Benches that can run without a model do so here on a stand-in (the stand-in worker of
tests/integration/test_supervisor_fake.py, the stand-in backend and toy encoder of
tests/support/backends.py) in a few seconds. Those that measure d3-edge itself (its forward,
its worker, the service against its ceiling, the dtype check, the router bench's service and
standalone targets) load it in every process they start, which takes ~7 s per process on a
2-core host: they are marked slow."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NUMBER = r"[-+]?\d+(?:\.\d+)?"


def run_bench(script: str, *args: str, timeout: float = 120.0) -> str:
    """``python bench/SCRIPT ARGS`` from the repository root, in its own process group; -> its
    stdout. Fails with the output's tail when it exits non-zero or runs past ``timeout``; the
    group (the services and loops the bench started) is ended either way."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    argv = [sys.executable, str(REPO / "bench" / script), *args]
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stdout, stderr = "", f"(no answer in {timeout:g} s)"
    finally:
        end_group(proc)
    took = time.monotonic() - started
    tail = (stdout + stderr)[-4000:]
    assert proc.returncode == 0, f"{script}: exit {proc.returncode} after {took:.1f} s:\n{tail}"
    return stdout


def end_group(proc: subprocess.Popen[str]) -> None:
    """SIGTERM to what is left of the bench's process group (a service drains and stops its
    workers), SIGKILL after a grace."""
    for sig, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
    if proc.poll() is None:
        proc.wait(10)


def lines_like(out: str, pattern: str) -> list[re.Match[str]]:
    found = [m for m in (re.search(pattern, line) for line in out.splitlines()) if m]
    assert found, f"no line matches {pattern!r} in:\n{out[-3000:]}"
    return found


# -- on a stand-in: the fast suite ---------------------------------------------------------------


def test_client_bench() -> None:
    out = run_bench("client.py", "--n", "50")
    lines_like(out, rf"vllm_sr\.pool\.client: sequential +50 x: +{NUMBER}/s +client CPU +{NUMBER}")
    lines_like(out, rf"vllm_sr\.pool\.client: concurrent 64 x 50: +{NUMBER}/s")


def test_frontend_bench_on_the_stand_in_worker() -> None:
    out = run_bench("frontend.py", "--replicas", "--duration", "0.3")  # no d3-edge layouts
    lines_like(out, rf"frontend's own added p50 at c=1 .*: {NUMBER} ms \(straight {NUMBER} ms")


def test_router_bench_keyword_profile() -> None:
    out = run_bench(
        "router.py",
        *("--profiles", "keyword-only", "--rounds", "1", "--requests-c1", "5"),
        *("--requests-cn", "10", "--concurrency", "2", "--in-process", "20"),
    )
    lines_like(out, r"^  decisions: coding ")  # the code chat was routed to its decision
    lines_like(out, rf"end to end c=1 +n=5 +direct p50 +{NUMBER}.*routed p50 +{NUMBER}")
    lines_like(out, rf"^  keyword-only +in process wall p50 +{NUMBER}")


def test_router_cache_bench() -> None:
    out = run_bench("router_cache.py", "--n1", "5", "--n64", "10")
    hits = lines_like(out, rf"^exact hit +(1|64) +(\d+) +{NUMBER} +{NUMBER} +(\d+)$")
    assert [(m[1], m[2], m[3]) for m in hits] == [("1", "5", "5"), ("64", "10", "10")]
    lines_like(out, rf"^semantic miss +64 +10 +{NUMBER}")


def test_router_bench_reports_the_cache_through_its_cache_target() -> None:
    out = run_bench("router.py", "--target", "cache", "--", "--n1", "5", "--n64", "10")
    hits = lines_like(out, rf"^semantic hit +(1|64) +(\d+) +{NUMBER} +{NUMBER} +(\d+)$")
    assert [(m[1], m[2], m[3]) for m in hits] == [("1", "5", "5"), ("64", "10", "10")]


def test_router_bench_reports_a_looper_through_its_looper_target() -> None:
    out = run_bench(
        "router.py",
        *("--target", "looper", "--", "--think-ms", "5", "--n1", "4", "--nc", "8"),
        *("--concurrency", "2"),
    )
    lines_like(out, r"^cpu flags: ")  # the host first, as the router bench prints it
    for level, n in ((1, 4), (2, 8)):
        # every looper chat made its two internal calls, small then big
        lines_like(out, rf"^c={level} +n={n} .*iterations \[2\], models used \['small,big'\]")
    adds = lines_like(out, rf"^  looper adds \(handler - sum of its calls\) p50 +({NUMBER}) p99")
    assert len(adds) == 2 and all(float(m[1]) >= 0 for m in adds)
    lines_like(out, rf"looper - iterations x static p50: p50 +{NUMBER} p99 +{NUMBER} ms$")


def test_router_signals_bench_without_the_slow_loading_families() -> None:
    # The language detector takes 15-30 s to load in each process, and presidio (pii) a few
    # (the signal processes load presidio either way: one of them, and the hand-off's one).
    out = run_bench(
        "router_signals.py",
        *("--requests-c1", "5", "--requests-c64", "20", "--leave-out", "language,pii"),
        *("--signal-procs", "1", "--handoff", "--handoff-chats", "2"),
        timeout=240.0,
    )
    lines_like(out, rf"keywords only +16 +{NUMBER} +{NUMBER} +\({NUMBER}\)")
    lines_like(out, rf"c=64 +every family, on the loop +{NUMBER} chats/s \| p50 +{NUMBER} ms")
    lines_like(out, rf"c=64 +every family, spread +{NUMBER} chats/s \| p50 +{NUMBER} ms")
    lines_like(out, rf"signals per chat, in process: {NUMBER} ms")
    lines_like(out, rf"c=64 every family, spread: p95 {NUMBER} ms, p99 {NUMBER} ms \(upstream")
    # one ratio and one CPU figure per round (three by default)
    (by_round,) = lines_like(
        out,
        r"^  c=64 by round \(the paths alternate\): ratio ([\d. ]+), spread router CPU "
        r"ms/chat ([\d. ]+)$",
    )
    assert len(by_round[1].split()) == len(by_round[2].split()) == 3
    (switches,) = lines_like(
        out,
        rf"^  c=64 router loop context switches per chat \(waits / preemptions\): every family, "
        rf"on the loop ({NUMBER}) / ({NUMBER}), every family, spread ({NUMBER}) / ({NUMBER})$",
    )
    # the spread loop waits on its signal process: it sleeps at least once per few chats
    assert float(switches[3]) > 0
    (scale,) = lines_like(
        out,
        rf"^router-scale: loop_cpu_ms=({NUMBER}) ratio=({NUMBER}) spread_chats_s=(\d+) "
        rf"loop_chats_s=(\d+) cpus=(\d+)$",
    )
    assert out.rstrip().splitlines()[-1].startswith("router-scale: ")  # the last line
    assert float(scale[2]) > 0 and int(scale[5]) == os.cpu_count()


def test_router_probes_bench_on_the_toy_encoder() -> None:
    # feedback loads unchanged; accuracy too once vllm-sr runs its workflows and fusion loopers
    # (until then, the bench clears its looper endpoint and says so).
    out = run_bench(
        "router_probes.py", "--stand-in", "--recipe", "feedback", "--recipe", "accuracy"
    )
    lines_like(out, r"^  feedback: loaded unchanged$")
    (accuracy,) = lines_like(out, r"^  accuracy:( loaded unchanged)?$")
    if accuracy[1] is None:
        lines_like(out, r"^    removed +1 x global\.integrations\.looper\.endpoint: .*looper")
    rows = lines_like(out, r"^(feedback|accuracy|all) +(\d+) +(\d+) +(\d+) +(\d+) +(\d+)$")
    table = {m[1]: [int(m[i]) for i in range(2, 7)] for m in rows}
    assert set(table) == {"feedback", "accuracy", "all"}
    for probes, run, passed, missed, skipped in table.values():
        assert run > 0 and probes == run + skipped and run == passed + missed
    assert table["all"] == [
        a + b for a, b in zip(table["feedback"], table["accuracy"], strict=True)
    ]
    if table["all"][3]:  # the toy encoder decides how many pass; a miss says why
        lines_like(out, r"^ +\d+ x expected '.*' (did not match|matched too)")


def test_chaos_bench_baseline_on_the_stand_in_worker() -> None:
    out = run_bench("chaos.py", "--stand-in", "--rows", "baseline", "--steady-s", "0.1")
    lines_like(out, r"^baseline +\d+ +none +0 +0 ")
    lines_like(out, r"^promises: all held")


def test_threads_bench_on_the_stand_in_worker() -> None:
    # Three stand-in workers, one after another (off, mode 1, mode 2): ~4.5 s on a quiet host.
    out = run_bench(
        "threads.py",
        *("--stand-in", "--counts", "1", "--seconds", "0.1", "--settle-s", "0.05"),
        *("--learn-s", "0.05", "--inflight", "2"),
    )
    for label in (r"off, 1 threads \(default\)", "mode 1, fresh", "mode 2, learned"):
        for kind in ("short", "long"):
            lines_like(out, rf"^{label} +{kind} +{NUMBER} +{NUMBER} +{NUMBER} +x{NUMBER}")


def test_config_watch_bench_on_the_stand_in_worker() -> None:
    # A real serve with stand-in workers; two edits (1 -> 2 -> 1) through a ConfigMap swap.
    out = run_bench("config_watch.py", "--edits", "2", "--settle-s", "0.2", "--how", "configmap")
    lines_like(out, rf"^edit +1 scale 1 -> 2: +{NUMBER} ms")
    lines_like(out, rf"^edit +2 scale 2 -> 1: +{NUMBER} ms")
    (p50,) = lines_like(out, rf"^write -> serving +n=2 +p50 +({NUMBER}) ms")
    assert float(p50.group(1)) >= 200  # never sooner than the settle time


# -- d3-edge itself: slow ------------------------------------------------------------------------


@pytest.mark.slow
def test_worker_bench() -> None:
    out = run_bench(
        "worker.py",
        *("--seconds", "0.2", "--concurrency", "1", "--batch-sizes", "1", "4"),
        timeout=300,
    )
    for kind in ("short", "long"):
        lines_like(out, rf"^\| {kind} \| 1 \| {NUMBER} \| {NUMBER} \| {NUMBER} \|")


@pytest.mark.slow
def test_worker_overhead_bench() -> None:
    # Two d3-edge workers (bfloat16, float32), one short round of every cell, and a small
    # in-process profile.
    out = run_bench(
        "worker_overhead.py",
        *("--seconds", "0.3", "--rounds", "1", "--profile", "5", "--top", "5"),
        timeout=300,
    )
    lines_like(out, r"^host: .*; flags: ")
    for dtype in ("bfloat16", "float32"):
        for kind in ("short", "long"):
            for c in (1, 8):
                cell = rf"^this +{dtype} +{kind} +{c} +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER}"
                lines_like(out, cell)
    for kind in ("short", "long"):
        lines_like(out, rf"^in-process {kind}, bfloat16, 5 requests at c=1: .* {NUMBER} us/request")


SMALL_ROUTER_RUN = ("--rounds", "1", "--requests-c1", "5", "--requests-cn", "10")
SMALL_ROUTER_RUN += ("--concurrency", "2", "--in-process", "20")


@pytest.mark.slow
def test_router_bench_on_the_service() -> None:
    """The real `vllm-sr serve` with providers: and routing: (a d3-edge worker)."""
    out = run_bench(
        "router.py", "--target", "service", "--profiles", "keyword-only", *SMALL_ROUTER_RUN
    )
    lines_like(out, r"^  decisions: coding ")
    lines_like(out, rf"^  keyword-only +in process wall p50 +{NUMBER}")


@pytest.mark.slow
def test_router_bench_standalone_with_model_signals() -> None:
    """The router process asking a d3-edge worker over its socket (embeddings and domains)."""
    out = run_bench(
        "router.py", "--target", "standalone", "--profiles", "embedding+domain", *SMALL_ROUTER_RUN
    )
    lines_like(out, r"^  decisions: coding ")  # the keyword decision outranks the others
    lines_like(out, rf"one d3-edge forward p50 +{NUMBER} ms")
    lines_like(out, rf"^  embedding\+domain +in process wall p50 +{NUMBER}")


@pytest.mark.slow
def test_forward_sizes_bench() -> None:
    out = run_bench("forward_sizes.py", "--seconds", "0.1", "--rounds", "1", timeout=300)
    for kind in ("short", "long"):
        lines_like(out, rf"^{kind}: a token is cheapest at \d+ padded tokens")


@pytest.mark.slow
def test_gpu_dtype_bench_on_cpu() -> None:
    out = run_bench("gpu_dtype.py", "--device", "cpu", "--rounds", "1", timeout=300)
    for dtype in ("auto", "float32"):
        lines_like(out, rf"^ *{dtype}: served \w+ .*short {NUMBER} rows/s, long {NUMBER} rows/s")
    lines_like(out, rf"^short: cosine auto vs float32: worst {NUMBER}")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_service_bench_and_its_ceiling() -> None:
    # float32: one service and one pair of ceiling loops (auto on a bf16 host adds a second).
    out = run_bench(
        "service.py",
        *("--seconds", "0.2", "--dtype", "float32", "--concurrency", "1", "2"),
        *("--mixed", "2", "--batch-sizes", "1", "2"),
        timeout=540,
    )
    for kind in ("short", "long", "mixed"):  # a cell: its ceiling and the service, rows/s
        lines_like(out, rf"^{kind} +2 +{NUMBER} +{NUMBER} +{NUMBER}")
    lines_like(out, rf"^short: c2 ratio {NUMBER} .* c1 p50 {NUMBER} ms")
    lines_like(out, r"^targets met in this run: \d+ of \d+")
