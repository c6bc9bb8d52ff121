"""A config problem at a YAML path (files.py adds the line number): shared by the schema's
rules and Router mode's rules (``routing_rules.py``), so neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass

SEMANTIC_ERROR = "vllm_sr_rule"
# A field's value refused with its own sentence (field, value, reason, what is accepted);
# files.py shows the message as it is.
REFUSED_VALUE = "vllm_sr_refused_value"


@dataclass(frozen=True)
class Problem:
    """One problem at one YAML path; files.py adds the line number."""

    path: tuple[str | int, ...]
    message: str

    def render_plain(self) -> str:
        return f"{format_path(self.path)}: {self.message}"


def format_path(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"
