"""Router mode's config rules on raw mappings (like ``schema.semantic_problems``): they
tolerate wrong types (the field validation reports those) and report each problem at its YAML
path, so one run shows every problem. :func:`check_routing` is the entry point;
:func:`routing_problems` runs it on a whole config mapping. The refusals of what vllm-sr does
not act on live in ``routing_support`` and run from here."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pydantic import BaseModel

from vllm_sr.config.routing_base import Path, as_dict, as_list, duplicates, problem
from vllm_sr.config.routing_kbs import kb_problems
from vllm_sr.config.routing_looper import unbound_refusals
from vllm_sr.config.routing_plugins import shadow_model_problems
from vllm_sr.config.routing_provider_rules import providers_problems
from vllm_sr.config.routing_support import looper_endpoint_of, looper_problems, support_problems
from vllm_sr.config.selection_prompt import prompt_problems
from vllm_sr.config.signal_classifiers import (
    BINDING_PREFIX,
    bound_deployment,
    classifier_problems,
)
from vllm_sr.config.signal_registry import (
    BY_CONFIG_KEY,
    DEPLOYMENT_LISTS,
    LEAF_NAME_LISTS,
    REFUSED_SIGNAL_LISTS,
    SUPPORTED_SIGNAL_LISTS,
    SignalFamily,
    UnsetDeployment,
    entry_asks_deployment,
)
from vllm_sr.config.signal_safety import safety_problems, system_problems
from vllm_sr.jsontypes import JsonObject

if TYPE_CHECKING:
    from vllm_sr.config.problems import Problem

MAX_RULE_DEPTH = 16


def format_index(base: Path, i: int) -> str:
    return f"{base[-1]}[{i}]"


def routing_local_problems(routing: object) -> list[Problem]:
    """Rules inside ``routing:`` alone: duplicate names, regex keywords that do not compile,
    domains with no example text, NOT with other than one condition, rule trees too deep, and
    the refusals (``routing_support``)."""
    rt = as_dict(routing)
    signals = as_dict(rt.get("signals"))
    problems: list[Problem] = []
    for kind in (*SUPPORTED_SIGNAL_LISTS, *REFUSED_SIGNAL_LISTS):
        items = as_list(signals.get(kind))
        problems += duplicates(items, ("routing", "signals", kind), f"{kind} signal")
    for i, sig in enumerate(as_list(signals.get("keywords"))):
        problems += _regex_problems(("routing", "signals", "keywords", i), as_dict(sig))
    for i, sig in enumerate(as_list(signals.get("domains"))):
        dom = as_dict(sig)
        if (
            not dom.get("description")
            and not dom.get("examples")
            and not dom.get("mmlu_categories")
            and dom.get("method") != "classifier"  # a head's label named like it needs none
        ):
            problems.append(
                problem(
                    ("routing", "signals", "domains", i),
                    f"domain {dom.get('name')!r} has no description, mmlu_categories or "
                    "examples; accepted: a description and/or a list of example texts",
                )
            )
    problems += duplicates(as_list(rt.get("modelCards")), ("routing", "modelCards"), "model card")
    decisions = as_list(rt.get("decisions"))
    problems += duplicates(decisions, ("routing", "decisions"), "decision")
    for i, dec in enumerate(decisions):
        problems += _tree_problems(
            ("routing", "decisions", i, "rules"), as_dict(dec).get("rules"), 1
        )
    for i, sig in enumerate(as_list(signals.get("complexity"))):
        composer = as_dict(sig).get("composer")
        problems += _tree_problems(("routing", "signals", "complexity", i, "composer"), composer, 1)
    return problems + support_problems(rt)


def _regex_problems(path: Path, sig: JsonObject) -> list[Problem]:
    if sig.get("method") != "regex":
        return []
    problems = []
    for j, kw in enumerate(as_list(sig.get("keywords"))):
        if not isinstance(kw, str):
            continue
        try:
            re.compile(kw)
        except re.error as exc:
            problems.append(
                problem(
                    (*path, "keywords", j),
                    f"{kw!r} is not a regular expression ({exc}); accepted: a Python regular "
                    r"expression (escape special characters, e.g. \( for a literal parenthesis)",
                )
            )
    return problems


def _tree_problems(path: Path, node: object, depth: int) -> list[Problem]:
    node = as_dict(node)
    if depth > 1 and node.get("on_unknown") is not None:
        return [
            problem(
                (*path, "on_unknown"),
                f"on_unknown {node['on_unknown']!r} on a nested condition; accepted: on_unknown "
                "only on the root rules node (as upstream)",
            )
        ]
    if "operator" not in node:
        return []
    if depth > MAX_RULE_DEPTH:
        return [problem(path, f"rules nest deeper than {MAX_RULE_DEPTH}; accepted: a flatter tree")]
    conditions = as_list(node.get("conditions"))
    problems = []
    if node.get("operator") == "NOT" and len(conditions) != 1:
        problems.append(
            problem(
                (*path, "conditions"),
                f"NOT has {len(conditions)} conditions; accepted: exactly one (wrap several in "
                "an AND or OR)",
            )
        )
    for j, child in enumerate(conditions):
        problems += _tree_problems((*path, "conditions", j), child, depth + 1)
    return problems


def rule_leaves(node: object, path: Path) -> list[tuple[Path, str, str]]:
    """Every {type, name} leaf of a raw rule tree with its YAML path (type lowercased)."""
    node = as_dict(node)
    if "operator" not in node:
        kind, name = node.get("type"), node.get("name")
        if isinstance(kind, str) and isinstance(name, str):
            return [(path, kind.strip().lower(), name)]
        return []
    out = []
    for j, child in enumerate(as_list(node.get("conditions"))):
        out += rule_leaves(child, (*path, "conditions", j))
    return out


def check_routing(
    providers: object,
    routing: object,
    deployments: set[str],
    decision_deployment: str,
    system: object = None,
) -> list[Problem]:
    """Every Router-mode rule: the sections' own rules, plus a decision naming an unknown
    signal, model or LoRA, a provider model that is not a model card (when cards are
    declared), and a signal on a deployment that does not exist. ``providers`` and ``routing``
    are raw mappings or the models above (wrong types are tolerated: the field validation
    reports those). ``system``: the raw ``global.model_catalog.system`` (safety's default
    heads)."""
    if isinstance(providers, BaseModel):
        providers = providers.model_dump(by_alias=True, exclude_none=True)
    if isinstance(routing, BaseModel):
        routing = routing.model_dump(by_alias=True, exclude_none=True)
    problems = providers_problems(providers) if providers is not None else []
    if routing is None:
        return problems
    return problems + routing_against(providers, routing, deployments, decision_deployment, system)


def routing_against(
    providers: object,
    routing: object,
    deployments: set[str],
    decision_deployment: str,
    system: object = None,
) -> list[Problem]:
    """:func:`check_routing` less ``providers``' own rules (a recipe's routing checked
    against the top level's providers, whose rules run once for the file); raw mappings."""
    problems = routing_local_problems(routing)
    rt = as_dict(routing)
    signals = as_dict(rt.get("signals"))
    model_names = [
        name
        for m in as_list(as_dict(providers).get("models"))
        if isinstance(name := as_dict(m).get("name"), str)
    ]
    cards = {
        name: c
        for c in as_list(rt.get("modelCards"))
        if isinstance(name := as_dict(c).get("name"), str)
    }
    problems += _card_problems(cards, as_list(as_dict(providers).get("models")))
    for i, dec in enumerate(as_list(rt.get("decisions"))):
        dec = as_dict(dec)
        problems += _leaf_name_problems(signals, dec, ("routing", "decisions", i, "rules"))
        for k, ref in enumerate(as_list(dec.get("modelRefs"))):
            problems += _model_ref_problems(
                ("routing", "decisions", i, "modelRefs", k), as_dict(ref), model_names, cards
            )
        problems += shadow_model_problems(("routing", "decisions", i), dec, model_names)
    problems += _deployment_problems(rt, deployments, decision_deployment, system)
    problems += safety_problems(routing, ("routing",), deployments, system)
    problems += classifier_problems(routing, ("routing",), deployments)
    return problems


