"""`vllm-sr status`: deployments and replicas of the running service, as a table (or JSON).

Exit codes: 0 shown, 1 failed, 3 the service is not running."""

from __future__ import annotations

import argparse

from vllm_sr.commands.ctl import add_common, client_for, print_json, print_status
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


def _run(args: argparse.Namespace) -> int:
    inventory = client_for(args).inventory()
    if args.json:
        print_json(inventory)
    else:
        print_status(inventory)
    return EXIT_OK
