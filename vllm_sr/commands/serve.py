"""`vllm-sr serve [MODEL] [deployment flags] [host flags]`: apply the flags to config.yaml the
way `vllm-sr config apply` does, then run the service: the supervisor (one worker per planned
replica), the frontend (public HTTP API) and the control API, in one asyncio process, until
SIGTERM / SIGINT. SIGHUP reloads config.yaml, and so does a change to the file (unless
--no-config-watch). Documented in docs/serve.md."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_sr.plan import ServicePlan

log = logging.getLogger("vllm_sr.serve")

WORKER_ARGV_ENV = "VLLM_SR_WORKER_ARGV"
ARTIFACTS_DIR_ENV = "VLLM_SR_ARTIFACTS_DIR"  # the same name as vllm_sr.worker.artifacts


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from vllm_sr.config import flags

    p = sub.add_parser(
        "serve",
        help="run the service: workers, frontend and control API",
        description="Apply the deployment flags to config.yaml, then start one worker per "
        "planned replica, the public frontend and the control API.",
    )
    flags.add_deployment_flags(p)
    host = p.add_argument_group("host settings (override the service config file)")
    host.add_argument("--service-config", metavar="PATH", help="host settings TOML")
    host.add_argument("--listen", metavar="HOST:PORT", help="frontend address (127.0.0.1:8080)")
    host.add_argument("--control-socket", metavar="PATH", help="control API Unix socket")
    host.add_argument("--runtime-dir", metavar="DIR", help="sockets; workers in DIR/workers/")
    host.add_argument(
        "--artifacts-dir",
        metavar="DIR",
        help="where vllm-sr/NAME models are installed (default /var/lib/vllm-sr/artifacts)",
    )
    host.add_argument(
        "--log-format",
        choices=("auto", "text", "json", "journald"),
        help="log lines: auto (journald under systemd, else text), text, json (JSON lines on "
        "stdout, e.g. in a pod) or journald; workers log the same way",
    )
    host.add_argument(
        "--ready-timeout", type=float, metavar="S", help="seconds a worker may take to get ready"
    )
    host.add_argument(
        "--no-config-watch",
        dest="config_watch",
        action="store_false",
        default=None,
        help="do not apply config.yaml changes by themselves (SIGHUP and `ctl reload` still do)",
    )
    host.add_argument(
        "--signal-processes",
        metavar="N|auto",
        help="Router mode: processes for the CPU-bound signals (auto: half the CPU budget, "
        "1..4; 0: on the event loop)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from vllm_sr.config.service import load_service_settings
    from vllm_sr.logs import setup_logging
    from vllm_sr.supervisor.config_source import ConfigSource
    from vllm_sr.supervisor.service import ServeOptions, config_planner, config_scaler, serve

    overrides = {
        "listen": args.listen,
        "control_socket": args.control_socket,
        "runtime_dir": args.runtime_dir,
        "artifacts_dir": args.artifacts_dir,
        "ready_timeout_s": args.ready_timeout,
        "config_watch": args.config_watch,
        "signal_processes": _count_or_auto(args.signal_processes),
    }
    settings = load_service_settings(args.service_config, overrides=overrides)
    config_path = Path(args.config)
    # Another worker command (tests, debugging) resolves artifacts its own way.
    override = os.environ.get(WORKER_ARGV_ENV)
    artifacts_dir = None if override else settings.artifacts_dir
    if not _apply_flags(args, config_path, artifacts_dir):  # --dry-run printed the plan
        return 0
    os.environ[ARTIFACTS_DIR_ENV] = str(settings.artifacts_dir)  # the workers inherit it
    source = ConfigSource(config_path.absolute(), watching=settings.config_watch)
    planner = config_planner(config_path, artifacts_dir, source)
    plan = planner()  # refuse a bad config or plan before anything starts (exit 78)
    if args.listen is None and plan.listen is not None:
        overrides["listen"] = plan.listen  # config.yaml's first listener
        settings = load_service_settings(args.service_config, overrides=overrides)
    log_format = args.log_format or settings.log_format
    if log_format != "auto":
        os.environ["VLLM_SR_LOG_FORMAT"] = log_format  # the workers inherit it
    setup_logging("serve", log_format=log_format)
    if plan.embedded_default:
        log.warning(
            "config.yaml declares no global.model_catalog: the embedded default runs (%s on "
            "one CPU worker, deployment primary, as the decision model)",
            plan.embedded_default,
        )
    elif not plan.deployments:
        log.info("no deployment: Router mode's routing needs no model, so no worker runs")
    _threads_record_dir(settings.state_dir)
    _preload_language_models(plan)
    # Tests (and debugging) may run another worker command; the default is `vllm-sr worker`.
    options = ServeOptions(
        settings=settings,
        announce=_announce,
        worker_argv=shlex.split(override) if override else None,
        config_source=source,
    )
    from vllm_sr.aio import run

    return run(serve(planner, options, scaler=config_scaler(config_path)))


def _preload_language_models(plan: ServicePlan) -> None:
    """The language signal's models load holding the GIL for seconds: before the event loop
    runs, so that nothing (worker readiness, backend health checks) stalls behind them."""
    router = plan.router
    if router is None or not router.enabled or router.providers is None:
        return
    if not any(routing.signals.language for routing in router.recipes.values()):
        return
    import time

    from vllm_sr.router.language import preload_language_models

    started = time.monotonic()
    log.info("loading the language signal's models (every language, about 1 GB)")
    preload_language_models()
    log.info("language models loaded in %.1f s", time.monotonic() - started)


def _count_or_auto(value: str | None) -> int | str | None:
    if value is None or value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        return value  # the settings model refuses it, naming the field and what is accepted


def _threads_record_dir(state_dir: Path) -> None:
    """Adaptive threads keep their per-host record (mode 2 needs one) in the service's state
    directory when it is usable, else the worker's default (~/.local/state/vllm-sr)."""
    if os.access(state_dir, os.W_OK):
        os.environ.setdefault("VLLM_SR_THREADS_RECORD_DIR", str(state_dir / "threads"))


