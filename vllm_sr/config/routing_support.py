"""What vllm-sr acts on in ``routing:``, and the refusals of the rest (issue 24 §1): a signal
family, leaf type, algorithm, plugin or decision option upstream has that would change routing
or the request but that vllm-sr does not implement is a problem at its YAML path saying
"not supported by vllm-sr" and naming what is supported instead. Metadata (descriptions, tags,
annotations, retention hints with no effect here) is accepted.

Looper algorithms (confidence, ratings, remom, fusion, workflows) are accepted where upstream
itself runs them as ``static``: with no looper endpoint configured, or with too few modelRefs
(``X/req_filter_looper.go``). :func:`effective_algorithm` says what a decision runs and what
``/api/v1/eval`` reports for it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm_sr.config.learning_rules import adaptations_problems
from vllm_sr.config.routing_base import Path, as_dict, as_list, problem, refusal
from vllm_sr.config.routing_plugins import SUPPORTED_PLUGIN_TYPES, canonical_type, plugin_problems
from vllm_sr.config.routing_selection import RUN_SELECTORS, selector_block_problems

if TYPE_CHECKING:
    from vllm_sr.config.problems import Problem

# routing.signals lists vllm-sr evaluates, and the rule-leaf types that name them.
SUPPORTED_SIGNAL_LISTS = (
    "keywords",
    "embeddings",
    "domains",
    "context",
    "structure",
    "conversation",
    "language",
    "metadata",
    "role_bindings",
    "fact_check",
    "user_feedbacks",
    "reasks",
    "preferences",
    "complexity",
    "jailbreak",
    "pii",
    "kb",
    "safety",
)
REFUSED_SIGNAL_LISTS = (
    "modality",
    "events",
    "classifiers",
)
SUPPORTED_LEAF_TYPES = (
    "keyword",
    "embedding",
    "domain",
    "context",
    "structure",
    "conversation",
    "language",
    "metadata",
    "authz",
    "fact_check",
    "user_feedback",
    "reask",
    "preference",
    "complexity",
    "jailbreak",
    "pii",
    "kb",
    "projection",
    "safety",
)
STATIC = "static"
LOOPER_TYPES = ("confidence", "ratings", "remom", "fusion", "workflows")
SELECTOR_TYPES = (
    "static",
    "router_dc",
    "hybrid",
    "latency_aware",
    "multi_factor",
    "automix",
    "prompt",
    "knn",
    "kmeans",
    "svm",
    "mlp",
)
ALGORITHM_TYPES = SELECTOR_TYPES + LOOPER_TYPES
REMOVED_ALGORITHM_TYPES = (
    "session_aware",
    "elo",
    "rl_driven",
    "gmtrouter",
    "bandit",
    "personalization",
)
# Types whose settings live in a block named like the type; the others take no block.
BLOCK_TYPES = (
    "confidence",
    "ratings",
    "remom",
    "fusion",
    "workflows",
    "router_dc",
    "automix",
    "hybrid",
    "latency_aware",
    "multi_factor",
    "prompt",
)
# Loopers that upstream runs with a single modelRef; the others need more than one.
SINGLE_REF_LOOPERS = ("remom", "fusion", "workflows")
DEFAULT_LOOPER_ENDPOINT = "http://localhost:8899/v1/chat/completions"
SUPPORTED_PLUGINS: tuple[str, ...] = SUPPORTED_PLUGIN_TYPES

SIGNALS_SUPPORTED = ", ".join(SUPPORTED_SIGNAL_LISTS)
LEAVES_SUPPORTED = ", ".join(SUPPORTED_LEAF_TYPES)
ALGORITHMS_SUPPORTED = (
    "static (or no algorithm), latency_aware, multi_factor; the looper types "
    + ", ".join(LOOPER_TYPES)
    + " run as static "
    'with global.integrations.looper.endpoint: "" (as upstream does without a looper endpoint)'
)


# -- the helpers the router uses -------------------------------------------------------------


def looper_endpoint_of(global_: Any) -> str:
    """``global.integrations.looper.endpoint`` of a raw ``global`` mapping or a model (upstream's
    default when the file does not set it; "" when it is set empty)."""
    if global_ is None:
        return DEFAULT_LOOPER_ENDPOINT
    if isinstance(global_, dict):
        looper = as_dict(as_dict(global_.get("integrations")).get("looper"))
        value = looper.get("endpoint", DEFAULT_LOOPER_ENDPOINT)
    else:
        looper_model = getattr(getattr(global_, "integrations", None), "looper", None)
        value = getattr(looper_model, "endpoint", DEFAULT_LOOPER_ENDPOINT)
    return value if isinstance(value, str) else DEFAULT_LOOPER_ENDPOINT


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def _algorithm_type(decision: Any) -> str:
    algo = _get(decision, "algorithm")
    kind = _get(algo, "type") if algo is not None else None
    return kind if isinstance(kind, str) and kind else STATIC


def _ref_count(decision: Any) -> int:
    refs = _get(decision, "modelRefs") if isinstance(decision, dict) else None
    if refs is None:
        refs = _get(decision, "model_refs")
    return len(refs) if isinstance(refs, list) else 0


def looper_would_run(decision: Any, looper_endpoint: str) -> bool:
    """Upstream would run this decision's looper: a looper type, a non-empty endpoint and
    enough models (remom, fusion, workflows: one modelRef, or fusion.analysis_models;
    confidence, ratings: more than one modelRef). The config rules refuse such decisions
    (:func:`looper_problems`).
    ``decision`` is a Decision or its raw mapping."""
    kind = _algorithm_type(decision)
    if kind not in LOOPER_TYPES or not looper_endpoint:
        return False
    algo = _get(decision, "algorithm")
    if kind == "fusion" and as_list(as_dict(_get(algo, "fusion")).get("analysis_models")):
        return True  # fusion's own analysis models: it runs with no modelRefs
    return _ref_count(decision) >= (1 if kind in SINGLE_REF_LOOPERS else 2)


def _planned_final(decision: Any) -> bool:
    algo = _get(decision, "algorithm")
    kind = _algorithm_type(decision)
    block = as_dict(_get(algo, kind)) if algo is not None else {}
    if kind == "fusion":
        return bool(block.get("model"))
    if kind == "workflows":
        return bool(as_dict(block.get("final")).get("model"))
    if kind == "remom":
        return bool(block.get("synthesis_model"))
    return False


def effective_algorithm(decision: Any, global_: Any = None) -> tuple[str, str]:
    """(algorithm, selection status) of a matched decision, as upstream's eval reports them
    when the looper does not run: ``("static", "selected")`` for static or no algorithm,
    ``(type, "selected")`` for latency_aware and multi_factor (vllm_sr/router/selection); for a
    looper type run as static, ``(type, "planned_final")`` when it names its final model
    (fusion.model, workflows.final.model, remom.synthesis_model), else
    ``(type, "execution_required")``. Either way the chat goes to the static choice (the first
    modelRef unless model_scores says otherwise). ``decision`` is a Decision or a raw mapping;
    ``global_`` the raw ``global`` mapping or its model (for the looper endpoint). Raises
    ValueError for a decision the config rules refuse (another selector, or a looper that
    upstream would run)."""
    kind = _algorithm_type(decision)
    if kind == STATIC or kind in RUN_SELECTORS:
        return kind, "selected"
    if kind not in LOOPER_TYPES:
        raise ValueError(f"algorithm {kind!r} is not supported by vllm-sr")
    if looper_would_run(decision, looper_endpoint_of(global_)):
        raise ValueError(f"algorithm {kind!r} with a looper endpoint is not supported by vllm-sr")
    return kind, "planned_final" if _planned_final(decision) else "execution_required"


# -- refusals and upstream's algorithm rules on raw mappings ---------------------------------


def support_problems(routing: Any, base: Path = ("routing",)) -> list[Problem]:
    """Every refusal inside one raw ``routing`` mapping (no global context), plus upstream's
    load-time algorithm rules (unknown type, stray blocks)."""
    rt = as_dict(routing)
    signals = as_dict(rt.get("signals"))
    problems: list[Problem] = []
    for family in REFUSED_SIGNAL_LISTS:
        if as_list(signals.get(family)):
            problems.append(
                refusal(
                    (*base, "signals", family),
                    f"the signal family {family!r}",
                    SIGNALS_SUPPORTED,
                )
            )
    for i, sig in enumerate(as_list(signals.get("embeddings"))):
        if as_dict(sig).get("query_modality") == "image":
            problems.append(
                refusal(
                    (*base, "signals", "embeddings", i, "query_modality"),
                    "query_modality 'image'",
                    "text (the request's text is embedded)",
                )
            )
    for i, sig in enumerate(as_list(signals.get("complexity"))):
        for bank in ("hard", "easy"):
            if as_list(as_dict(as_dict(sig).get(bank)).get("image_candidates")):
                problems.append(
                    refusal(
                        (*base, "signals", "complexity", i, bank, "image_candidates"),
                        "image candidates (a multimodal embedding model)",
                        "candidates (text)",
                    )
                )
    for i, dec in enumerate(as_list(rt.get("decisions"))):
        problems += _decision_problems((*base, "decisions", i), as_dict(dec))
    return problems


def _decision_problems(path: Path, dec: dict[str, Any]) -> list[Problem]:
    problems = _leaf_problems((*path, "rules"), dec.get("rules"))
    problems += _algorithm_problems((*path, "algorithm"), dec.get("algorithm"))
    seen: dict[str, int] = {}
    for j, plugin in enumerate(as_list(dec.get("plugins"))):
        raw_kind = as_dict(plugin).get("type")
        kind = canonical_type(raw_kind)
        if kind not in SUPPORTED_PLUGINS:
            problems.append(
                refusal(
                    (*path, "plugins", j, "type"),
                    f"the plugin {raw_kind!r}",
                    ", ".join(SUPPORTED_PLUGINS),
                )
            )
            continue
        if kind in seen:
            problems.append(
                problem(
                    (*path, "plugins", j, "type"),
                    f"the plugin {kind!r} is also plugins[{seen[kind]}] (after upstream's "
                    "aliasing); accepted: one plugin per type",
                )
            )
        seen[kind] = j
        problems += plugin_problems(
            (*path, "plugins", j), kind, as_dict(plugin).get("configuration")
        )
    problems += adaptations_problems((*path, "adaptations"), dec.get("adaptations"))
    for k, emit in enumerate(as_list(dec.get("emits"))):
        ret = as_dict(as_dict(emit).get("retention"))
        ttl = ret.get("ttl_turns")
        if ret.get("drop") is True:
            problems.append(
                refusal(
                    (*path, "emits", k, "retention", "drop"),
                    "retention drop (a response-cache directive)",
                    "keep_current_model and prefer_prefix_retention, as metadata",
                )
            )
        if isinstance(ttl, int) and ttl > 0:
            problems.append(
                refusal(
                    (*path, "emits", k, "retention", "ttl_turns"),
                    "retention ttl_turns > 0 (a response-cache directive)",
                    "ttl_turns 0; keep_current_model and prefer_prefix_retention, as metadata",
                )
            )
        if ret.get("drop") is True and isinstance(ttl, int) and ttl > 0:
            problems.append(
                problem(
                    (*path, "emits", k, "retention"),
                    "drop with ttl_turns > 0; accepted: one of them (upstream rejects both)",
                )
            )
    return problems


def _leaf_problems(path: Path, node: Any) -> list[Problem]:
    node = as_dict(node)
    if "operator" in node or "type" not in node:
        problems = []
        for j, child in enumerate(as_list(node.get("conditions"))):
            problems += _leaf_problems((*path, "conditions", j), child)
        return problems
    kind = node.get("type")
    kind = kind.strip().lower() if isinstance(kind, str) else kind
    problems = []
    if isinstance(kind, str) and kind not in SUPPORTED_LEAF_TYPES:
        problems.append(refusal((*path, "type"), f"the rule leaf type {kind!r}", LEAVES_SUPPORTED))
    for key in ("label", "on_error"):
        if node.get(key) is not None and kind != "classifier":
            problems.append(
                problem(
                    (*path, key),
                    f"{key} on a {kind} leaf; accepted: {key} only on classifier leaves "
                    "(as upstream)",
                )
            )
    return problems


def _algorithm_problems(path: Path, algo: Any) -> list[Problem]:
    algo = as_dict(algo)
    kind = algo.get("type")
    if not isinstance(kind, str):
        return []
    blocks = [k for k in BLOCK_TYPES if algo.get(k) is not None]
    if kind in REMOVED_ALGORITHM_TYPES:
        return [
            problem(
                (*path, "type"),
                f"{kind!r} was removed upstream; accepted: one of {', '.join(ALGORITHM_TYPES)}",
            )
        ]
    if kind not in ALGORITHM_TYPES:
        return [
            problem(
                (*path, "type"),
                f"{kind!r} is not an algorithm (lowercase); accepted: one of "
                f"{', '.join(ALGORITHM_TYPES)}",
            )
        ]
    problems = []
    for block in blocks:
        if block != kind:
            problems.append(
                problem(
                    (*path, block),
                    f"a {block} block on algorithm {kind!r}; accepted: "
                    + (f"only a {kind} block" if kind in BLOCK_TYPES else "no block")
                    + " (as upstream)",
                )
            )
    if kind in RUN_SELECTORS:
        problems += selector_block_problems(path, kind, algo)
    elif kind not in LOOPER_TYPES and kind != STATIC:
        problems.append(refusal((*path, "type"), f"the algorithm {kind!r}", ALGORITHMS_SUPPORTED))
    return problems


def looper_problems(routing: Any, looper_endpoint: str, base: Path = ("routing",)) -> list[Problem]:
    """A looper decision that upstream would run (a looper endpoint is configured and it has
    enough models) is refused at its algorithm type: vllm-sr runs no looper."""
    problems = []
    for i, dec in enumerate(as_list(as_dict(routing).get("decisions"))):
        if looper_would_run(as_dict(dec), looper_endpoint):
            kind = _algorithm_type(dec)
            problems.append(
                refusal(
                    (*base, "decisions", i, "algorithm", "type"),
                    f"the {kind} looper (multi-call, through the looper endpoint "
                    f"{looper_endpoint!r} of global.integrations.looper.endpoint)",
                    'static; or set global.integrations.looper.endpoint: "" and vllm-sr runs it '
                    "as static, as upstream does without a looper endpoint",
                )
            )
    return problems
