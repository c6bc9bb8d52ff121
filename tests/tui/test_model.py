"""The dashboard's pure view logic: formatting, colours, sorting, filtering."""

from __future__ import annotations

import datetime as dt

from vllm_sr_top.model import (
    COLUMNS,
    SORT_KEYS,
    ThroughputHistory,
    deployment_title,
    ejection_cell,
    event_line,
    fmt_bytes,
    inflight_bar,
    next_filter,
    next_sort,
    replica_cells,
    sort_replicas,
    state_text,
    threads_cell,
)
from vllm_sr_top.source import permission_from_health

from tests.support.control_fake import sample_adaptive_threads
from vllm_sr.control.render import format_seconds


def test_bytes_and_durations_are_compact() -> None:
    assert fmt_bytes(0) == "0 B"
    assert fmt_bytes(1023) == "1023 B"
    assert fmt_bytes(1536) == "1.5 KiB"
    assert fmt_bytes(5 * 1024 * 1024) == "5.0 MiB"
    assert format_seconds(9.9, whole=True) == "9s"
    assert format_seconds(245, whole=True) == "4m05s"
    assert format_seconds(2 * 3600 + 180, whole=True) == "2h03m"
    assert format_seconds(3 * 86400 + 4 * 3600, whole=True) == "3d04h"
    assert format_seconds(None, whole=True) == "-"


def test_inflight_bar_fills_in_proportion_to_the_limit() -> None:
    assert inflight_bar(0, 32).plain == "░░░░░░░░  0/32"
    assert inflight_bar(16, 32).plain == "████░░░░ 16/32"
    full = inflight_bar(32, 32)
    assert full.plain == "████████ 32/32"
    assert full.spans[0].style == "red" and full.spans[0].end == 8
    # An unknown limit falls back to the pool's admission limit of 32.
    assert inflight_bar(8, None).plain.endswith(" 8/32")


def test_ejection_cell_counts_down_only_while_ejected() -> None:
    assert ejection_cell(2, 1000.0 + 25, now=1000.0).plain == "2 (25s)"
    assert ejection_cell(2, 990.0, now=1000.0).plain == "2"
    assert ejection_cell(0, None, now=1000.0).plain == "0"


def test_state_colours_differ_per_state() -> None:
    styles = {s: str(state_text(s).style) for s in ("ready", "ejected", "backoff", "failed")}
    assert len(set(styles.values())) == 4
    assert "green" in styles["ready"] and "red" in styles["ejected"]


def _replica(rid: str, **kw: object) -> dict[str, object]:
    base: dict[str, object] = {"id": rid, "state": "ready", "inflight": 0, "requests_per_s": 0.0}
    base.update(kw)
    return base


def test_sorts_cycle_and_order_replicas() -> None:
    replicas = [
        _replica("p-10", inflight=1),
        _replica("p-2", inflight=9, state="ejected"),
        _replica("p-1", inflight=9),
    ]
    by_id = sort_replicas(replicas, SORT_KEYS[0])
    assert [r["id"] for r in by_id] == ["p-1", "p-2", "p-10"]  # natural, not lexical
    inflight = next(k for k in SORT_KEYS if k.name == "in-flight")
    assert [r["id"] for r in sort_replicas(replicas, inflight)] == ["p-1", "p-2", "p-10"]
    state = next(k for k in SORT_KEYS if k.name == "state")
    assert sort_replicas(replicas, state)[0]["id"] == "p-2"  # trouble first
    key = SORT_KEYS[0]
    seen = set()
    for _ in SORT_KEYS:
        seen.add(key.name)
        key = next_sort(key)
    assert key == SORT_KEYS[0] and len(seen) == len(SORT_KEYS)


def test_filter_cycles_all_then_each_deployment() -> None:
    names = ["a", "b"]
    assert next_filter(None, names) == "a"
    assert next_filter("a", names) == "b"
    assert next_filter("b", names) is None
    assert next_filter("gone", names) is None
    assert next_filter(None, []) is None


def test_history_sums_replica_rates_per_deployment() -> None:
    history = ThroughputHistory(maxlen=2)
    for rate in (1.0, 2.0, 3.0):
        history.record(
            {"deployments": [{"name": "a", "replicas": [_replica("a-0", requests_per_s=rate)] * 2}]}
        )
    assert history.samples("a") == [4.0, 6.0]
    assert history.samples("missing") == []


def test_event_line_shows_time_name_subject_and_fields() -> None:
    event = {
        "seq": 3,
        "time": 1_700_000_000.0,
        "event": "replica_ejected",
        "deployment": "primary",
        "replica": "primary-1",
        "timeouts": 3,
        "duration_ms": 30000,
        "reason": "manual",
    }
    line = event_line(event, dt.UTC)
    assert line.plain == "22:13:20 replica_ejected primary-1 timeouts=3 for 30s reason=manual"


