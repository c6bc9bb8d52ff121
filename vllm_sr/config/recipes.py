"""The upstream v0.3 top level beside ``global``/``providers``/``routing``: ``listeners``,
``entrypoints`` and ``recipes`` (upstream ``pkg/config/canonical_recipes.go``), and recipe
selection.

A recipe is a named routing profile (``routing`` without ``modelCards``: the model catalog is
shared). The top-level ``routing`` is the recipe ``default``; a ``recipes[]`` entry may be named
``default`` only when the top-level routing has no profile of its own. A request's ``model``
picks the recipe: an auto alias (``global.router.auto_model_names``) picks ``default``, an
entrypoint's model name picks that entrypoint's recipe; any other name is a concrete model.
Both kinds of auto request are routed by the chosen recipe's decisions.

The rules here work on raw mappings like ``schema.semantic_problems``, so every problem of a
file is reported in one run, each at its YAML path.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pydantic import Field

from vllm_sr.config.problems import Problem
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_base import Strict, as_dict, as_list
from vllm_sr.jsontypes import JsonObject

DEFAULT_RECIPE = "default"
# Go durations as upstream's listeners write them: 300s, 1m30s, 500ms.
DURATION_RE = re.compile(r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")
PROFILE_KEYS = ("signals", "projections", "decisions")

Path = tuple[str | int, ...]


class Listener(Strict):
    name: str | None = Field(default=None, max_length=128)
    """The listener's name (metadata)."""

    address: str = Field(default="0.0.0.0", min_length=1, max_length=255)
    """Where ``vllm-sr serve`` listens (the first listener, unless --listen is given)."""

    port: int = Field(ge=1, le=65535)
    """The port ``vllm-sr serve`` listens on (the first listener)."""

    timeout: str | None = Field(default=None, pattern=DURATION_RE.pattern)
    """Upstream: Envoy's route timeout, a Go duration such as 300s. Accepted and shown;
    vllm-sr's own deadlines (the backend's) apply to chats."""

    api_keys: list[str] = Field(default_factory=list, max_length=256)
    """Upstream v0.4: keys of the listener's native API (/v1/systemone, /v1/decisions), which
    vllm-sr does not serve: refused when not empty."""


class Entrypoint(Strict):
    model_names: list[str] = Field(min_length=1, max_length=64)
    """Request ``model`` names that select ``recipe`` (new virtual names: not a provider model,
    a LoRA, an auto alias or a looper slug)."""

    recipe: str = Field(min_length=1, max_length=128)
    """The recipe these names select: a ``recipes[]`` name, or ``default`` (the top-level
    routing)."""


class Recipe(Strict):
    name: str = Field(min_length=1, max_length=128)
    """The recipe's name (unique; ``x-vsr-selected-recipe``)."""

    description: str | None = Field(default=None, max_length=2000)
    """Free text for people."""

    routing: Routing = Field(default_factory=Routing)
    """Signals, projections and decisions of this recipe (no modelCards; names are local to
    the recipe; ``strategy`` defaults to the top-level one)."""


def routing_has_profile(routing: object) -> bool:
    """True when a raw top-level ``routing`` declares signals, projections or decisions."""
    rt = as_dict(routing)
    return any(bool(rt.get(key)) for key in PROFILE_KEYS)


def recipe_problems(raw: JsonObject, auto_names: list[str], slugs: list[str]) -> list[Problem]:
    """Every rule of ``recipes`` and ``entrypoints`` on the raw file: names, the shared model
    catalog, entrypoint names that already mean something, and unknown recipes."""
    problems: list[Problem] = []
    names: list[str] = []
    for i, rec in enumerate(as_list(raw.get("recipes"))):
        rec = as_dict(rec)
        name = rec.get("name")
        path: Path = ("recipes", i, "name")
        if not isinstance(name, str):
            continue
        if name != name.strip():
            problems.append(
                Problem(path, f"{name!r} has surrounding whitespace; accepted: {name.strip()!r}")
            )
        if name in names:
            problems.append(
                Problem(path, f"recipe name {name!r} is used twice; accepted: a unique name")
            )
        names.append(name)
        if name == DEFAULT_RECIPE and routing_has_profile(raw.get("routing")):
            problems.append(
                Problem(
                    path,
                    "recipe 'default' conflicts with the top-level routing profile; accepted: "
                    "keep the default profile in routing, or move it entirely into recipes",
                )
            )
        if as_dict(rec.get("routing")).get("modelCards"):
            problems.append(
                Problem(
                    ("recipes", i, "routing", "modelCards"),
                    "the model catalog is shared; accepted: modelCards under the top-level "
                    "routing only",
                )
            )
    known = [DEFAULT_RECIPE, *[n for n in names if n != DEFAULT_RECIPE]]
    problems += _entrypoint_problems(raw, known, auto_names, slugs)
    return problems


