"""The value checks the selectors' raw-block rules share (:mod:`vllm_sr.config.routing_selection`,
:mod:`vllm_sr.config.selection_multi_factor`, :mod:`vllm_sr.config.selection_prompt`), in their
one wording: the path, the value, then what is accepted (upstream's
``pkg/config/validator_decision.go`` checks these fields)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_sr.config.routing_base import is_int, is_number, problem

if TYPE_CHECKING:
    from vllm_sr.config.problems import Problem
    from vllm_sr.config.routing_base import Path
    from vllm_sr.jsontypes import JsonObject


def unknown_keys(path: Path, block: JsonObject, accepted: tuple[str, ...]) -> list[Problem]:
    """A problem at each key of ``block`` not in ``accepted``."""
    return [
        problem(
            (*path, key),
            f"unknown key {key!r} (value {block[key]!r}); accepted: {', '.join(accepted)}",
        )
        for key in block
        if key not in accepted
    ]


def percentile_problems(path: Path, value: object, allow_zero: str) -> list[Problem]:
    """A percentile set to something other than an integer from 0 to 100."""
    if value is None or (is_int(value) and 0 <= value <= 100):
        return []
    return [
        problem(path, f"{value!r}; accepted: an integer from 1 to 100 ({allow_zero})"),
    ]


def non_negative_problems(
    path: Path, value: object, what: str, integer: bool = False
) -> list[Problem]:
    """A value set to something other than a finite number (an integer with ``integer``)
    >= 0."""
    ok = is_int(value) if integer else is_number(value)
    if value is None or (ok and isinstance(value, (int, float)) and value >= 0):
        return []
    kind = "an integer" if integer else "a finite number"
    return [problem(path, f"{value!r}; accepted: {kind} >= 0 ({what})")]
