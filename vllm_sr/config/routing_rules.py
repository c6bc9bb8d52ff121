"""Router mode's config rules on raw mappings (like ``schema.semantic_problems``): they
tolerate wrong types (the field validation reports those) and report each problem at its YAML
path, so one run shows every problem. :func:`check_routing` is the entry point;
:func:`routing_problems` runs it on a whole config mapping."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from vllm_sr.config.routing_providers import providers_problems

if TYPE_CHECKING:
    from vllm_sr.config.problems import Problem

MAX_RULE_DEPTH = 16
# YAML list key under routing.signals for each rule leaf type.
SIGNAL_LIST = {"keyword": "keywords", "embedding": "embeddings", "domain": "domains"}

Path = tuple[str | int, ...]


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _duplicates(items: list[Any], base: Path, what: str) -> list[Problem]:
    seen: dict[str, int] = {}
    problems = []
    for i, item in enumerate(items):
        name = _dict(item).get("name")
        if not isinstance(name, str):
            continue
        if name in seen:
            problems.append(
                _problem(
                    (*base, i, "name"),
                    f"{what} name {name!r} is also used by {format_index(base, seen[name])}; "
                    f"accepted: a name not used by another {what}",
                )
            )
        else:
            seen[name] = i
    return problems


def format_index(base: Path, i: int) -> str:
    return f"{base[-1]}[{i}]"


def routing_local_problems(routing: Any) -> list[Problem]:
    """Rules inside ``routing:`` alone: duplicate names, regex keywords that do not compile,
    domains with no example text, NOT with other than one condition, rule trees too deep."""
    rt = _dict(routing)
    signals = _dict(rt.get("signals"))
    problems: list[Problem] = []
    for kind in ("keywords", "embeddings", "domains"):
        items = _list(signals.get(kind))
        problems += _duplicates(items, ("routing", "signals", kind), kind[:-1] + " signal")
    for i, sig in enumerate(_list(signals.get("keywords"))):
        problems += _regex_problems(("routing", "signals", "keywords", i), _dict(sig))
    for i, sig in enumerate(_list(signals.get("domains"))):
        dom = _dict(sig)
        if not dom.get("description") and not dom.get("examples"):
            problems.append(
                _problem(
                    ("routing", "signals", "domains", i),
                    f"domain {dom.get('name')!r} has neither description nor examples; "
                    "accepted: a description and/or a list of example texts",
                )
            )
    decisions = _list(rt.get("decisions"))
    problems += _duplicates(decisions, ("routing", "decisions"), "decision")
    for i, dec in enumerate(decisions):
        problems += _tree_problems(("routing", "decisions", i, "rules"), _dict(dec).get("rules"), 1)
    return problems


def _regex_problems(path: Path, sig: dict[str, Any]) -> list[Problem]:
    if sig.get("method", "regex") != "regex":
        return []
    problems = []
    for j, kw in enumerate(_list(sig.get("keywords"))):
        if not isinstance(kw, str):
            continue
        try:
            re.compile(kw)
        except re.error as exc:
            problems.append(
                _problem(
                    (*path, "keywords", j),
                    f"{kw!r} is not a regular expression ({exc}); accepted: a Python regular "
                    r"expression (escape special characters, e.g. \( for a literal parenthesis)",
                )
            )
    return problems


def _tree_problems(path: Path, node: Any, depth: int) -> list[Problem]:
    node = _dict(node)
    if "operator" not in node:
        return []
    if depth > MAX_RULE_DEPTH:
        return [
            _problem(path, f"rules nest deeper than {MAX_RULE_DEPTH}; accepted: a flatter tree")
        ]
    conditions = _list(node.get("conditions"))
    problems = []
    if node.get("operator") == "NOT" and len(conditions) != 1:
        problems.append(
            _problem(
                (*path, "conditions"),
                f"NOT has {len(conditions)} conditions; accepted: exactly one (wrap several in "
                "an AND or OR)",
            )
        )
    for j, child in enumerate(conditions):
        problems += _tree_problems((*path, "conditions", j), child, depth + 1)
    return problems


def rule_leaves(node: Any, path: Path) -> list[tuple[Path, str, str]]:
    """Every {type, name} leaf of a raw rule tree with its YAML path."""
    node = _dict(node)
    if "operator" not in node:
        kind, name = node.get("type"), node.get("name")
        if isinstance(kind, str) and isinstance(name, str):
            return [(path, kind, name)]
        return []
    out = []
    for j, child in enumerate(_list(node.get("conditions"))):
        out += rule_leaves(child, (*path, "conditions", j))
    return out


def check_routing(
    providers: Any, routing: Any, deployments: set[str], decision_deployment: str
) -> list[Problem]:
    """Every Router-mode rule: the sections' own rules, plus a decision naming an unknown
    signal or model, and a signal on a deployment that does not exist. ``providers`` and
    ``routing`` are raw mappings or the models above (wrong types are tolerated: the field
    validation reports those)."""
    if hasattr(providers, "model_dump"):
        providers = providers.model_dump(by_alias=True, exclude_none=True)
    if hasattr(routing, "model_dump"):
        routing = routing.model_dump(by_alias=True, exclude_none=True)
    problems = providers_problems(providers) if providers is not None else []
    if routing is None:
        return problems
    problems += routing_local_problems(routing)
    rt = _dict(routing)
    signals = _dict(rt.get("signals"))
    known = {
        kind: {s["name"] for s in _list(signals.get(lst)) if isinstance(_dict(s).get("name"), str)}
        for kind, lst in SIGNAL_LIST.items()
    }
    model_names = [
        m["name"]
        for m in _list(_dict(providers).get("models"))
        if isinstance(_dict(m).get("name"), str)
    ]
    for i, dec in enumerate(_list(rt.get("decisions"))):
        dec = _dict(dec)
        for path, kind, name in rule_leaves(dec.get("rules"), ("routing", "decisions", i, "rules")):
            if kind in known and name not in known[kind]:
                names = ", ".join(sorted(known[kind])) or f"(no {SIGNAL_LIST[kind]} signals)"
                problems.append(
                    _problem(
                        (*path, "name"),
                        f"{kind} signal {name!r} is not declared under "
                        f"routing.signals.{SIGNAL_LIST[kind]}; accepted: one of {names}",
                    )
                )
        for k, ref in enumerate(_list(dec.get("modelRefs"))):
            model = _dict(ref).get("model")
            if isinstance(model, str) and model not in model_names:
                problems.append(
                    _problem(
                        ("routing", "decisions", i, "modelRefs", k, "model"),
                        f"{model!r} names no model; accepted: one of "
                        f"{', '.join(model_names) or '(no providers.models)'}",
                    )
                )
    problems += _deployment_problems(signals, deployments, decision_deployment)
    return problems


def _deployment_problems(
    signals: dict[str, Any], deployments: set[str], decision_deployment: str
) -> list[Problem]:
    problems = []
    accepted = ", ".join(sorted(deployments)) or "(none declared)"
    for kind in ("embeddings", "domains"):
        for i, sig in enumerate(_list(signals.get(kind))):
            dep = _dict(sig).get("deployment")
            if isinstance(dep, str) and dep not in deployments:
                problems.append(
                    _problem(
                        ("routing", "signals", kind, i, "deployment"),
                        f"{dep!r} names no deployment; accepted: one of {accepted}",
                    )
                )
            elif dep is None and decision_deployment not in deployments and deployments:
                problems.append(
                    _problem(
                        ("routing", "signals", kind, i),
                        f"the decision model's deployment {decision_deployment!r} does not "
                        f"exist; accepted: set deployment: to one of {accepted}",
                    )
                )
    return problems


def routing_problems(raw: Any) -> list[Problem]:
    """:func:`check_routing` on a whole raw config mapping (for ``schema.semantic_problems``),
    plus auto model names that collide with a provider model's name."""
    if not isinstance(raw, dict) or ("routing" not in raw and "providers" not in raw):
        return []
    glob = _dict(raw.get("global"))
    catalog = _dict(glob.get("model_catalog"))
    deployments = {str(name) for name in _dict(catalog.get("deployments"))}
    dm = _dict(_dict(catalog.get("system")).get("decision_model")).get("deployment")
    # The decision model's deployment, else the first declared one (as RootConfig says).
    decision = dm if isinstance(dm, str) else next(iter(_dict(catalog.get("deployments"))), "")
    problems = check_routing(raw.get("providers"), raw.get("routing"), deployments, decision)
    if raw.get("routing") is not None and raw.get("providers") is None:
        problems.append(
            _problem(
                ("routing",),
                "routing without providers; accepted: a providers section with defaults and "
                "models (the LLMs decisions route to)",
            )
        )
    auto = _list(_dict(glob.get("router")).get("auto_model_names"))
    model_names = {
        m.get("name")
        for m in _list(_dict(raw.get("providers")).get("models"))
        if isinstance(m, dict)
    }
    for i, name in enumerate(auto):
        if name in model_names:
            problems.append(
                _problem(
                    ("global", "router", "auto_model_names", i),
                    f"{name!r} is also a providers model name; accepted: a name no model uses",
                )
            )
    return problems


def _problem(path: Path, message: str) -> Problem:
    from vllm_sr.config.problems import Problem

    return Problem(path, message)