def _taken_names(raw: JsonObject, auto_names: list[str], slugs: list[str]) -> dict[str, str]:
    """Names an entrypoint may not reuse, with what each already means."""
    taken: dict[str, str] = {}
    for name in slugs:
        taken[name] = "a looper slug (global.integrations.looper)"
    for name in auto_names:
        taken[name] = "an auto alias (global.router.auto_model_names)"
    for card in as_list(as_dict(raw.get("routing")).get("modelCards")):
        for lora in as_list(as_dict(card).get("loras")):
            if isinstance(lora_name := as_dict(lora).get("name"), str):
                taken[lora_name] = "a LoRA adapter (routing.modelCards[].loras)"
        if isinstance(card_name := as_dict(card).get("name"), str):
            taken[card_name] = "a configured model (routing.modelCards)"
    for model in as_list(as_dict(raw.get("providers")).get("models")):
        if isinstance(model_name := as_dict(model).get("name"), str):
            taken[model_name] = "a configured model (providers.models)"
    return taken


def _entrypoint_problems(
    raw: JsonObject, recipes: list[str], auto_names: list[str], slugs: list[str]
) -> list[Problem]:
    problems: list[Problem] = []
    taken = _taken_names(raw, auto_names, slugs)
    claimed: dict[str, int] = {}
    for i, entry in enumerate(as_list(raw.get("entrypoints"))):
        entry = as_dict(entry)
        recipe = entry.get("recipe")
        if isinstance(recipe, str) and recipe.strip() not in recipes:
            problems.append(
                Problem(
                    ("entrypoints", i, "recipe"),
                    f"{recipe!r} names no recipe; accepted: one of {', '.join(recipes)}",
                )
            )
        model_names = as_list(entry.get("model_names"))
        for j, name in enumerate(model_names):
            if not isinstance(name, str):
                continue
            path: Path = ("entrypoints", i, "model_names", j)
            name = name.strip()
            if not name:
                problems.append(Problem(path, "an empty model name; accepted: a non-empty name"))
            elif name in claimed:
                problems.append(
                    Problem(
                        path,
                        f"{name!r} is already mapped by entrypoints[{claimed[name]}]; "
                        "accepted: a name no other entrypoint uses",
                    )
                )
            elif name in taken:
                problems.append(
                    Problem(
                        path,
                        f"{name!r} is already {taken[name]}; accepted: a new virtual name "
                        "(entrypoint names must not hijack an existing one)",
                    )
                )
            claimed.setdefault(name, i)
    return problems


def recipe_routing_problems(
    raw: JsonObject, check: Callable[[JsonObject], list[Problem]]
) -> list[Problem]:
    """``check(routing_raw) -> list[Problem]`` (the top-level routing's rules, whose paths
    start with ``routing``) on each recipe's routing, re-rooted at ``recipes[i].routing``.
    Problems about ``providers`` are the top level's and are not repeated."""
    problems: list[Problem] = []
    for i, rec in enumerate(as_list(raw.get("recipes"))):
        routing = as_dict(rec).get("routing")
        if not isinstance(routing, dict):
            continue
        for p in check(routing):
            if p.path[:1] == ("routing",):
                problems.append(Problem(("recipes", i, *p.path), p.message))
    return problems


def normalized_names(names: list[str]) -> list[str]:
    """Trimmed, empty and repeated names dropped, order kept (upstream's normalisation)."""
    out: list[str] = []
    for name in names:
        trimmed = name.strip()
        if trimmed and trimmed not in out:
            out.append(trimmed)
    return out
