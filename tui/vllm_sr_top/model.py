"""Pure view logic of the dashboard: formatting, colours, sorting, filtering, throughput
history and the reconnect backoff. No Textual and no I/O here, so all of it is testable on
plain data and a fake clock."""

from __future__ import annotations

import collections
import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.text import Text

from vllm_sr.control.render import format_seconds, short_dtype

# Colours chosen so that a state reads at a glance: green serves, yellow is on its way back,
# red is out, grey is gone.
REPLICA_STATE_STYLES: dict[str, str] = {
    "ready": "bold green",
    "starting": "cyan",
    "backoff": "yellow",
    "ejected": "bold red",
    "hung": "bold red",
    "draining": "magenta",
    "failed": "bold white on red",
    "incompatible": "red",
    "stopped": "grey50",
}
POOL_STATE_STYLES: dict[str, str] = {
    "ready": "bold green",
    "degraded": "bold yellow",
    "unavailable": "bold white on red",
}
EVENT_STYLES: dict[str, str] = {
    "replica_ejected": "bold red",
    "replica_readmitted": "green",
    "replica_ejection_withheld": "yellow",
    "replica_restarted": "magenta",
    "replica_exited": "red",
    "replica_failed": "bold red",
    "replica_ready": "green",
    "replica_draining": "magenta",
    "reload_failed": "bold red",
    "pool_published": "cyan",
    "signal_process_exited": "red",
    "signal_process_ready": "green",
}
# Fields that every event of a replica carries; shown as the subject, not repeated as k=v.
_SUBJECT_FIELDS = ("seq", "time", "event", "deployment", "replica")

DEFAULT_MAX_INFLIGHT = 32
HISTORY_LEN = 120


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}"


def fmt_rate(rate: float | None) -> str:
    if rate is None:
        return "-"
    return f"{rate:.0f}" if rate >= 100 else f"{rate:.1f}"


def inflight_bar(inflight: int, max_inflight: int | None, width: int = 8) -> Text:
    """A bar of ``inflight`` out of the admission limit (32 per worker), then ``n/max``."""
    limit = max_inflight or DEFAULT_MAX_INFLIGHT
    filled = min(width, round(width * max(0, inflight) / limit))
    ratio = inflight / limit
    style = "red" if ratio >= 1 else "yellow" if ratio >= 0.75 else "green"
    bar = Text()
    bar.append("█" * filled, style=style)
    bar.append("░" * (width - filled), style="grey35")
    bar.append(f" {inflight:>2}/{limit}")
    return bar


def ejection_cell(ejections: int, ejected_until: float | None, now: float) -> Text:
    """Ejections so far and, while ejected, the time left of the current cool-down."""
    cell = Text(str(ejections))
    if ejected_until is not None and ejected_until > now:
        cell.append(f" ({format_seconds(ejected_until - now, whole=True)})", style="bold red")
    return cell


def state_text(state: str) -> Text:
    return Text(state, style=REPLICA_STATE_STYLES.get(state, "white"))


def pool_state_text(state: str) -> Text:
    return Text(state, style=POOL_STATE_STYLES.get(state, "white"))


# Trouble-shooting columns first, so an 80-column terminal still shows state, load and
# ejections; the rest scroll in horizontally.
COLUMNS: tuple[str, ...] = (
    "ID",
    "STATE",
    "IN-FLIGHT",
    "EJECT",
    "TMO",
    "REQ/S",
    "P50 ms",
    "P99 ms",
    "BYTES",
    "RST",
    "THR",
    "CPU%",
    "RSS",
    "GPU",
    "DEVICE",
    "DTYPE",
    "PID",
    "LAST ERROR",
)

LAST_ERROR_WIDTH = 60  # the whole text is in `vllm-sr ctl inventory`


def last_error_cell(error: Any) -> str:
    """The replica's last error (an exit, a failed spawn, a failed health probe, its
    supervision raising), cut to ``LAST_ERROR_WIDTH``; "-" when it has none."""
    if not error:
        return "-"
    text = " ".join(str(error).split())  # one line, whatever the worker wrote
    return text if len(text) <= LAST_ERROR_WIDTH else text[: LAST_ERROR_WIDTH - 1] + "…"


