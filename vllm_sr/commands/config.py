"""`vllm-sr config validate|show|apply`: check, print and write the canonical resource."""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from vllm_sr.config.apply import ApplyResult, apply_flags
from vllm_sr.config.files import DEFAULT_CONFIG_PATH, effective_dict, parse_config
from vllm_sr.config.flags import add_deployment_flags, flags_from_args
from vllm_sr.errors import ConfigError
from vllm_sr.placement.planner import Plan


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "config",
        help="validate, show or write config.yaml (the canonical resource)",
        description="Validate, show or write config.yaml. apply starts nothing.",
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    v = verbs.add_parser("validate", help="exit 0, or non-zero listing every problem")
    s = verbs.add_parser("show", help="the effective config with defaults filled in")
    for q in (v, s):
        q.add_argument(
            "--config",
            type=Path,
            default=DEFAULT_CONFIG_PATH,
            metavar="PATH",
            help=f"default {DEFAULT_CONFIG_PATH}",
        )
        q.add_argument("--json", action="store_true", help="machine-readable output")
    v.set_defaults(func=_validate)
    s.set_defaults(func=_show)
    a = verbs.add_parser(
        "apply",
        help="write what the flags describe and print the placement plan",
        description="Write the canonical replicas the flags describe, print the plan; "
        "starts nothing. --dry-run prints the change instead of writing it.",
    )
    add_deployment_flags(a)
    a.set_defaults(func=_apply)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(
            f"--config {path}: no such file; create it with `vllm-sr config apply --config "
            f"{path}` (writes the built-in default)"
        ) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {path}: cannot read: {exc}") from exc


def _validate(args: argparse.Namespace) -> int:
    try:
        config = parse_config(_read(args.config), str(args.config))
    except ConfigError as exc:
        if not args.json:
            raise
        print(json.dumps({"config": str(args.config), "valid": False, "problems": exc.problems}))
        return exc.exit_code
    if args.json:
        print(json.dumps({"config": str(args.config), "valid": True, "problems": []}))
    else:
        n = len(config.deployments)
        print(f"{args.config}: valid ({n} deployment{'s' if n != 1 else ''})")
    return 0


def _show(args: argparse.Namespace) -> int:
    config = parse_config(_read(args.config), str(args.config))
    data = effective_dict(config)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        y = YAML(typ="safe", pure=True)
        y.default_flow_style = False
        y.sort_base_mapping_type_on_output = False  # type: ignore[assignment]
        buf = io.StringIO()
        y.dump(data, buf)
        sys.stdout.write(buf.getvalue())
    return 0


def plan_table(plan: Plan) -> str:
    rows = [("REPLICA", "DEVICE", "THREADS", "CPUS", "ENV")]
    for r in plan.replicas:
        where = r.device if not r.attached else f"{r.endpoint} ({r.model})"
        cpus = _ranges(r.cpus) if r.cpus else "-"
        env = " ".join(f"{k}={v}" for k, v in r.env.items()) or "-"
        rows.append((r.id, where or "-", str(r.threads or "-"), cpus, env))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row[:4], widths, strict=True)) + "  " + row[4]
        for row in rows
    ]
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


def _ranges(cpus: Any) -> str:
    out, items = [], sorted(cpus)
    start = prev = items[0]
    for c in [*items[1:], None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        out.append(f"{start}-{prev}" if prev != start else f"{start}")
        if c is not None:
            start = prev = c
    return ",".join(out)


def print_apply_result(result: ApplyResult, *, dry_run: bool, as_json: bool) -> None:
    """Shared with `vllm-sr serve --dry-run`."""
    if as_json:
        body = result.to_json()
        if dry_run:
            body["diff"] = result.diff
        print(json.dumps(body, indent=2))
        return
    if not result.changed:
        print(f"{result.config_path}: unchanged")
    elif dry_run:
        print(f"{result.config_path}: would change (dry run, nothing written):")
        sys.stdout.write(result.diff)
    else:
        print(f"{result.config_path}: written")
    print(plan_table(result.plan))


def _apply(args: argparse.Namespace) -> int:
    flags = flags_from_args(args)
    result = apply_flags(flags.config_path, flags, dry_run=flags.dry_run)
    print_apply_result(result, dry_run=flags.dry_run, as_json=flags.json)
    return 0