def test_replica_row_and_title_render_inventory_fields() -> None:
    replica = _replica(
        "primary-0",
        device="cpu",
        pid=4242,
        inflight=4,
        max_inflight=32,
        outstanding_bytes=2048,
        requests_per_s=12.5,
        latency_p50_ms=3.25,
        latency_p99_ms=140.0,
        consecutive_timeouts=2,
        ejections=1,
        ejected_until=None,
        restarts=3,
        threads=2,
        dtype="bfloat16",
    )
    cells = [c if isinstance(c, str) else c.plain for c in replica_cells(replica, now=0.0)]
    assert cells == [
        "primary-0", "ready", "█░░░░░░░  4/32", "1", "2", "12.5", "3.2", "140", "2.0 KiB",
        "3", "2", "-", "-", "-", "cpu", "bf16", "4242", "-",
    ]  # fmt: skip
    assert len(cells) == len(COLUMNS) and COLUMNS[cells.index("bf16")] == "DTYPE"
    title = deployment_title(
        {"name": "primary", "state": "degraded", "desired_replicas": 2, "ready_replicas": 1,
         "ejected_replicas": 1}
    )  # fmt: skip
    assert title.plain == "primary  1/2 ready  degraded  1 ejected"


def test_threads_cell_says_what_the_learner_says() -> None:
    learned = sample_adaptive_threads()
    assert threads_cell(2, None) == "2" and threads_cell(None, None) == "-"
    assert threads_cell(2, learned) == "2->1"
    assert threads_cell(2, learned | {"state": "exploring"}) == "2 (exploring)"
    assert threads_cell(2, sample_adaptive_threads("retired", "no gain")) == "2 (retired)"


def test_permission_comes_from_health_when_the_service_says() -> None:
    assert permission_from_health({"status": "ready"}) is None  # unknown: the first 403 says
    assert permission_from_health({"caller": {"may_mutate": True}}) is None
    why = "uid 1000 is not in the admin group"
    assert permission_from_health({"caller": {"may_mutate": False, "why": why}}) == why


def test_usage_cells_show_cpu_rss_and_gpu_as_htop_and_nvitop_do() -> None:
    from vllm_sr_top.model import COLUMNS, usage_cells

    usage = {
        "cpu_percent": 87.4,
        "rss_bytes": 512 * 1024 * 1024,
        "gpu": {
            "memory_used_bytes": 12 * 1024**3,
            "memory_total_bytes": 64 * 1024**3,
            "utilization_percent": 45,
        },
    }
    assert usage_cells(usage) == ["87", "512.0 MiB", "12.0GiB/64.0GiB 45%"]
    assert usage_cells({"cpu_percent": 3.0, "rss_bytes": 2048, "gpu": None}) == [
        "3",
        "2.0 KiB",
        "-",
    ]
    assert usage_cells(None) == ["-", "-", "-"]
    assert COLUMNS.index("CPU%") < COLUMNS.index("DEVICE")


def test_the_last_error_column_shows_the_replicas_last_error_on_one_line() -> None:
    from vllm_sr_top.model import COLUMNS, LAST_ERROR_WIDTH, last_error_cell, replica_cells

    assert COLUMNS[-1] == "LAST ERROR"
    spawn = "spawn failed: OSError: [Errno 24] Too many open files"
    row = replica_cells({"id": "primary-0", "state": "backoff", "last_error": spawn}, 0.0)
    assert row[-1] == spawn and len(row) == len(COLUMNS)
    assert last_error_cell(None) == "-" and last_error_cell("") == "-"
    long = "supervision failed: RuntimeError: " + "x" * 100 + "\nsecond line"
    cell = last_error_cell(long)
    assert len(cell) == LAST_ERROR_WIDTH and cell.endswith("…") and "\n" not in cell


def test_every_replica_state_has_a_style_and_a_severity() -> None:
    """A state added to the one vocabulary (vllm_sr.plan.ReplicaState) must show in colour in
    vllm-sr-top and `vllm-sr ctl status`, and sort with the trouble it is."""
    from vllm_sr_top import model

    from vllm_sr.control import render
    from vllm_sr.plan import ReplicaState

    for state in ReplicaState:
        assert state.value in model.REPLICA_STATE_STYLES, state
        assert state.value in model._STATE_SEVERITY, state
        assert state.value in render._STATE_STYLE, state
    assert model._STATE_SEVERITY["hung"] < model._STATE_SEVERITY["ready"]