def _leaf_name_problems(signals: JsonObject, dec: JsonObject, path: Path) -> list[Problem]:
    problems = []
    for leaf_path, kind, name in rule_leaves(dec.get("rules"), path):
        if kind not in LEAF_NAME_LISTS:
            continue  # refused by routing_support, or names a label
        lst, key = LEAF_NAME_LISTS[kind]
        known = {n for s in as_list(signals.get(lst)) if isinstance(n := as_dict(s).get(key), str)}
        if name not in known:
            names = ", ".join(sorted(known)) or f"(no {lst} signals)"
            what = key if key != "name" else f"{kind} signal"  # authz: "role"
            problems.append(
                problem(
                    (*leaf_path, "name"),
                    f"{what} {name!r} is not declared under routing.signals.{lst}; "
                    f"accepted: one of {names}",
                )
            )
    return problems


def _model_ref_problems(
    path: Path, ref: JsonObject, model_names: list[str], cards: JsonObject
) -> list[Problem]:
    problems = []
    model = ref.get("model")
    if isinstance(model, str) and model not in model_names:
        problems.append(
            problem(
                (*path, "model"),
                f"{model!r} names no model; accepted: one of "
                f"{', '.join(model_names) or '(no providers.models)'}",
            )
        )
    lora = ref.get("lora_name")
    if isinstance(lora, str) and isinstance(model, str):
        loras = [
            la.get("name")
            for la in as_list(as_dict(cards.get(model)).get("loras"))
            if isinstance(la, dict)
        ]
        if lora not in loras:
            problems.append(
                problem(
                    (*path, "lora_name"),
                    f"{lora!r} is not a LoRA of model card {model!r}; accepted: one of "
                    f"{', '.join(map(str, loras)) or '(no routing.modelCards[].loras for it)'}",
                )
            )
    return problems


