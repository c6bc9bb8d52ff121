"""`vllm-sr ctl`: drive the running service through its control socket.

Exit codes: 0 done, 1 refused or failed, 2 usage, 3 the service is not running."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from vllm_sr.errors import EXIT_FAILURE, EXIT_OK

# upstream's outcome verdicts and targets, spelled here so that the CLI imports no router code
# (tests/unit/test_control_outcomes.py checks they agree with vllm_sr/router/learning)
VERDICTS = ("good_fit", "underpowered", "overprovisioned", "failed")
TARGETS = ("model", "route", "policy", "stability", "provider", "router")

SOCKET_ENV = "VLLM_SR_CONTROL_SOCKET"
DEFAULT_SOCKET = "/run/vllm-sr/control.sock"


def default_socket() -> str:
    """$VLLM_SR_CONTROL_SOCKET, else the host settings' ``control_socket`` (the default
    settings file may be absent: then /run/vllm-sr/control.sock)."""
    if os.environ.get(SOCKET_ENV):
        return os.environ[SOCKET_ENV]
    from vllm_sr.config.service import load_service_settings

    return str(load_service_settings().control_socket)


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--socket",
        default=None,
        metavar="PATH",
        help=f"control socket (default: host settings, else {DEFAULT_SOCKET})",
    )
    p.add_argument("--json", action="store_true", help="print the API's JSON answer")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds to wait for a change to be applied (default 900, or the host settings' "
        "ready_timeout_s + 60 when longer; reads: 30)",
    )


def default_command_timeout() -> float:
    """How long a change may take to be applied: 900 s, or longer when the host settings give
    new workers more than that to get ready (``ready_timeout_s``), so that `ctl reload` (the
    unit's ExecReload=) never gives up on a reload the service is still waiting for."""
    from vllm_sr.config.service import load_service_settings
    from vllm_sr.control.client import COMMAND_TIMEOUT_S
    from vllm_sr.errors import VllmSrError
    from vllm_sr.supervisor.reconfigure import RELOAD_MARGIN_S

    try:
        ready_timeout_s = load_service_settings().ready_timeout_s
    except VllmSrError:
        return COMMAND_TIMEOUT_S  # the service could not have started on those settings
    return max(COMMAND_TIMEOUT_S, ready_timeout_s + 2 * RELOAD_MARGIN_S)


def client_for(args: argparse.Namespace) -> Any:
    from vllm_sr.control.client import ControlClient

    timeout = args.timeout if args.timeout is not None else default_command_timeout()
    if timeout <= 0:
        from vllm_sr.errors import UsageError

        raise UsageError(f"--timeout: {timeout:g} is not a positive number of seconds")
    return ControlClient(args.socket or default_socket(), command_timeout_s=timeout)


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False, default=str))


def print_status(inventory: dict[str, Any]) -> None:
    """The inventory as `vllm-sr status` shows it: rich tables fitted to a terminal; whole
    values, uncut and uncoloured, when stdout is not one (a pipe, a file)."""
    from rich.console import Console

    from vllm_sr.control.render import status_view, whole_text

    console = Console()
    if console.is_terminal:
        console.print(status_view(inventory))
    else:
        sys.stdout.write(whole_text(status_view(inventory)))


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "ctl",
        help="drive the running service (inventory, events, drain, eject, scale, ...)",
        description="Talk to the running vllm-sr over its control socket. "
        "Exit codes: 0 done, 1 refused or failed, 2 usage, 3 service not running.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(name: str, func: Callable[[argparse.Namespace], int], text: str) -> Any:
        a = actions.add_parser(name, help=text, description=text)
        add_common(a)
        a.set_defaults(func=func)
        return a

    action("inventory", _inventory, "deployments and replicas, as the service sees them")
    ev = action("events", _events, "recent events; --follow to keep streaming")
    ev.add_argument("--follow", "-f", action="store_true", help="stream new events")
    ev.add_argument("--since", type=int, default=None, metavar="SEQ", help="after event SEQ")
    for name, text in (
        ("drain", "stop sending work to a replica and let it finish (readmit undoes it)"),
        ("readmit", "end a replica's ejection, or undo a drain, now"),
        ("restart", "restart a replica's worker process"),
    ):
        action(name, _replica_action, text).add_argument("replica", metavar="ID")
    ej = action("eject", _replica_action, "take a replica out of dispatch for a while")
    ej.add_argument("replica", metavar="ID")
    ej.add_argument(
        "--for",
        dest="duration",
        default=None,
        metavar="DURATION",
        help="how long, e.g. 30s, 500ms, 2m (default: the deployment's base)",
    )
    sc = action("scale", _scale, "set a deployment's worker count (writes the config)")
    sc.add_argument("deployment", metavar="DEPLOYMENT")
    sc.add_argument("replicas", type=int, metavar="N")
    rp = action("replay", _replay, "router_replay's records of routed chats; --follow for new ones")
    rp.add_argument("--decision", default=None, metavar="D", help="only decision D's records")
    rp.add_argument("--recipe", default=None, metavar="R", help="only recipe R's records")
    rp.add_argument("--follow", "-f", action="store_true", help="keep printing new records")
    rp.add_argument("--session", default=None, metavar="S", help="only session S's records")
    rp.add_argument("--since", type=int, default=None, metavar="SEQ", help="after record SEQ")
    oc = action("outcome", _outcome, "Router Learning: a verdict on a routed chat (its replay id)")
    oc.add_argument("replay_id", metavar="REPLAY_ID", help="the answer's x-vsr-replay-id")
    oc.add_argument("verdict", choices=VERDICTS, metavar="VERDICT", help=", ".join(VERDICTS))
    oc.add_argument("--target", default="model", choices=TARGETS, help="default: model")
    oc.add_argument("--model", default=None, metavar="M", help="refuse unless M was chosen")
    oc.add_argument("--reason", default=None, metavar="TEXT")
    oc.add_argument("--score", type=float, default=None, metavar="X", help="0.0 to 1.0")
    oc.add_argument(
        "--key",
        default=None,
        metavar="K",
        help="Idempotency-Key (default: a new one; give one to make a retry safe)",
    )
    action("reload", _reload, "re-read the config and apply it")
    action("threads", _threads, "each CPU worker's learned thread counts (adaptive threads)")