def _apply_flags(args: argparse.Namespace, config_path: Path, artifacts_dir: Path | None) -> bool:
    """Write what the flags say into config.yaml (the same code path as `config apply`, which
    refuses an artifact that cannot load here) and show the plan. False on --dry-run: nothing
    written, nothing to start."""
    from vllm_sr.config import flags
    from vllm_sr.placement import apply
    from vllm_sr.placement.render import render_result

    requested = flags.flags_from_args(args)
    result = apply.apply_flags(
        config_path, requested, dry_run=requested.dry_run, artifacts_dir=artifacts_dir
    )
    if requested.dry_run:
        print(render_result(result, dry_run=True, as_json=requested.json))
        return False
    print(render_result(result, dry_run=False), file=sys.stderr, flush=True)
    return True


def _announce(frontend: str, control: str, plan: ServicePlan) -> None:
    print(
        f"vllm-sr: serving on http://{frontend}  (control API: {control})\n"
        f"  try: {try_curl(frontend, plan)}",
        file=sys.stderr,
        flush=True,
    )


def try_curl(frontend: str, plan: ServicePlan) -> str:
    """The banner's curl: in Router mode a chat on the first auto model name (else the first
    entrypoint's name, else the default provider model), since routing chats is what the
    service is for then; in Engine mode an embedding on the default deployment."""
    router = plan.router
    if router is not None and router.enabled and router.providers is not None:
        models = [*router.auto_model_names, *router.entrypoints]
        model = models[0] if models else router.providers.defaults.default_model
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hello"}]})
        path = "/v1/chat/completions"
    else:
        body = json.dumps({"model": plan.default_deployment, "input": "hello"})
        path = "/v1/embeddings"
    return (
        f"curl -s http://{frontend}{path} -H 'Content-Type: application/json' "
        f"-d {shlex.quote(body)}"
    )
