"""`vllm-sr status`: deployments and replicas of the running service, as a table (or JSON).

Exit codes: 0 shown, 1 failed, 3 the service is not running."""

from __future__ import annotations

import argparse
from typing import Any

from vllm_sr.commands.ctl import add_common, client_for, print_json
from vllm_sr.errors import EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "status",
        help="deployments and replicas of the running service",
        description="State, device, pid, in-flight requests, restarts, ejections and the time "
        "left in each ejection, for every replica. Exit 3 when the service is not running.",
    )
    add_common(p)
    p.set_defaults(func=_run)


def print_status(inventory: dict[str, Any]) -> None:
    from rich.console import Console

    from vllm_sr.control.render import status_view

    Console().print(status_view(inventory))


def _run(args: argparse.Namespace) -> int:
    inventory = client_for(args).inventory()
    if args.json:
        print_json(inventory)
    else:
        print_status(inventory)
    return EXIT_OK
