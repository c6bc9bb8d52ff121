"""Text for ``vllm-sr ctl threads``: one block per worker's ``adaptive_threads`` report.

Numpy-free and worker-free on purpose: the CLI prints a report it fetched over the control
socket and must not import the worker (torch, numpy) to do it.
"""

from __future__ import annotations

from typing import Any

ENV_ADAPTIVE = "VLLM_SRUN_CPU_ADAPTIVE_THREADS"  # the same name as vllm_sr.worker.threads


def _count_cell(c: dict[str, Any]) -> str:
    median = c["median_ms"] if c["median_ms"] is not None else "-"
    ratio = c["ratio"] if c["ratio"] is not None else "-"
    return f"{c['threads']}t: {median} ms x{ratio} (n={c['samples']})"


def format_report(report: dict[str, Any] | None) -> str:
    """The report as lines of text; ``None`` (adaptive threads off) says so."""
    if report is None:
        return f"adaptive threads off ({ENV_ADAPTIVE} unset or 0)"
    state = report["state"]
    if state == "retired" and report.get("recorded_drift"):
        state = "retired (recorded drift)"  # by the host record, before this worker explored
    lines = [
        f"mode {report['mode']}  state {state}  configured {report['configured']}  "
        f"allowed {report['allowed']}  shadow passes {report['shadow_passes']} "
        f"({report['shadow_time_share']:.1%} of forward time)"
    ]
    for b in report["buckets"]:
        cells = "  ".join(_count_cell(c) for c in b["counts"])
        lines.append(
            f"  tokens {b['bucket']:>9}  {b['phase']:<9} best {b['best'] or '-'}  "
            f"serving {b['serving']}  {cells}"
        )
    if report.get("fallback"):
        lines.append(f"  note: {report['fallback']}")
    if report["retire_reason"]:
        lines.append(f"  retired: {report['retire_reason']}")
    if report["recommendation"]:
        lines.append(f"  recommended: {report['recommendation']}")
    if report.get("apply"):
        lines.append(f"  to apply: {report['apply']}")
    if report.get("record"):
        lines.append(f"  host record: {report['record']}")
    return "\n".join(lines)
