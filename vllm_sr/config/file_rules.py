"""The cross-field rules of a whole config file, on the raw mapping (they tolerate wrong
types: field validation reports those), so that one run reports every problem, each at its YAML
path: the product page's deployment rules ("What replicas share"), Router mode's routing rules
(``routing_rules``), the recipes' and entrypoints' (``recipes``), and the refusals of upstream
``global`` settings vllm-sr does not act on (``upstream_refusals``).

``schema.semantic_problems`` (what ``RootConfig`` and files.py call) delegates here; this
module imports the schema's models and constants, so it is imported lazily from there.
"""

from __future__ import annotations

from vllm_sr.config.deployment import (
    DEFAULT_BASE_EJECTION_MS,
    DEVICE_RE,
    NAME_ACCEPTED,
    NAME_RE,
    device_platform,
    ejection_bounds_problem,
)
from vllm_sr.config.deployment_needs import deployment_needs, router_mode
from vllm_sr.config.problems import Problem
from vllm_sr.config.recipes import normalized_names, recipe_problems, recipe_routing_problems
from vllm_sr.config.routing import DEFAULT_AUTO_MODEL_NAMES
from vllm_sr.config.routing_base import as_dict, as_list
from vllm_sr.config.routing_rules import routing_against, routing_problems
from vllm_sr.config.schema import (
    DEFAULT_AUTO_MODEL_NAME,
    DEFAULT_DEPLOYMENT,
    embedded_default_deployments,
)
from vllm_sr.config.upstream_refusals import global_refusals
from vllm_sr.jsontypes import JsonObject


def _deployment_problems(name: str, dep: JsonObject) -> list[Problem]:
    base: tuple[str | int, ...] = ("global", "model_catalog", "deployments", name)
    problems: list[Problem] = []
    if not NAME_RE.match(name):
        problems.append(
            Problem(base, f"deployment name {name!r} is not accepted; accepted: {NAME_ACCEPTED}")
        )
    replicas = dep.get("replicas")
    for key in ("device", "endpoint"):
        if replicas is not None and dep.get(key) is not None:
            problems.append(
                Problem(
                    (*base, key),
                    f"{key} {dep.get(key)!r} is set together with replicas; accepted: either "
                    f"replicas or the one-worker shorthand {key}, not both (move it into replicas)",
                )
            )
    if dep.get("device") is not None and dep.get("endpoint") is not None:
        problems.append(
            Problem((*base, "endpoint"), "device and endpoint are both set; accepted: one of them")
        )
    if dep.get("model") is not None and dep.get("endpoint") is None:
        problems.append(
            Problem(
                (*base, "model"),
                f"model {dep.get('model')!r} without endpoint; accepted: model only names an "
                "attached runtime's served model (set endpoint, or remove model)",
            )
        )
    if dep.get("endpoint") is not None and not dep.get("model"):
        problems.append(
            Problem((*base, "model"), "endpoint shorthand without model; accepted: model: NAME")
        )
    problems += _replica_problems(base, replicas)
    problems += _outlier_problems(base, dep.get("outlier_detection"))
    problems += _threads_problems(base, dep)
    return problems


def _public_name_problems(deployments: JsonObject) -> list[Problem]:
    """A public_name is one more name for one deployment: it may not be another deployment's
    name nor another deployment's public_name."""
    problems: list[Problem] = []
    owner: dict[str, str] = {}
    for name, dep in deployments.items():
        public = dep.get("public_name") if isinstance(dep, dict) else None
        if not isinstance(public, str):
            continue
        where = ("global", "model_catalog", "deployments", str(name), "public_name")
        if public in deployments and public != name:
            problems.append(
                Problem(
                    where,
                    f"public_name {public!r} is the name of deployment {public!r}; accepted: a "
                    "name no other deployment uses",
                )
            )
        elif public in owner:
            problems.append(
                Problem(
                    where,
                    f"public_name {public!r} is also deployment {owner[public]!r}'s "
                    "public_name; accepted: one deployment per public_name",
                )
            )
        owner.setdefault(public, str(name))
    return problems