def _card_problems(cards: JsonObject, models: list[object]) -> list[Problem]:
    if not cards:
        return []
    problems = []
    for i, model in enumerate(models):
        name = as_dict(model).get("name")
        if isinstance(name, str) and name not in cards:
            problems.append(
                problem(
                    ("providers", "models", i, "name"),
                    f"{name!r} is not a routing.modelCards name; accepted: one of "
                    f"{', '.join(cards)} (upstream binds each provider model to a card)",
                )
            )
    return problems


def _deployment_problems(
    routing: JsonObject, deployments: set[str], decision_deployment: str, system: object
) -> list[Problem]:
    """An entry's ``deployment:`` must be declared, and an entry naming none asks what its row's
    ``unset_deployment`` says: the decision model's deployment must then exist."""
    signals = as_dict(routing.get("signals"))
    problems = []
    accepted = ", ".join(sorted(deployments)) or "(none declared)"
    for kind in DEPLOYMENT_LISTS:
        row = BY_CONFIG_KEY[kind]
        for i, sig in enumerate(as_list(signals.get(kind))):
            dep = as_dict(sig).get("deployment")
            if isinstance(dep, str) and dep not in deployments:
                problems.append(
                    problem(
                        ("routing", "signals", kind, i, "deployment"),
                        f"{dep!r} names no deployment; accepted: one of {accepted}",
                    )
                )
            elif (
                dep is None
                and entry_asks_deployment(row, dep)
                and decision_deployment not in deployments
                and deployments
                and _unset_deployment(row, as_dict(sig), routing, deployments, system) is None
            ):
                problems.append(
                    problem(
                        ("routing", "signals", kind, i),
                        f"the decision model's deployment {decision_deployment!r} does not "
                        f"exist; accepted: set deployment: to one of {accepted}"
                        + _UNSET_ALTERNATIVE[row.unset_deployment].format(
                            name=as_dict(sig).get("name")
                        ),
                    )
                )
    return problems


