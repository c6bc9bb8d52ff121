"""What Router mode's config modules share: the strict pydantic base, the raw-mapping helpers
the rules use (they tolerate wrong types: the field validation reports those), the raw value
tests (:func:`is_int`, :func:`is_number`), and the one wording of a value not accepted
(:func:`not_accepted`) and of a refusal.

A refusal is how vllm-sr says "upstream has this and it would change routing or the request,
but vllm-sr does not act on it": a :class:`~vllm_sr.config.problems.Problem` at the field's
YAML path whose message contains :data:`NOT_SUPPORTED` and names what is supported in its
place. Refusals are collected with every other problem, so one ``config validate`` run lists
them all."""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, TypeGuard

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo
from pydantic_core import PydanticCustomError

from vllm_sr.jsontypes import JsonObject

if TYPE_CHECKING:
    from vllm_sr.config.problems import Problem

NOT_SUPPORTED = "not supported by vllm-sr"

Path = tuple[str | int, ...]

BackendSettings = JsonObject
"""Connection settings of an upstream backend vllm-sr never connects to (kept as written)."""

Description = Field(default=None, max_length=4000)
"""The optional free-text ``description`` most routing entries carry."""


class Strict(BaseModel):
    """Unknown keys are errors; field docstrings are the fields' descriptions; aliased fields
    (``modelRefs``) also accept their Python names."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, populate_by_name=True)


RULES_RUN_BY_CALLER = "vllm_sr.config.rules_run_by_caller"
"""Validation context key: the caller (``files.collect_problems``, the one loader) runs every
rule on the raw mapping itself, each once, so the models' own runs of them are skipped."""


def rules_run_by_caller(info: ValidationInfo[object]) -> bool:
    """Whether this validation's caller runs the rules itself (see RULES_RUN_BY_CALLER)."""
    return bool(as_dict(info.context).get(RULES_RUN_BY_CALLER))


def raise_first(problems: list[Problem]) -> None:
    """Raise a section's rule problems from a model validator as SEMANTIC_ERROR: files.py
    skips those and reports the same problems, with exact paths, through the raw rules."""
    from vllm_sr.config.problems import SEMANTIC_ERROR

    if problems:
        raise PydanticCustomError(SEMANTIC_ERROR, "; ".join(p.render_plain() for p in problems))


def as_list(value: object) -> list[object]:
    """``value`` when it is a list, else an empty one."""
    return value if isinstance(value, list) else []


def as_dict(value: object) -> JsonObject:
    """``value`` itself when it is a mapping (a YAML mapping's keys are strings), else an
    empty one."""
    return value if isinstance(value, dict) else {}


def is_int(value: object) -> TypeGuard[int]:
    """A JSON integer (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    """A finite JSON number (a bool is not one; nor an integer past a float's range, which
    no setting can mean and ``float()`` cannot take)."""
    if is_int(value):
        return abs(value) <= sys.float_info.max
    return isinstance(value, float) and math.isfinite(value)


def problem(path: Path, message: str) -> Problem:
    from vllm_sr.config.problems import Problem

    return Problem(path, message)


def not_accepted(path: Path, value: object, accepted: str) -> Problem:
    """``VALUE is not accepted; accepted: ACCEPTED`` at ``path``."""
    return problem(path, f"{value!r} is not accepted; accepted: {accepted}")


def refusal(path: Path, what: str, supported: str) -> Problem:
    """``WHAT is not supported by vllm-sr; supported: SUPPORTED`` at ``path``."""
    return problem(path, f"{what} is {NOT_SUPPORTED}; supported: {supported}")


def duplicates(items: list[object], base: Path, what: str, key: str = "name") -> list[Problem]:
    """A problem at each item whose ``key`` repeats an earlier item's."""
    seen: dict[str, int] = {}
    problems = []
    for i, item in enumerate(items):
        name = as_dict(item).get(key)
        if not isinstance(name, str):
            continue
        if name in seen:
            problems.append(
                problem(
                    (*base, i, key),
                    f"{what} {key} {name!r} is also used by {base[-1]}[{seen[name]}]; "
                    f"accepted: a {key} not used by another {what}",
                )
            )
        else:
            seen[name] = i
    return problems
