"""`vllm-sr serve [MODEL] [deployment flags] [host flags]`: apply the flags to config.yaml the
way `vllm-sr config apply` does, then run the service: the supervisor (one worker per planned
replica), the frontend (public HTTP API) and the control API, in one asyncio process, until
SIGTERM / SIGINT. SIGHUP reloads config.yaml. Documented in docs/serve.md."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("vllm_sr.serve")

DEFAULT_CONFIG = "/etc/vllm-sr/config.yaml"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="run the service: workers, frontend and control API",
        description="Apply the deployment flags to config.yaml, then start one worker per "
        "planned replica, the public frontend and the control API.",
    )
    try:
        from vllm_sr.config import flags
    except ImportError:  # the config package is still being built
        p.add_argument("model", nargs="?")
        p.add_argument("--config")
    else:
        flags.add_deployment_flags(p)
    host = p.add_argument_group("host settings (override the service config file)")
    host.add_argument("--service-config", metavar="PATH", help="host settings TOML")
    host.add_argument("--listen", metavar="HOST:PORT", help="frontend address (127.0.0.1:8080)")
    host.add_argument("--control-socket", metavar="PATH", help="control API Unix socket")
    host.add_argument("--runtime-dir", metavar="DIR", help="sockets; workers in DIR/workers/")
    host.add_argument(
        "--ready-timeout", type=float, metavar="S", help="seconds a worker may take to get ready"
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from vllm_sr.config.service import load_service_settings
    from vllm_sr.logs import setup_logging
    from vllm_sr.supervisor.service import ServeOptions, config_planner, config_scaler, serve

    settings = load_service_settings(
        args.service_config,
        overrides={
            "listen": args.listen,
            "control_socket": args.control_socket,
            "runtime_dir": args.runtime_dir,
            "ready_timeout_s": args.ready_timeout,
        },
    )
    config_path = Path(args.config or DEFAULT_CONFIG)
    applied = _apply_flags(args, config_path)
    if applied is None:  # --dry-run printed the plan
        return 0
    planner = config_planner(config_path)
    planner()  # refuse a bad config or plan before anything starts (exit 78)
    setup_logging("serve")
    options = ServeOptions(settings=settings, announce=_announce)
    return asyncio.run(serve(planner, options, scaler=config_scaler(config_path)))


def _apply_flags(args: argparse.Namespace, config_path: Path) -> Any:
    """Write what the flags say into config.yaml (the same code path as `config apply`)."""
    from vllm_sr.config import apply, flags

    requested = flags.flags_from_args(args)
    result = apply.apply_flags(
        config_path, requested, dry_run=bool(getattr(args, "dry_run", False))
    )
    if getattr(args, "dry_run", False):
        print(apply.render_result(result) if hasattr(apply, "render_result") else result)
        return None
    return result


def _announce(frontend: str, control: str, default_model: str) -> None:
    print(
        f"vllm-sr: serving on http://{frontend}  (control API: {control})\n"
        f"  try: curl -s http://{frontend}/v1/embeddings -H 'Content-Type: application/json' "
        f'-d \'{{"model": "{default_model}", "input": "hello"}}\'',
        file=sys.stderr,
        flush=True,
    )
