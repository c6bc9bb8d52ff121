"""What `vllm-sr status` and `vllm-sr ctl` print: pure functions from API documents to text or
rich renderables (no sockets here), plus the `--for` duration parser."""

from __future__ import annotations

import contextlib
import datetime
import io
import re
import time
from typing import Any, Literal

from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from vllm_sr.errors import UsageError

_STATE_STYLE = {
    "ready": "green",
    "degraded": "yellow",
    "starting": "cyan",
    "draining": "yellow",
    "backoff": "yellow",
    "ejected": "magenta",
    "hung": "red",
    "incompatible": "red",
    "failed": "red",
    "unavailable": "red",
    "stopped": "dim",
}
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
MAX_EJECTION_MS = 3_600_000


def parse_duration_ms(text: str, flag: str = "--for") -> int:
    """``30s``, ``500ms``, ``2m``, ``1h`` or bare seconds -> milliseconds (1 ms .. 1 h)."""
    match = _DURATION.match(text)
    if match is None:
        raise UsageError(
            f"{flag}: {text!r} is not a duration; use a number with ms, s, m or h (e.g. 30s)"
        )
    ms = round(float(match.group(1)) * _UNITS_MS[match.group(2) or "s"])
    if not 1 <= ms <= MAX_EJECTION_MS:
        raise UsageError(f"{flag}: {text!r} is out of range; accepted: 1ms to 1h")
    return ms


def format_seconds(seconds: float | None, *, whole: bool = False) -> str:
    """The project's one short human duration (the CLI and vllm-sr-top): 950ms, 12.5s (or with
    ``whole``, stable width for a live screen: 9s), then 3m20s, 2h05m, 3d04h; None is "-"."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if whole:
        seconds = float(int(seconds))
        if seconds < 60:
            return f"{int(seconds)}s"
    elif seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    elif seconds < 60:
        return f"{seconds:.1f}s"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def styled_state(state: str) -> Text:
    return Text(state, style=_STATE_STYLE.get(state, ""))


def ejection_left(replica: dict[str, Any], now: float) -> str:
    until = replica.get("ejected_until")
    if until is None or replica.get("state") != "ejected":
        return "-"
    return format_seconds(max(0.0, float(until) - now))


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)


SHORT_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def short_dtype(dtype: Any) -> str:
    """A replica's served precision in a table cell: bf16, fp16, fp32; "-" before it reports."""
    return "-" if dtype is None else SHORT_DTYPES.get(str(dtype), str(dtype))


def service_line(inventory: dict[str, Any]) -> str:
    service = inventory.get("service") or {}
    line = f"vllm-sr {service.get('version', '?')} on {service.get('host', '?')}"
    line += f", pid {service.get('pid', '-')}"
    if service.get("uptime_s") is not None:
        line += f", up {format_seconds(float(service['uptime_s']))}"
    return line + f", generation {service.get('generation', '-')}"


def config_lines(inventory: dict[str, Any]) -> list[str]:
    """When config.yaml on disk is not the config being served: that, and why (the refused
    reload's problems, each with its line). Nothing while they agree."""
    view = (inventory.get("service") or {}).get("config")
    if not isinstance(view, dict) or view.get("in_sync") or view.get("served_hash") is None:
        return []
    path, file_hash = view.get("path", "config.yaml"), view.get("file_hash")
    on_disk = f"sha256 {file_hash[:12]}" if file_hash else "missing"
    lines = [
        f"config: {path} on disk ({on_disk}) is not the one being served "
        f"(sha256 {str(view['served_hash'])[:12]})"
    ]
    failure = view.get("last_failure")
    if isinstance(failure, dict):
        lines.append(
            f"  its {failure.get('source', '?')} reload was refused; the served one runs on:"
        )
        lines += [f"  {p}" for p in failure.get("problems") or [failure.get("reason")]]
    elif not file_hash:
        lines.append("  the running generation keeps serving until the file is back")
    elif view.get("watch"):
        lines.append("  not applied yet: the watch applies it once the file settles")
    else:
        lines.append("  the watch is off: `vllm-sr ctl reload` applies it")
    return lines


def deployment_table(dep: dict[str, Any], now: float) -> Table:
    """One deployment: a title with its state and counts, one row per replica."""
    title = Text.assemble(
        (str(dep.get("name", "?")), "bold"),
        f" ({dep.get('artifact', '?')}) ",
        styled_state(str(dep.get("state", "?"))),
        f"  {dep.get('ready_replicas', 0)}/{dep.get('desired_replicas', 0)} ready"
        f", {dep.get('ejected_replicas', 0)} ejected",
    )
    # No box: fits 80 columns with room for the widest states (incompatible).
    table = Table(
        title=title, title_justify="left", box=None, pad_edge=False, header_style="bold underline"
    )
    for col, justify in _COLUMNS:
        table.add_column(col, justify=justify, no_wrap=True)
    for r in dep.get("replicas", []):
        table.add_row(
            str(r.get("id", "?")),
            styled_state(str(r.get("state", "?"))),
            _dash(r.get("device")),
            short_dtype(r.get("dtype")),
            _dash(r.get("pid")),
            f"{r.get('inflight', 0)}/{_dash(r.get('max_inflight'))}",
            _dash(r.get("restarts")),
            _dash(r.get("ejections")),
            ejection_left(r, now),
        )
    return table


