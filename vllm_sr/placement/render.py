"""Human and JSON renderings of an apply result (``config apply`` and ``serve --dry-run``).

Imports flow one way: render -> apply -> planner (apply never imports this module)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from vllm_sr.placement.apply import ApplyResult
from vllm_sr.placement.planner import Plan


def cpu_ranges(cpus: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (taskset's notation)."""
    out: list[str] = []
    items = sorted(cpus)
    start = prev = items[0]
    for c in [*items[1:], None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        out.append(f"{start}-{prev}" if prev != start else f"{start}")
        if c is not None:
            start = prev = c
    return ",".join(out)


def plan_table(plan: Plan) -> str:
    if not plan.replicas:
        return "\n".join(["no replicas: no worker runs", *(f"note: {n}" for n in plan.notes)])
    rows = [("REPLICA", "DEVICE", "THREADS", "CPUS", "ENV")]
    for r in plan.replicas:
        where = r.device if not r.attached else f"{r.endpoint} ({r.model})"
        cpus = cpu_ranges(r.cpus) if r.cpus else "-"
        env = " ".join(f"{k}={v}" for k, v in r.env.items()) or "-"
        rows.append((r.id, where or "-", str(r.threads or "-"), cpus, env))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row[:4], widths, strict=True)) + "  " + row[4]
        for row in rows
    ]
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


def render_result(result: ApplyResult, *, dry_run: bool = True, as_json: bool = False) -> str:
    """What `config apply` prints: the file's fate, the diff on a dry run, the plan table."""
    if as_json:
        body = result.to_json()
        if dry_run:
            body["diff"] = result.diff
        return json.dumps(body, indent=2)
    if not result.changed:
        head = f"{result.config_path}: unchanged"
    elif dry_run:
        head = f"{result.config_path}: would change (dry run, nothing written):\n" + result.diff
    else:
        head = f"{result.config_path}: written"
    return head.rstrip("\n") + "\n" + plan_table(result.plan)
