"""`vllm-sr config validate|show|apply|migrate`: check, print and write the canonical resource."""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from vllm_sr.config.files import (
    DEFAULT_CONFIG_PATH,
    atomic_write,
    directory_lock,
    effective_dict,
    parse_config,
)
from vllm_sr.config.flags import add_deployment_flags, flags_from_args
from vllm_sr.config.migrate import migrate_text
from vllm_sr.errors import ConfigError
from vllm_sr.placement.allocation import describe_devices
from vllm_sr.placement.apply import ApplyResult, apply_flags
from vllm_sr.placement.artifacts import check_artifacts
from vllm_sr.placement.planner import real_inventory
from vllm_sr.placement.render import render_result


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "config",
        help="validate, show or write config.yaml (the canonical resource)",
        description="Validate, show or write config.yaml. apply starts nothing.",
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    v = verbs.add_parser("validate", help="exit 0, or non-zero listing every problem")
    s = verbs.add_parser(
        "show",
        help="the effective config with defaults filled in",
        description="The effective config with defaults filled in; GPU replicas also show "
        "their allocation ordinal and the host GPU they land on.",
    )
    for q in (v, s):
        q.add_argument(
            "--config",
            type=Path,
            default=DEFAULT_CONFIG_PATH,
            metavar="PATH",
            help=f"default {DEFAULT_CONFIG_PATH}",
        )
        q.add_argument("--json", action="store_true", help="machine-readable output")
    _add_artifact_flags(v)
    v.set_defaults(func=_validate)
    s.set_defaults(func=_show)
    a = verbs.add_parser(
        "apply",
        help="write what the flags describe and print the placement plan",
        description="Write the canonical replicas the flags describe, print the plan; "
        "starts nothing. --dry-run prints the change instead of writing it.",
    )
    add_deployment_flags(a)
    _add_artifact_flags(a)
    a.set_defaults(func=_apply)
    m = verbs.add_parser(
        "migrate",
        help="rewrite upstream 3d48f8c9-era field names to v0.4's, keeping the rest",
        description="Rewrite the fields upstream v0.4 renamed (providers.defaults.default_model "
        "-> model, default_reasoning_effort -> reasoning_effort) to their v0.4 names in FILE; "
        "comments, order and formatting stay. Running it again changes nothing.",
    )
    m.add_argument("file", type=Path, metavar="FILE", help="the config file to rewrite")
    m.add_argument(
        "--dry-run", action="store_true", help="print the change as a unified diff; write nothing"
    )
    m.set_defaults(func=_migrate)


def _add_artifact_flags(q: argparse.ArgumentParser) -> None:
    """Where a worker would look for vllm-sr/NAME: the same host settings `serve` reads."""
    q.add_argument(
        "--service-config",
        metavar="PATH",
        help="host settings TOML whose artifacts_dir is checked (default "
        "/etc/vllm-sr/vllm-sr.toml; all defaults when absent)",
    )
    q.add_argument(
        "--artifacts-dir",
        metavar="DIR",
        help="where vllm-sr/NAME models are installed (overrides the host settings; default "
        "/var/lib/vllm-sr/artifacts)",
    )


def _artifacts_dir(args: argparse.Namespace) -> Path:
    from vllm_sr.config.service import load_service_settings

    overrides = {"artifacts_dir": args.artifacts_dir}
    return load_service_settings(args.service_config, overrides).artifacts_dir


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
    """Schema and rules first; then, of a valid file, whether every artifact loads here."""
    try:
        text = _read(args.config)
        config = parse_config(text, str(args.config))
        check_artifacts(config, text, str(args.config), _artifacts_dir(args))
    except ConfigError as exc:
        if not args.json:
            raise
        print(json.dumps({"config": str(args.config), "valid": False, "problems": exc.problems}))
        return exc.exit_code
    if args.json:
        print(json.dumps({"config": str(args.config), "valid": True, "problems": []}))
    else:
        n = len(config.deployments)
        what = f"{n} deployment{'s' if n != 1 else ''}"
        if config.uses_embedded_default:
            what = "no deployment declared: the embedded default vllm-sr/d3-edge runs"
        elif n == 0:
            what = "no deployment: Router mode's routing needs no model, so no worker runs"
        print(f"{args.config}: valid ({what})")
    return 0


def _show(args: argparse.Namespace) -> int:
    config = parse_config(_read(args.config), str(args.config))
    data = effective_dict(config)
    rows = describe_devices(config, os.environ, real_inventory(os.environ))
    if args.json:
        print(json.dumps({**data, "devices": rows} if rows else data, indent=2))
    else:
        y = YAML(typ="safe", pure=True)
        y.default_flow_style = False
        y.sort_base_mapping_type_on_output = False  # type: ignore[assignment]
        buf = io.StringIO()
        y.dump(data, buf)
        sys.stdout.write(buf.getvalue())
        if rows:
            sys.stdout.write(_device_comments(rows))
    return 0


def _device_comments(rows: list[dict[str, Any]]) -> str:
    """GPU replicas as YAML comments (the output stays loadable config): ordinal and host ID."""
    lines = ["# devices (configured -> host GPU):"]
    for r in rows:
        if "problem" in r:
            lines.append(f"#   {r['replica']}: {r['device']}: {r['problem']}")
        elif r["device"] == "auto":
            lines.append(
                f"#   {r['replica']}: auto = chosen when the service plans (a GPU the "
                "inventory lists, CUDA then ROCm, else cpu)"
            )
        elif r["ordinal"] is None:
            lines.append(f"#   {r['replica']}: {r['device']} = host {r['host_device']}")
        else:
            lines.append(
                f"#   {r['replica']}: {r['device']} = ordinal {r['ordinal']} of "
                f"{r['allocation']} = host {r['host_device']}"
            )
    return "\n".join(lines) + "\n"


def print_apply_result(result: ApplyResult, *, dry_run: bool, as_json: bool) -> None:
    print(render_result(result, dry_run=dry_run, as_json=as_json))


def _apply(args: argparse.Namespace) -> int:
    flags = flags_from_args(args)
    result = apply_flags(
        flags.config_path, flags, dry_run=flags.dry_run, artifacts_dir=_artifacts_dir(args)
    )
    print_apply_result(result, dry_run=flags.dry_run, as_json=flags.json)
    return 0


def _migrate(args: argparse.Namespace) -> int:
    path: Path = args.file
    with directory_lock(path.parent.resolve(), exclusive=not args.dry_run):
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise ConfigError(f"{path}: no such file") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read: {exc}") from exc
        migration = migrate_text(text, str(path))
        if args.dry_run:
            sys.stdout.write(migration.diff(str(path)))
        elif migration.changed:
            atomic_write(path, migration.after)
    if not migration.changed:
        print(f"{path}: already on v0.4's names; nothing to rename", file=sys.stderr)
        return 0
    verb = "would rename" if args.dry_run else "renamed"
    print(f"{path}: {verb} {len(migration.renamed)} field(s) to v0.4's names:", file=sys.stderr)
    for r in migration.renamed:
        print(f"  {r.describe()}", file=sys.stderr)
    return 0