_COLUMNS: tuple[tuple[str, Literal["left", "right"]], ...] = (
    ("replica", "left"),
    ("state", "left"),
    ("device", "left"),
    ("dtype", "left"),
    ("pid", "right"),
    ("in-flight", "right"),
    ("restarts", "right"),
    ("ejections", "right"),
    ("ejected for", "right"),
)


def status_view(inventory: dict[str, Any], now: float | None = None) -> Group:
    """What `vllm-sr status` prints: the service line, then a table per deployment."""
    now = time.time() if now is None else now
    parts: list[Any] = [Text(service_line(inventory))]
    parts.extend(Text(line, style="red") for line in config_lines(inventory))
    deployments = inventory.get("deployments", [])
    for dep in deployments:
        parts.extend([Text(""), deployment_table(dep, now)])
        parts.extend(
            Text(f"{r['id']}: {r['last_error']}", style="red")
            for r in dep.get("replicas", [])
            if r.get("last_error")
        )
    if not deployments:
        parts.append(Text("no deployments"))
    router = inventory.get("router")
    if isinstance(router, dict):
        parts.extend([Text(""), backends_table(router), decisions_line(router)])
        if router.get("cache") is not None:
            parts.append(cache_line(router["cache"]))
    if inventory.get("signal_processes"):
        parts.append(signal_processes_line(inventory["signal_processes"]))
    return Group(*parts)


def whole_text(view: RenderableType) -> str:
    """``view`` as plain text with every value whole: laid out at its own natural width (not
    the terminal's, nor rich's 80 columns for a pipe), no colour, no trailing blanks. What
    `vllm-sr status` prints when stdout is not a terminal (grep, a file, a pager), as
    `kubectl get` and `systemctl` do; ``--json`` stays the format for scripts."""
    probe = Console(width=1_000_000, file=io.StringIO(), color_system=None)
    width = Measurement.get(probe, probe.options, view).maximum
    out = io.StringIO()
    Console(width=max(1, width), file=out, color_system=None, force_terminal=False).print(view)
    return "".join(line.rstrip() + "\n" for line in out.getvalue().splitlines())


def backend_state(backend: dict[str, Any]) -> str:
    """A backend's state as the tables show it: ejected (after consecutive 5xx, for
    ``ejected_for_s`` more seconds) before healthy or not."""
    if float(backend.get("ejected_for_s") or 0) > 0:
        return "ejected"
    return "ready" if backend.get("state") == "healthy" else "failed"


def backends_table(router: dict[str, Any]) -> Table:
    """Router mode's LLM backends: state, requests/s, p50/p99, errors, and the model's
    fallbacks (chats that failed on it before their first byte and went to another model,
    by reason); per model what the selectors read: chats in flight, observed TTFT / TPOT p50
    and the prompt price per 1M tokens."""
    table = Table(title=Text("backends", style="bold"), title_justify="left", box=None)
    columns = ("model", "url", "state", "req/s", "p50 ms", "p99 ms", "errors", "fell back")
    for name in (*columns, "in flight", "ttft/tpot p50 ms", "$/1M in", "last error"):
        table.add_column(name)
    fell: dict[str, list[str]] = {}
    for f in (router.get("stats") or {}).get("backend_fallbacks") or []:
        fell.setdefault(str(f.get("model")), []).append(f"{f.get('reason')} {f.get('count')}")
    selection = router.get("selection") or {}
    for b in router.get("backends", []):
        seen = selection.get(str(b.get("model"))) or {}
        price = (b.get("pricing") or {}).get("prompt_per_1m")
        table.add_row(
            str(b.get("model")),
            str(b.get("url")),
            styled_state(backend_state(b)),
            f"{float(b.get('requests_per_s') or 0):.1f}",
            _ms(b.get("latency_p50_ms")),
            _ms(b.get("latency_p99_ms")),
            str(b.get("errors") or 0),
            ", ".join(fell.get(str(b.get("model")), [])) or "-",
            str(seen.get("inflight", "-")),
            _ms((seen.get("ttft") or {}).get("p50_ms"))
            + "/"
            + _ms((seen.get("tpot") or {}).get("p50_ms")),
            "-" if price is None else f"{float(price):g}",
            str(b.get("last_error") or "-"),
        )
    return table