def _threads_problems(base: tuple[str | int, ...], dep: JsonObject) -> list[Problem]:
    """``threads`` sizes vllm-sr's own CPU workers; a GPU worker or an attached runtime has
    nothing it could apply to, so it is refused rather than silently ignored."""
    threads = dep.get("threads")
    if threads is None:
        return []
    replicas = dep.get("replicas")
    if isinstance(replicas, list):
        devices = [r.get("device") for r in replicas if isinstance(r, dict)]
    elif dep.get("endpoint") is not None:
        devices = [None]
    else:
        devices = [dep.get("device") or "cpu"]
    # auto may resolve to cpu, where threads applies; the planner ignores it on a GPU.
    gpu = next((d for d in devices if isinstance(d, str) and d not in ("cpu", "auto")), None)
    if gpu is not None:
        return [
            Problem(
                (*base, "threads"),
                f"threads {threads!r} applies to CPU workers, but this deployment runs on "
                f"{device_platform(gpu)} GPUs ({gpu}); accepted: remove threads, or place the "
                "deployment on cpu",
            )
        ]
    if "cpu" not in devices and "auto" not in devices:
        return [
            Problem(
                (*base, "threads"),
                f"threads {threads!r} on a deployment whose replicas are all attached "
                "(endpoint): attached runtimes manage their own threads; accepted: remove threads",
            )
        ]
    return []


def _outlier_problems(base: tuple[str | int, ...], od: object) -> list[Problem]:
    if not isinstance(od, dict):
        return []
    top, low = od.get("max_ejection_ms"), od.get("base_ejection_ms", DEFAULT_BASE_EJECTION_MS)
    if isinstance(top, int) and isinstance(low, int):
        problem = ejection_bounds_problem(low, top)
        if problem is not None:
            return [Problem((*base, "outlier_detection", "max_ejection_ms"), problem)]
    return []


def _replica_problems(base: tuple[str | int, ...], replicas: object) -> list[Problem]:
    if not isinstance(replicas, list):
        return []
    problems: list[Problem] = []
    platforms: dict[str, int] = {}
    for i, rep in enumerate(replicas):
        if not isinstance(rep, dict):
            continue
        path = (*base, "replicas", i)
        dev, ep, model = rep.get("device"), rep.get("endpoint"), rep.get("model")
        if dev is None and ep is None:
            problems.append(
                Problem(
                    path,
                    "replica has neither device nor endpoint; accepted: {device: "
                    "DEVICE} or {endpoint: URL, model: NAME}",
                )
            )
        if dev is not None and ep is not None:
            problems.append(
                Problem(path, "replica sets both device and endpoint; accepted: one of them")
            )
        if ep is not None and not model:
            problems.append(
                Problem(
                    (*path, "model"),
                    f"attached replica {ep!r} has no model; accepted: the "
                    "runtime's served model name, e.g. model: primary",
                )
            )
        if model is not None and ep is None:
            problems.append(
                Problem(
                    (*path, "model"),
                    f"model {model!r} on a managed replica; accepted: model only with endpoint",
                )
            )
        if isinstance(dev, str) and DEVICE_RE.match(dev):
            platforms.setdefault(device_platform(dev), i)
    if len(platforms) > 1:
        first, *rest = sorted(platforms.items(), key=lambda kv: kv[1])
        for plat, idx in rest:
            problems.append(
                Problem(
                    (*base, "replicas", idx, "device"),
                    f"platform {plat!r} differs from {first[0]!r} of replicas[{first[1]}]; "
                    "accepted: one platform per deployment (split it into two deployments)",
                )
            )
    return problems


def semantic_problems(raw: object) -> list[Problem]:
    """The product page's cross-field rules, Router mode's, the recipes' and the refusals of
    upstream settings vllm-sr does not act on, on the raw mapping (tolerates wrong types:
    those are reported by the field validation)."""
    if not isinstance(raw, dict):
        return []
    if not any(key in raw for key in ("global", "routing", "providers", "recipes")):
        return [
            Problem(
                (),
                "the file has none of global, routing, providers or recipes; accepted: a "
                "mapping with at least global (deployments) or routing (Router mode)",
            )
        ]
    catalog = as_dict(as_dict(raw.get("global")).get("model_catalog"))
    deployments = catalog.get("deployments")
    problems: list[Problem] = []
    names: list[str] = []
    if isinstance(deployments, dict):
        for name, dep in deployments.items():
            names.append(str(name))
            if isinstance(dep, dict):
                problems += _deployment_problems(str(name), dep)
        problems += _public_name_problems(deployments)
    elif deployments is None:
        names = [DEFAULT_DEPLOYMENT]
    system = catalog.get("system")
    dm = system.get("decision_model") if isinstance(system, dict) else None
    target = dm.get("deployment") if isinstance(dm, dict) else None
    if isinstance(target, str) and names and target not in names:
        shown = ", ".join(names)
        if deployments is None:
            shown += " (the embedded default: no deployments are declared)"
        problems.append(
            Problem(
                ("global", "model_catalog", "system", "decision_model", "deployment"),
                f"{target!r} names no deployment; accepted: one of {shown}",
            )
        )
    full = _with_default_deployments(raw) if deployments is None else raw
    problems += routing_problems(full)
    problems += _recipe_problems(full)
    if deployments == {}:
        problems += _no_deployment_problems(raw, target, problems)
    return problems + global_refusals(raw)


