"""What bench/router.py measures: ``Router.route`` per chat in this process (and the time per
signal family), and chats end to end, straight to the backend and through the router,
interleaved."""

from __future__ import annotations

import asyncio
import math
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from bench.router_procs import Exchange, no_worker, providers, uds_exchange
from bench.router_profiles import Chat, Profile

AIM_MS = 1.0


def with_model(chats: list[Chat], model: str) -> list[Chat]:
    return [({**body, "model": model}, headers) for body, headers in chats]


async def in_process(
    profile: Profile, backend_port: int, uds: Path | None, n: int
) -> dict[str, Any]:
    """``Router.route(RequestView.from_chat(body, headers))`` per chat, ``n`` chats, and the
    time per family (upstream's eval metrics for the deterministic ones)."""
    from vllm_sr.config.routing import Routing
    from vllm_sr.config.routing_providers import Providers
    from vllm_sr.router.backends import BackendSet
    from vllm_sr.router.request_view import RequestView
    from vllm_sr.router.route import Router

    prov = Providers.model_validate(providers(backend_port))
    session = None
    exchange: Exchange = no_worker
    if profile.needs_worker and uds is not None:
        session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(uds)))
        exchange = uds_exchange(session)
    try:
        router = Router(
            prov,
            Routing.model_validate(profile.routing),
            exchange=exchange,
            backends=BackendSet(prov),  # not started: backends are "unknown", so usable
            decision_deployment="primary",
        )
        await router.warm()
        t0 = time.perf_counter()
        router.deterministic.warm()
        warm_s = time.perf_counter() - t0 if router.deterministic.language else None
        chats = with_model(profile.chats, "auto")
        labels: list[str] = []
        for i in range(max(len(chats), min(n, 200))):  # caches, lingua's first texts
            body, headers = chats[i % len(chats)]
            result = await router.route(RequestView.from_chat(body, headers))
            if i < len(chats):
                labels.append(f"{i}:{result.decision or '-'}")
        samples: list[float] = []
        cpu: list[float] = []
        by_chat: dict[str, list[float]] = {label: [] for label in labels}
        for i in range(n):
            body, headers = chats[i % len(chats)]
            t, c = time.perf_counter(), time.process_time()
            await router.route(RequestView.from_chat(body, headers))
            samples.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
            by_chat[labels[i % len(chats)]].append(samples[-1])
        families: dict[str, list[float]] = {"view": [], "keywords": []}
        for i in range(max(len(chats), n // 4)):
            body, headers = chats[i % len(chats)]
            t = time.perf_counter()
            view = RequestView.from_chat(body, headers)
            t1 = time.perf_counter()
            router.plan.keyword_results(view.text)
            families["view"].append(t1 - t)
            families["keywords"].append(time.perf_counter() - t1)
            report = router.deterministic.report(view, router.plan.referenced)
            for family, metric in report.metrics.items():
                families.setdefault(family, []).append(metric.execution_time_ms / 1000.0)
        extra: dict[str, tuple[float, float, str]] = {}
        for name, (body, headers) in profile.extra.items():
            body = {**body, "model": "auto"}
            times = []
            for _ in range(21):
                t = time.perf_counter()
                await router.route(RequestView.from_chat(body, headers))
                times.append(time.perf_counter() - t)
            t = time.perf_counter()
            view = RequestView.from_chat(body, headers)
            parts = {"view": time.perf_counter() - t}
            t = time.perf_counter()
            router.plan.keyword_results(view.text)
            parts["keywords"] = time.perf_counter() - t
            report = router.deterministic.report(view, router.plan.referenced)
            parts |= {f: m.execution_time_ms / 1000.0 for f, m in report.metrics.items()}
            split = ", ".join(f"{k} {v * 1000.0:.1f}" for k, v in parts.items())
            extra[name] = (pct(times, 0.5), pct(times, 0.99), split)
        return {
            "samples": samples,
            "cpu": cpu,
            "by_chat": by_chat,
            "families": families,
            "warm_s": warm_s,
            "extra": extra,
        }
    finally:
        if session is not None:
            await session.close()


def print_in_process(res: dict[str, Any]) -> None:
    s, c = res["samples"], res["cpu"]
    p50, p99 = pct(s, 0.5), pct(s, 0.99)
    mean = statistics.fmean(s) * 1000.0
    print(
        f"  in process, n={len(s)}: route wall p50 {p50:7.3f} ms p99 {p99:7.3f} ms mean "
        f"{mean:7.3f} ms | CPU p50 {pct(c, 0.5):7.3f} ms p99 {pct(c, 0.99):7.3f} ms | "
        f"wall p50 / aim {p50 / AIM_MS:5.2f}",
        flush=True,
    )
    parts = [f"{k} {pct(v, 0.5) * 1000.0:6.1f}" for k, v in res["families"].items() if v]
    print(f"    per family p50 (us): {', '.join(parts)}", flush=True)
    parts = [f"{k} {pct(v, 0.5):.3f}" for k, v in res["by_chat"].items() if v]
    print(f"    per chat (index:decision) wall p50 (ms): {', '.join(parts)}", flush=True)
    for name, (x50, x99, split) in res["extra"].items():
        print(f"    {name}: p50 {x50:7.3f} ms p99 {x99:7.3f} ms (one run, ms: {split})", flush=True)


async def run_load(
    send: Callable[[int], Awaitable[None]], concurrency: int, total: int
) -> list[float]:
    latencies: list[float] = []
    counter = iter(range(total))

    async def lane() -> None:
        for i in counter:
            t0 = time.perf_counter()
            await send(i)
            latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return latencies


def pct(values: list[float], q: float) -> float:
    """The q-quantile of seconds, in milliseconds (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] * 1000.0


def proc_cpu(pid: int | None) -> float | None:
    """A process's user + system CPU seconds so far (Linux /proc; clock ticks)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_switches(pid: int | None) -> tuple[int, int] | None:
    """A process's main thread's context switches so far: (voluntary, involuntary) -- it waited
    for I/O, it was preempted (Linux /proc)."""
    if pid is None:
        return None
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    counts = dict(line.split(":\t") for line in status.splitlines() if "ctxt_switches" in line)
    return int(counts["voluntary_ctxt_switches"]), int(counts["nonvoluntary_ctxt_switches"])


def chat_sender(session: aiohttp.ClientSession, url: str, chats: list[Chat]) -> Any:
    async def send(i: int) -> None:
        body, headers = chats[i % len(chats)]
        async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
            await r.read()
            if r.status != 200:
                raise SystemExit(f"bench: {url} answered {r.status}: {await r.text()}")

    return send


def embed_sender(worker: aiohttp.ClientSession) -> Any:
    """One d3-edge embeddings request (one text) straight to the worker: one forward."""

    async def send(i: int) -> None:
        body = {"input": [f"text number {i}: please debug this function"]}
        async with worker.post("http://worker/v1/embeddings", json=body) as r:
            await r.read()

    return send


async def decisions_seen(session: aiohttp.ClientSession, router: str, chats: list[Chat]) -> str:
    """Each chat once through the router: the decision it got (routing works, not only runs)."""
    seen = []
    for body, headers in chats:
        async with session.post(f"{router}/v1/chat/completions", json=body, headers=headers) as r:
            await r.read()
            seen.append(r.headers.get("x-vsr-selected-decision", "-"))
    return " ".join(seen)


async def measure(
    profile: Profile,
    backend: str,
    router: str,
    rounds: int,
    counts: dict[int, int],
    uds: Path | None,
    router_pid: int | None,
) -> tuple[dict[int, tuple[float, float]], float | None]:
    """-> per concurrency, the added (p50, p99) in ms; one bare d3-edge forward's p50 at c=1
    (embedding+domain), else None. With ``router_pid``, also the router
    process's CPU per routed chat (parse, route, proxy: what the router spends, load aside)."""
    added: dict[int, tuple[float, float]] = {}
    forward_p50: float | None = None
    connector = aiohttp.TCPConnector(limit=0)
    worker = None
    if profile.needs_worker and uds is not None:
        worker = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(uds)))
    try:
        async with aiohttp.ClientSession(connector=connector) as session:
            direct = chat_sender(session, backend, with_model(profile.chats, "general"))
            routed_chats = with_model(profile.chats, "auto")
            routed = chat_sender(session, router, routed_chats)
            forward = embed_sender(worker) if worker is not None else None
            print(f"  decisions: {await decisions_seen(session, router, routed_chats)}")
            await run_load(routed, 4, 80)  # warm every path
            await run_load(direct, 4, 80)
            if forward is not None:
                await run_load(forward, 1, 20)
            for conc, total in counts.items():
                d_all: list[float] = []
                r_all: list[float] = []
                f_all: list[float] = []
                router_cpu = 0.0
                for _ in range(rounds):  # interleaved: all see the same background load
                    d_all += await run_load(direct, conc, total)
                    before = proc_cpu(router_pid)
                    r_all += await run_load(routed, conc, total)
                    after = proc_cpu(router_pid)
                    if before is not None and after is not None:
                        router_cpu += after - before
                    if conc == 1 and forward is not None:
                        f_all += await run_load(forward, 1, total)
                d50, d99 = pct(d_all, 0.5), pct(d_all, 0.99)
                r50, r99 = pct(r_all, 0.5), pct(r_all, 0.99)
                added[conc] = (r50 - d50, r99 - d99)
                extra = ""
                if f_all:
                    forward_p50 = pct(f_all, 0.5)
                    extra = f" | one d3-edge forward p50 {forward_p50:6.2f} ms"
                if router_pid is not None:
                    extra += f" | router CPU per chat {router_cpu / len(r_all) * 1000.0:5.2f} ms"
                print(
                    f"  end to end c={conc:<3} n={len(r_all):<5} direct p50 {d50:7.2f} p99 "
                    f"{d99:7.2f} | routed p50 {r50:7.2f} p99 {r99:7.2f} | added p50 "
                    f"{r50 - d50:+7.2f} ms p99 {r99 - d99:+7.2f} ms | routed/direct p50 "
                    f"{r50 / d50:4.2f} p99 {r99 / d99:4.2f}{extra}",
                    flush=True,
                )
    finally:
        if worker is not None:
            await worker.close()
    return added, forward_p50
