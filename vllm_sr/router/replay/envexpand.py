"""``${VAR}`` in router_replay's connection settings, read from the environment when the store
connects (upstream's loader expands the whole file at load with the same grammar; vllm-sr
expands only these strings, so ``config show`` never prints a secret taken from the
environment). Forms: ``${VAR}`` and ``$VAR``; ``${VAR:-default}`` when VAR is unset or empty;
``${VAR-default}`` when VAR is unset; ``$$`` for a literal ``$``. An unset VAR is empty."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

_TOKEN = re.compile(
    r"\$\$"  # a literal dollar
    r"|\$\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:-|-)(?P<default>[^}]*))?\}"
    r"|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)"
)


def expand_env(value: str, env: Mapping[str, str] | None = None) -> str:
    """``value`` with its variables replaced from ``env`` (default: the process's)."""
    if "$" not in value:
        return value
    source = os.environ if env is None else env

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group("braced") or match.group("bare")
        found = source.get(name)
        op = match.group("op")
        if op == ":-" and not found:
            return match.group("default") or ""
        if op == "-" and found is None:
            return match.group("default") or ""
        return found or ""

    return _TOKEN.sub(one, value)