_UNSET_ALTERNATIVE: dict[UnsetDeployment, str] = {
    "decision_model": "",
    "system_safety": ", or global.model_catalog.system.safety",
    "model_binding": f", or routing.model_bindings['{BINDING_PREFIX}{{name}}'].deployment",
}


def _unset_deployment(
    row: SignalFamily, entry: JsonObject, routing: JsonObject, deployments: set[str], system: object
) -> str | None:
    """The deployment an entry naming none asks instead of the decision model's (None: the
    decision model's), as its row's ``unset_deployment`` says."""
    if row.unset_deployment == "system_safety":
        head = as_dict(system).get("safety")
        return head if isinstance(head, str) else None  # (system_problems checks the name)
    name = entry.get("name")
    if row.unset_deployment == "model_binding" and isinstance(name, str):
        return bound_deployment(routing, name, deployments)
    return None


def routing_problems(raw: object) -> list[Problem]:
    """:func:`check_routing` on a whole raw config mapping (for ``schema.semantic_problems``),
    plus auto model names that collide with a provider model's name, and looper decisions
    (top level and recipes) that upstream would run given ``global.integrations.looper``."""
    if not isinstance(raw, dict) or ("routing" not in raw and "providers" not in raw):
        return []
    glob = as_dict(raw.get("global"))
    catalog = as_dict(glob.get("model_catalog"))
    deployments = {str(name) for name in as_dict(catalog.get("deployments"))}
    dm = as_dict(as_dict(catalog.get("system")).get("decision_model")).get("deployment")
    # The decision model's deployment, else the first declared one (as RootConfig says).
    decision = dm if isinstance(dm, str) else next(iter(as_dict(catalog.get("deployments"))), "")
    problems = check_routing(
        raw.get("providers"), raw.get("routing"), deployments, decision, catalog.get("system")
    )
    if raw.get("routing") is not None and raw.get("providers") is None:
        problems.append(
            problem(
                ("routing",),
                "routing without providers; accepted: a providers section with defaults and "
                "models (the LLMs decisions route to)",
            )
        )
    endpoint = looper_endpoint_of(raw.get("global"))
    problems += looper_problems(raw.get("routing"), endpoint)
    problems += unbound_refusals(raw.get("routing"), endpoint)
    problems += prompt_problems(raw.get("routing"), raw.get("providers"), endpoint)
    problems += kb_problems(raw.get("routing"), catalog)
    system = catalog.get("system")
    problems += system_problems(system, deployments)
    for i, rec in enumerate(as_list(raw.get("recipes"))):
        problems += looper_problems(
            as_dict(rec).get("routing"), endpoint, ("recipes", i, "routing")
        )
        problems += unbound_refusals(
            as_dict(rec).get("routing"), endpoint, ("recipes", i, "routing")
        )
        problems += prompt_problems(
            as_dict(rec).get("routing"), raw.get("providers"), endpoint, ("recipes", i, "routing")
        )
        problems += kb_problems(as_dict(rec).get("routing"), catalog, ("recipes", i, "routing"))
    auto = as_list(as_dict(glob.get("router")).get("auto_model_names"))
    model_names = {
        m.get("name")
        for m in as_list(as_dict(raw.get("providers")).get("models"))
        if isinstance(m, dict)
    }
    for i, name in enumerate(auto):
        if name in model_names:
            problems.append(
                problem(
                    ("global", "router", "auto_model_names", i),
                    f"{name!r} is also a providers model name; accepted: a name no model uses",
                )
            )
    return problems