def cache_line(cache: dict[str, Any]) -> Text:
    """``cache (memory): 12 entries, 40.1 KiB; hits exact 3, semantic 2; misses 4``."""
    hits: dict[str, int] = {}
    for h in cache.get("hits") or []:
        hits[str(h.get("tier"))] = hits.get(str(h.get("tier")), 0) + int(h.get("count") or 0)
    misses = sum(int(m.get("count") or 0) for m in cache.get("misses") or [])
    size = ""
    if cache.get("entries") is not None:
        size = f": {cache['entries']} entries, {float(cache.get('bytes') or 0) / 1024:.1f} KiB"
    text = f"cache ({cache.get('store')}){size}; hits "
    text += ", ".join(f"{t} {n}" for t, n in sorted(hits.items())) or "0"
    text += f"; misses {misses}"
    errors = sum((cache.get("errors") or {}).values())
    if errors:
        text += f"; store errors {errors}"
    return Text(text)


def signal_processes_line(processes: list[dict[str, Any]]) -> Text:
    """Router mode's signal processes, one line (`vllm-sr status`, vllm-sr-top): ``signal
    processes  signals-0 ready pid 812 jobs 5120  signals-1 backoff jobs 9 rst 1 (killed by
    signal 9) failed 3``."""
    line = Text()
    line.append("signal processes", style="bold")
    for proc in processes:
        line.append(f"  {proc.get('id', '?')} ")
        line.append_text(styled_state(str(proc.get("state", "?"))))
        if proc.get("pid") is not None:
            line.append(f" pid {proc['pid']}")
        line.append(f" jobs {proc.get('jobs', 0)}")
        if proc.get("inflight"):
            line.append(f" in-flight {proc['inflight']}")
        if proc.get("restarts"):
            line.append(f" rst {proc['restarts']} ({proc.get('restart_reason') or '?'})", "yellow")
        if proc.get("failed_jobs"):
            line.append(f" failed {proc['failed_jobs']}", "red")
    return line


def decisions_line(router: dict[str, Any]) -> Text:
    """``decisions: coding->coder 12, billing->general 3; fallbacks: ...; unknown signals:
    embedding/overloaded 5`` (signals that could not be evaluated, by family and reason)."""
    stats = router.get("stats") or {}
    decided = ", ".join(
        f"{d['decision']}->{d['model']} {d['count']}" for d in stats.get("decisions", [])
    )
    text = f"decisions: {decided or 'none yet'}"
    fallbacks = stats.get("fallbacks") or {}
    if fallbacks:
        text += "; fallbacks: " + ", ".join(f"{k} {v}" for k, v in fallbacks.items())
    unknown = stats.get("unknown_signals") or []
    if unknown:
        text += "; unknown signals: " + ", ".join(
            f"{u['family']}/{u['reason']} {u['count']}" for u in unknown
        )
    return Text(text)


def _ms(value: Any) -> str:
    return f"{float(value):.1f}" if isinstance(value, int | float) else "-"


def replay_line(rec: dict[str, Any]) -> str:
    """``2026-12-04 15:01:02 #7 coding -> coder 200 12 ms upstream id=ab12... session=s turn=1
    outcomes=good_fit`` (local time; the session and verdicts when the record has them)."""
    stamp = str(rec.get("timestamp") or "")
    with contextlib.suppress(ValueError):
        when = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ")
        utc = when.replace(tzinfo=datetime.UTC)
        stamp = utc.astimezone().strftime("%Y-%m-%d %H:%M:%S")
    line = (
        f"{stamp} #{rec.get('seq')} {rec.get('decision')} -> {rec.get('model') or '-'} "
        f"{rec.get('response_status')} {rec.get('duration_ms')} ms "
        f"{rec.get('response_path')} id={rec.get('id')}"
    )
    if rec.get("session_id"):
        line += f" session={rec['session_id']} turn={rec.get('turn_index', 0)}"
    if rec.get("backend_fallbacks"):
        line += " fell back from " + ",".join(rec["backend_fallbacks"])
    verdicts = [str(o.get("verdict")) for o in rec.get("outcomes") or [] if isinstance(o, dict)]
    if verdicts:
        line += " outcomes=" + ",".join(verdicts)
    return line


def event_line(event: dict[str, Any]) -> str:
    """``2026-12-02 17:40:01 #12 replica_ejected replica=primary-0 reason=manual``."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(event.get("time", 0))))
    fields = " ".join(f"{k}={v}" for k, v in event.items() if k not in ("seq", "time", "event"))
    seq = f"#{event['seq']} " if "seq" in event else ""
    return f"{stamp} {seq}{event.get('event', '?')} {fields}".rstrip()


def replica_threads(inventory: dict[str, Any]) -> list[tuple[str, dict[str, Any] | None]]:
    """(replica id, its ``adaptive_threads`` object or None) for every replica."""
    return [
        (r["id"], r.get("adaptive_threads"))
        for dep in inventory.get("deployments", [])
        for r in dep.get("replicas", [])
    ]


def result_line(action: str, result: dict[str, Any]) -> str:
    """What a mutation did, in one line, from its ``{"ok": true, ...}`` answer."""
    detail = " ".join(f"{k}={v}" for k, v in result.items() if k != "ok")
    return f"{action}: done {detail}".rstrip()
