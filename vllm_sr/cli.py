"""argparse front. Each subcommand lives in ``vllm_sr/commands/<name>.py`` and exposes
``register(subparsers)``; the parser it adds sets ``func`` to a callable taking the parsed
args and returning an exit code. Only this module exits the process."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from vllm_sr import __version__
from vllm_sr.errors import EXIT_FAILURE, ConfigError, VllmSrError

COMMAND_MODULES = ("serve", "config", "ctl", "status", "render", "worker")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-sr",
        description="Place, scale and watch model workers for the vLLM Semantic Router.",
    )
    parser.add_argument("--version", action="version", version=f"vllm-sr {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"vllm_sr.commands.{name}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"vllm-sr: {problem}", file=sys.stderr)
        code = exc.exit_code
    except VllmSrError as exc:
        print(f"vllm-sr: {exc.message}", file=sys.stderr)
        code = exc.exit_code
    except KeyboardInterrupt:
        code = 130
    sys.exit(code if isinstance(code, int) else EXIT_FAILURE)


if __name__ == "__main__":
    main()