def threads_cell(threads: Any, adaptive: Any) -> str:
    """The THR cell: the worker's threads and, with adaptive threads on, what its learner
    says (``ctl threads`` has the whole report): 2 (exploring), 2->1 (learned, 1 is best),
    2 (retired)."""
    text = str(threads) if threads else "-"
    if not isinstance(adaptive, dict):
        return text
    state = str(adaptive.get("state") or "?")
    best = adaptive.get("recommended_threads")
    if state == "learned" and best is not None:
        return f"{text}->{best}"
    return f"{text} ({state})"


def usage_cells(usage: Any) -> list[str]:
    """CPU % (of one core), resident memory and the GPU's memory and utilisation, as htop and
    nvitop show them; "-" until the supervisor's first sample."""
    if not isinstance(usage, dict):
        return ["-", "-", "-"]
    cpu = usage.get("cpu_percent")
    gpu = usage.get("gpu")
    gpu_text = "-"
    if isinstance(gpu, dict) and gpu.get("memory_total_bytes"):
        used = fmt_bytes(gpu.get("memory_used_bytes") or 0).replace(" ", "")
        total = fmt_bytes(gpu.get("memory_total_bytes")).replace(" ", "")
        util = gpu.get("utilization_percent")
        gpu_text = f"{used}/{total}" + (f" {util:.0f}%" if isinstance(util, int | float) else "")
    return [
        f"{cpu:.0f}" if isinstance(cpu, int | float) else "-",
        fmt_bytes(usage.get("rss_bytes")),
        gpu_text,
    ]


def replica_cells(replica: dict[str, Any], now: float) -> list[Text | str]:
    """The table row of one inventory replica, in ``COLUMNS`` order."""
    pid = replica.get("pid")
    return [
        str(replica.get("id", "?")),
        state_text(str(replica.get("state", "?"))),
        inflight_bar(int(replica.get("inflight") or 0), replica.get("max_inflight")),
        ejection_cell(int(replica.get("ejections") or 0), replica.get("ejected_until"), now),
        str(replica.get("consecutive_timeouts") or 0),
        fmt_rate(replica.get("requests_per_s")),
        fmt_ms(replica.get("latency_p50_ms")),
        fmt_ms(replica.get("latency_p99_ms")),
        fmt_bytes(replica.get("outstanding_bytes") or 0),
        str(replica.get("restarts") or 0),
        threads_cell(replica.get("threads"), replica.get("adaptive_threads")),
        *usage_cells(replica.get("usage")),
        str(replica.get("device") or replica.get("endpoint") or "-"),
        short_dtype(replica.get("dtype")),
        str(pid) if pid else "-",
        last_error_cell(replica.get("last_error")),
    ]


# Trouble first when sorting by state.
_STATE_SEVERITY = {
    s: i
    for i, s in enumerate(
        (
            "failed",
            "hung",
            "ejected",
            "incompatible",
            "backoff",
            "draining",
            "starting",
            "stopped",
            "ready",
        )
    )
}


def _natural_id(replica: dict[str, Any]) -> tuple[str, int]:
    # "primary-10" sorts after "primary-9".
    rid = str(replica.get("id", ""))
    head, _, tail = rid.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (rid, -1)


@dataclass(frozen=True)
class SortKey:
    name: str
    key: Callable[[dict[str, Any]], Any]
    descending: bool = False


SORT_KEYS: tuple[SortKey, ...] = (
    SortKey("id", _natural_id),
    SortKey("state", lambda r: _STATE_SEVERITY.get(str(r.get("state")), 99)),
    SortKey("in-flight", lambda r: r.get("inflight") or 0, True),
    SortKey("req/s", lambda r: r.get("requests_per_s") or 0.0, True),
    SortKey("p99", lambda r: r.get("latency_p99_ms") or 0.0, True),
    SortKey("restarts", lambda r: r.get("restarts") or 0, True),
)


def sort_replicas(replicas: Sequence[dict[str, Any]], sort: SortKey) -> list[dict[str, Any]]:
    # Python's sort is stable: sorting by id first keeps ties in id order.
    ordered = sorted(replicas, key=_natural_id)
    return sorted(ordered, key=sort.key, reverse=sort.descending)


def next_sort(current: SortKey) -> SortKey:
    index = SORT_KEYS.index(current)
    return SORT_KEYS[(index + 1) % len(SORT_KEYS)]