def _inventory(args: argparse.Namespace) -> int:
    inventory = client_for(args).inventory()
    if args.json:
        print_json(inventory)
        return EXIT_OK
    print_status(inventory)
    return EXIT_OK


def _events(args: argparse.Namespace) -> int:
    from vllm_sr.control.protocol import STREAM_CLOSED, STREAM_DROPPED
    from vllm_sr.control.render import event_line

    client = client_for(args)
    if not args.follow:
        answer = client.events(args.since)
        if args.json:
            for event in answer["events"]:
                print(json.dumps(event, default=str))
        else:
            for event in answer["events"]:
                print(event_line(event))
        return EXIT_OK
    for event in client.stream_events(args.since):
        name = event.get("event")
        if name in (STREAM_CLOSED, STREAM_DROPPED):
            print(f"vllm-sr: {event.get('reason', name)}", file=sys.stderr)
            return EXIT_OK if name == STREAM_CLOSED else EXIT_FAILURE
        print(json.dumps(event, default=str) if args.json else event_line(event), flush=True)
    print("vllm-sr: the service closed the event stream", file=sys.stderr)
    return EXIT_FAILURE


REPLAY_POLL_S = 0.5


def _replay(args: argparse.Namespace) -> int:
    """Print the records (one line each, or JSON lines); with --follow, ask again every
    REPLAY_POLL_S for the records after the last one printed, until interrupted."""
    from vllm_sr.control.render import replay_line

    client = client_for(args)
    since = args.since or 0
    while True:
        answer = client.replay(args.decision, since, recipe=args.recipe, session=args.session)
        for rec in answer.get("records", []):
            print(json.dumps(rec, default=str) if args.json else replay_line(rec), flush=True)
            since = max(since, int(rec.get("seq", since)))
        if not args.follow:
            return EXIT_OK
        try:
            time.sleep(REPLAY_POLL_S)
        except KeyboardInterrupt:
            return EXIT_OK


def _outcome(args: argparse.Namespace) -> int:
    import uuid

    key = args.key or uuid.uuid4().hex
    result = client_for(args).outcome(
        args.replay_id,
        args.verdict,
        key,
        target=args.target,
        target_ref=args.model,
        reason=args.reason,
        score=args.score,
    )
    if args.json:
        print_json(result)
    elif result.get("duplicate"):
        print(f"outcome {args.verdict} on {args.replay_id}: already applied (key {key})")
    elif result.get("updated"):
        print(f"outcome {args.verdict} on {args.replay_id}: filed for {result.get('model')}")
    else:
        print(f"outcome {args.verdict} on {args.replay_id}: accepted ({args.target}: no change)")
    return EXIT_OK


def _done(args: argparse.Namespace, what: str, result: dict[str, Any]) -> int:
    from vllm_sr.control.render import result_line

    if args.json:
        print_json(result)
    else:
        print(result_line(what, result))
    return EXIT_OK


def _replica_action(args: argparse.Namespace) -> int:
    client = client_for(args)
    if args.action == "eject":
        from vllm_sr.control.render import parse_duration_ms

        ms = None if args.duration is None else parse_duration_ms(args.duration)
        result = client.eject(args.replica, ms)
    else:
        result = getattr(client, args.action)(args.replica)
    return _done(args, f"{args.action} {args.replica}", result)


def _scale(args: argparse.Namespace) -> int:
    if args.replicas < 0:
        from vllm_sr.errors import UsageError

        raise UsageError(f"N: {args.replicas} is negative; give a worker count >= 0")
    result = client_for(args).scale(args.deployment, args.replicas)
    return _done(args, f"scale {args.deployment} to {args.replicas}", result)


def _reload(args: argparse.Namespace) -> int:
    return _done(args, "reload", client_for(args).reload())


def _threads(args: argparse.Namespace) -> int:
    from vllm_sr.control.render import replica_threads

    rows = replica_threads(client_for(args).inventory())
    if args.json:
        print_json({rid: report for rid, report in rows})
        return EXIT_OK
    if not rows:
        print("no replicas")
    for rid, report in rows:
        print(f"{rid}:")
        print(_indent(_format_threads(report)))
    return EXIT_OK


def _format_threads(report: dict[str, Any] | None) -> str:
    from vllm_sr.control.threads_report import format_report

    try:
        return format_report(report)
    except (KeyError, TypeError, ValueError):
        # A worker of another version: show what it said rather than fail.
        return json.dumps(report, indent=2, default=str)


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())
