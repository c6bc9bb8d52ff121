"""Upstream's Router Learning rules (``validator_learning.go``) on raw mappings: the values of
``global.router.learning`` and of a decision's ``adaptations``.

A value upstream rejects is an error naming the field, the value and what is accepted (in
upstream's words). The effective-mode rules that read these values at request time live in
``vllm_sr/router/learning/settings.py``.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field

from vllm_sr.config.problems import Problem
from vllm_sr.config.routing_base import as_dict, not_accepted, problem
from vllm_sr.jsontypes import JsonObject

Path = tuple[str | int, ...]

SCOPES = ("conversation", "session")
MODES = ("apply", "observe", "bypass")
# Router Learning's candidate set, its one owner: the values, the default, the field's type
# (``global.router.learning.adaptation`` and a decision's ``adaptations.adaptation``) and how a
# written value is read (trimmed, as upstream).
CandidateSet = Literal["decision", "tier", "global"]
CANDIDATE_SETS: tuple[CandidateSet, ...] = get_args(CandidateSet)
DEFAULT_CANDIDATE_SET: CandidateSet = "decision"
CandidateSetField = Annotated[str, Field(max_length=32)]
"""A written candidate_set: the values are checked by ``learning_problems`` (upstream trims it
first, and a blank one counts as omitted)."""
STRATEGIES = ("routing_sampling",)
BACKENDS = ("local", "redis")
LEARNING: Path = ("global", "router", "learning")


def candidate_set_of(value: object) -> CandidateSet | None:
    """A written candidate_set, trimmed; None when omitted or blank (validation refuses any
    other value)."""
    text = value.strip() if isinstance(value, str) else ""
    return next((s for s in CANDIDATE_SETS if s == text), None)


def _quoted(values: tuple[str, ...]) -> str:
    return ", ".join(repr(v) for v in values)


def _one_of(path: Path, value: object, accepted: tuple[str, ...]) -> list[Problem]:
    """A problem when ``value`` is written and is not one of ``accepted`` (blank counts as
    omitted, as upstream trims it)."""
    if value is None or (isinstance(value, str) and value.strip() in ("", *accepted)):
        return []
    return [not_accepted(path, value, _quoted(accepted))]


def learning_problems(learning: object) -> list[Problem]:
    """Problems of ``global.router.learning`` (checked whether or not it is enabled, as
    upstream does)."""
    cfg = as_dict(learning)
    adaptation = as_dict(cfg.get("adaptation"))
    protection = as_dict(cfg.get("protection"))
    problems = _one_of(
        (*LEARNING, "adaptation", "candidate_set"), adaptation.get("candidate_set"), CANDIDATE_SETS
    )
    problems += _one_of(
        (*LEARNING, "adaptation", "strategy"), adaptation.get("strategy"), STRATEGIES
    )
    problems += _one_of((*LEARNING, "protection", "scope"), protection.get("scope"), SCOPES)
    headers = as_dict(as_dict(protection.get("identity")).get("headers"))
    for key in ("session", "conversation"):
        value = headers.get(key)
        if isinstance(value, str) and not value.strip():
            problems.append(
                problem(
                    (*LEARNING, "protection", "identity", "headers", key),
                    f"an empty header name; accepted: a header name (omitted: x-{key}-id)",
                )
            )
    return problems + _store_problems(as_dict(cfg.get("state_store")))


def _store_problems(store: JsonObject) -> list[Problem]:
    path: Path = (*LEARNING, "state_store", "backend")
    backend = store.get("backend")
    problems = _one_of(path, backend, BACKENDS)
    if problems or not isinstance(backend, str) or backend.strip() != "redis":
        return problems
    address = as_dict(store.get("redis")).get("address")
    if isinstance(address, str) and address.strip():
        return []
    return [
        problem(
            (*LEARNING, "state_store", "redis", "address"),
            f"{address!r} for the redis backend; accepted: host:port of the Redis server",
        )
    ]


def adaptations_problems(path: Path, adaptations: object) -> list[Problem]:
    """Problems of one decision's ``adaptations``: modes, upstream's boundary (a component may
    not be more active than the decision: nothing but bypass under bypass, no apply under
    observe) and the candidate set."""
    cfg = as_dict(adaptations)
    problems = _one_of((*path, "mode"), cfg.get("mode"), MODES)
    given = cfg.get("mode")
    mode = given if isinstance(given, str) and given.strip() else "apply"
    for part in ("adaptation", "protection"):
        comp = as_dict(cfg.get(part))
        comp_mode = comp.get("mode")
        here: Path = (*path, part, "mode")
        found = _one_of(here, comp_mode, MODES)
        problems += found
        if not found and isinstance(comp_mode, str) and comp_mode.strip():
            problems += _boundary(here, str(mode).strip(), comp_mode.strip())
    problems += _one_of(
        (*path, "adaptation", "candidate_set"),
        as_dict(cfg.get("adaptation")).get("candidate_set"),
        CANDIDATE_SETS,
    )
    return problems


def _boundary(path: Path, decision_mode: str, comp_mode: str) -> list[Problem]:
    if decision_mode == "bypass" and comp_mode != "bypass":
        return [
            problem(
                path,
                f"{comp_mode!r} under adaptations.mode 'bypass'; accepted: 'bypass' (or omitted)",
            )
        ]
    if decision_mode == "observe" and comp_mode == "apply":
        return [
            problem(
                path,
                "'apply' under adaptations.mode 'observe'; accepted: 'observe', 'bypass' "
                "(or omitted)",
            )
        ]
    return []