def _no_deployment_problems(
    raw: JsonObject, decision_model: object, found: list[Problem]
) -> list[Problem]:
    """``deployments: {}`` runs no worker: accepted in Router mode when nothing in the routing
    asks a deployment (``deployment_needs``); else each thing that does is named."""
    where = ("global", "model_catalog", "deployments")
    accepted = (
        "accepted: a deployment under global.model_catalog.deployments, or no deployments key "
        "(the embedded default, vllm-sr/d3-edge on one CPU worker, answers it)"
    )
    if not router_mode(raw):
        return [
            Problem(
                where,
                "an empty mapping, and without Router mode (providers, and global.router."
                "enabled not false) nothing would be served; accepted: at least one deployment, "
                "or no deployments key (the embedded default)",
            )
        ]
    problems = []
    if isinstance(decision_model, str):
        problems.append(
            Problem(
                ("global", "model_catalog", "system", "decision_model", "deployment"),
                f"{decision_model!r} names no deployment: global.model_catalog.deployments is "
                "empty; accepted: that deployment declared there, or no decision_model (a "
                "routing that needs no model runs with no deployment)",
            )
        )
    for need in deployment_needs(raw):
        if any(p.path[: len(need.path)] == need.path for p in found):
            continue  # already said: it names a deployment that does not exist
        problems.append(
            Problem(
                need.path,
                f"{need.what} needs a deployment to answer it, and global.model_catalog."
                f"deployments is empty; {accepted}",
            )
        )
    return problems


def _with_default_deployments(raw: JsonObject) -> JsonObject:
    """``raw`` with the embedded default's deployment declared (the routing rules check
    signals' deployments against what will run)."""
    glob = dict(as_dict(raw.get("global")))
    catalog = dict(as_dict(glob.get("model_catalog")))
    catalog["deployments"] = {
        name: dep.model_dump(exclude_none=True)
        for name, dep in embedded_default_deployments().items()
    }
    glob["model_catalog"] = catalog
    return {**raw, "global": glob}


def _raw_auto_names(router: JsonObject) -> list[str]:
    names = router.get("auto_model_names")
    if isinstance(names, list):
        return normalized_names([n for n in names if isinstance(n, str)])
    single = router.get("auto_model_name")
    single = single if isinstance(single, str) else DEFAULT_AUTO_MODEL_NAME
    return normalized_names([*DEFAULT_AUTO_MODEL_NAMES, single])


def _recipe_problems(raw: JsonObject) -> list[Problem]:
    if not raw.get("recipes") and not raw.get("entrypoints"):
        return []
    glob = as_dict(raw.get("global"))
    looper = as_dict(as_dict(glob.get("integrations")).get("looper"))
    slugs = [
        name
        for key in ("remom", "fusion", "flow")
        for name in as_list(as_dict(looper.get(key)).get("model_names"))
        if isinstance(name, str)
    ]
    catalog = as_dict(glob.get("model_catalog"))
    deployments = as_dict(catalog.get("deployments"))
    target = as_dict(as_dict(catalog.get("system")).get("decision_model")).get("deployment")
    decision = target if isinstance(target, str) else next(iter(deployments), "")
    providers = raw.get("providers")

    def check(routing: JsonObject) -> list[Problem]:
        deps = {str(n) for n in deployments}
        return routing_against(providers, routing, deps, decision, catalog.get("system"))

    problems = recipe_problems(raw, _raw_auto_names(as_dict(glob.get("router"))), slugs)
    return problems + recipe_routing_problems(raw, check)