def next_filter(current: str | None, names: Sequence[str]) -> str | None:
    """Cycle: all deployments, then each one by name, then all again."""
    if not names:
        return None
    if current is None or current not in names:
        return names[0] if current is None else None
    index = list(names).index(current)
    return names[index + 1] if index + 1 < len(names) else None


@dataclass
class ThroughputHistory:
    """Requests per second of each deployment, one sample per poll."""

    maxlen: int = HISTORY_LEN
    series: dict[str, collections.deque[float]] = field(default_factory=dict)

    def record(self, inventory: dict[str, Any]) -> None:
        for dep in inventory.get("deployments", []):
            total = sum(float(r.get("requests_per_s") or 0.0) for r in dep.get("replicas", []))
            name = str(dep.get("name"))
            self.series.setdefault(name, collections.deque(maxlen=self.maxlen)).append(total)

    def samples(self, name: str) -> list[float]:
        return list(self.series.get(name, ()))


def fmt_clock(unix: float, tz: dt.tzinfo | None) -> str:
    return dt.datetime.fromtimestamp(unix, tz=tz).strftime("%H:%M:%S")


def _event_detail(event: dict[str, Any]) -> str:
    parts = []
    for key, value in event.items():
        if key in _SUBJECT_FIELDS or value is None:
            continue
        if key == "duration_ms" and isinstance(value, int | float):
            parts.append(f"for {format_seconds(value / 1000, whole=True)}")
        else:
            parts.append(f"{key}={value}")
    return " ".join(parts)


def event_line(event: dict[str, Any], tz: dt.tzinfo | None) -> Text:
    """One events-pane line: time, event name (coloured), subject, the other fields."""
    name = str(event.get("event", "?"))
    when = event.get("time")
    line = Text(fmt_clock(float(when), tz) if isinstance(when, int | float) else "--:--:--")
    line.append(" ")
    line.append(name, style=EVENT_STYLES.get(name, "white"))
    subject = event.get("replica") or event.get("deployment")
    if subject:
        line.append(f" {subject}", style="bold")
    detail = _event_detail(event)
    if detail:
        line.append(f" {detail}", style="grey70")
    return line


def deployment_title(dep: dict[str, Any]) -> Text:
    """``primary  2/2 ready  ready  1 ejected``: desired/ready counts and the pool state."""
    title = Text(str(dep.get("name", "?")), style="bold")
    title.append(f"  {dep.get('ready_replicas', 0)}/{dep.get('desired_replicas', 0)} ready  ")
    title.append_text(pool_state_text(str(dep.get("state", "?"))))
    ejected = dep.get("ejected_replicas") or 0
    if ejected:
        title.append(f"  {ejected} ejected", style="red")
    return title


class DecisionRates:
    """Router mode's decisions per second, from the counters of two successive inventories."""

    def __init__(self) -> None:
        self._last: tuple[float, dict[tuple[str, str], int]] | None = None
        self.rates: dict[tuple[str, str], float] = {}

    def update(self, router: dict[str, Any] | None, now: float) -> None:
        """A new inventory's counters, asked for at ``now``: the rates since the last one."""
        stats = (router or {}).get("stats") or {}
        counts = {
            (str(d.get("decision")), str(d.get("model"))): int(d.get("count") or 0)
            for d in stats.get("decisions", [])
        }
        if self._last is not None and now > self._last[0]:
            then, before = self._last
            self.rates = {k: max(0, n - before.get(k, 0)) / (now - then) for k, n in counts.items()}
        self._last = (now, counts)


def decisions_text(router: dict[str, Any], rates: dict[tuple[str, str], float]) -> Text:
    """``decisions/s  coding->coder 2.5  billing->general 0.0``, then fallbacks if any."""
    line = Text("decisions/s ", style="bold")
    stats = router.get("stats") or {}
    for d in stats.get("decisions", []):
        key = (str(d.get("decision")), str(d.get("model")))
        line.append(f" {key[0]}->{key[1]} {rates.get(key, 0.0):.1f}")
    if not stats.get("decisions"):
        line.append(" none yet")
    fallbacks = stats.get("fallbacks") or {}
    if fallbacks:
        line.append("  fallbacks " + ", ".join(f"{k} {v}" for k, v in fallbacks.items()), "red")
    return line
