"""What vllm-sr acts on in ``routing:``, and the refusals of the rest (issue 24 §1): a signal
family, leaf type, algorithm, plugin or decision option upstream has that would change routing
or the request but that vllm-sr does not implement is a problem at its YAML path saying
"not supported by vllm-sr" and naming what is supported instead. Metadata (descriptions, tags,
annotations, the retention hints keep_current_model and prefer_prefix_retention) is accepted.

Looper algorithms (confidence, ratings, remom, fusion, workflows) are accepted where upstream
itself runs them as ``static``: with no looper endpoint configured, or with too few modelRefs
(``X/req_filter_looper.go``). :func:`effective_algorithm` says what a decision runs and what
``/api/v1/eval`` reports for it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_sr.config.fallback_policy import fallback_problems
from vllm_sr.config.learning_rules import adaptations_problems
from vllm_sr.config.routing_base import Path, as_dict, as_list, problem, refusal
from vllm_sr.config.routing_looper import looper_block_problems
from vllm_sr.config.routing_plugins import SUPPORTED_PLUGIN_TYPES, canonical_type, plugin_problems
from vllm_sr.config.routing_selection import (
    RUN_SELECTORS,
    TRAINED_SELECTORS,
    selector_block_problems,
    trained_selector_refusal,
)
from vllm_sr.config.signal_registry import (
    BY_CONFIG_KEY,
    BY_NAME,
    GENERATIVE_MODEL_NEEDED,
    REFUSED_SIGNAL_LISTS,
    SUPPORTED_LEAF_TYPES,
    SUPPORTED_SIGNAL_LISTS,
    SignalFamily,
)
from vllm_sr.jsontypes import JsonObject

if TYPE_CHECKING:
    from vllm_sr.config.problems import Problem
    from vllm_sr.config.routing import Decision
    from vllm_sr.config.schema import GlobalSection

# routing.signals lists vllm-sr evaluates and refuses, and the rule-leaf types vllm-sr
# evaluates: the family registry's (signal_registry).
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
# Loopers vllm-sr runs itself when upstream would run them (vllm_sr/router/looper).
RUN_LOOPERS = LOOPER_TYPES
DEFAULT_LOOPER_ENDPOINT = "http://localhost:8899/v1/chat/completions"
SUPPORTED_PLUGINS: tuple[str, ...] = SUPPORTED_PLUGIN_TYPES

# Item 4 of issue 38: what needs a generative decision model, refused with the reason (the
# decision signal family and its leaves: its registry row's refusal_reason).
GENERATIVE_REFUSALS = {
    "algorithm": "the algorithm 'decision' (which candidate should answer: "
    f"{GENERATIVE_MODEL_NEEDED})",
    "prompt_cache": "the plugin 'prompt_cache' (Anthropic prompt-cache markers after route "
    "selection: vllm-sr forwards the OpenAI chat API only, with no Anthropic provider)",
}
SIGNALS_SUPPORTED = ", ".join(SUPPORTED_SIGNAL_LISTS)
LEAVES_SUPPORTED = ", ".join(SUPPORTED_LEAF_TYPES)
ALGORITHMS_SUPPORTED = (
    "static (or no algorithm), "
    + ", ".join(RUN_SELECTORS)
    + ", confidence, ratings, remom, fusion, workflows; the looper types "
    + ", ".join(LOOPER_TYPES)
    + " run as static "
    'with global.integrations.looper.endpoint: "" (as upstream does without a looper endpoint)'
)


# -- the helpers the router uses -------------------------------------------------------------


def looper_endpoint_of(global_: GlobalSection | JsonObject | None) -> str:
    """``global.integrations.looper.endpoint`` of a raw ``global`` mapping or its model
    (upstream's default when the file does not set it; "" when it is set empty)."""
    if global_ is None:
        return DEFAULT_LOOPER_ENDPOINT
    if not isinstance(global_, dict):
        return global_.integrations.looper.endpoint
    looper = as_dict(as_dict(global_.get("integrations")).get("looper"))
    value = looper.get("endpoint", DEFAULT_LOOPER_ENDPOINT)
    return value if isinstance(value, str) else DEFAULT_LOOPER_ENDPOINT


def _raw(decision: Decision | JsonObject) -> JsonObject:
    """A decision as its raw mapping (a model as written: aliases, no unset defaults)."""
    if isinstance(decision, dict):
        return decision
    return decision.model_dump(by_alias=True, exclude_none=True)


def _algorithm_type(decision: JsonObject) -> str:
    kind = as_dict(decision.get("algorithm")).get("type")
    return kind if isinstance(kind, str) and kind else STATIC


def _ref_count(decision: JsonObject) -> int:
    refs = decision.get("modelRefs")
    if refs is None:
        refs = decision.get("model_refs")
    return len(refs) if isinstance(refs, list) else 0


def looper_would_run(decision: Decision | JsonObject, looper_endpoint: str) -> bool:
    """Upstream would run this decision's looper: a looper type, a non-empty endpoint and
    enough models (remom, fusion, workflows: one modelRef, or fusion.analysis_models;
    confidence, ratings: more than one modelRef). The config rules refuse such decisions
    (:func:`looper_problems`).
    ``decision`` is a Decision or its raw mapping."""
    raw = _raw(decision)
    kind = _algorithm_type(raw)
    if kind not in LOOPER_TYPES or not looper_endpoint:
        return False
    algo = as_dict(raw.get("algorithm"))
    if kind == "fusion" and as_list(as_dict(algo.get("fusion")).get("analysis_models")):
        return True  # fusion's own analysis models: it runs with no modelRefs
    return _ref_count(raw) >= (1 if kind in SINGLE_REF_LOOPERS else 2)


def _planned_final(decision: JsonObject) -> bool:
    kind = _algorithm_type(decision)
    block = as_dict(as_dict(decision.get("algorithm")).get(kind))
    if kind == "fusion":
        return bool(block.get("model"))
    if kind == "workflows":
        return bool(as_dict(block.get("final")).get("model"))
    if kind == "remom":
        return bool(block.get("synthesis_model"))
    return False


def effective_algorithm(
    decision: Decision | JsonObject, global_: GlobalSection | JsonObject | None = None
) -> tuple[str, str]:
    """(algorithm, selection status) of a matched decision, as upstream's eval reports them:
    ``("static", "selected")`` for static or no algorithm, ``(type, "selected")`` for the
    selectors (vllm_sr/router/selection); for a looper type, run as a
    looper or as static, ``(type, "planned_final")`` when it names its final model
    (fusion.model, workflows.final.model, remom.synthesis_model), else
    ``(type, "execution_required")``. Run as static, the chat goes to the static choice (the
    first modelRef unless model_scores says otherwise). ``decision`` is a Decision or a raw mapping;
    ``global_`` the raw ``global`` mapping or its model (for the looper endpoint). Raises
    ValueError for a decision the config rules refuse (another selector, or a looper that
    upstream would run)."""
    raw = _raw(decision)
    kind = _algorithm_type(raw)
    if kind == STATIC or kind in RUN_SELECTORS:
        return kind, "selected"
    if kind not in LOOPER_TYPES:
        raise ValueError(f"algorithm {kind!r} is not supported by vllm-sr")
    if looper_would_run(raw, looper_endpoint_of(global_)) and kind not in RUN_LOOPERS:
        raise ValueError(f"algorithm {kind!r} with a looper endpoint is not supported by vllm-sr")
    # run as a looper (vllm_sr/router/looper) or as static, upstream's eval reports the same
    # (extproc/eval_model_selection.go): the configured final model, else execution_required
    return kind, "planned_final" if _planned_final(raw) else "execution_required"


# -- refusals and upstream's algorithm rules on raw mappings ---------------------------------


def support_problems(routing: object, base: Path = ("routing",)) -> list[Problem]:
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
                    _with_reason(f"the signal family {family!r}", BY_CONFIG_KEY[family]),
                    SIGNALS_SUPPORTED,
                )
            )
    for i, sig in enumerate(as_list(signals.get("embeddings"))):
        problems += _embedding_problems((*base, "signals", "embeddings", i), as_dict(sig))
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
    problems += fallback_problems((*base, "fallback"), rt.get("fallback"))
    for i, sig in enumerate(as_list(signals.get("jailbreak"))):
        direction = as_dict(sig).get("direction")
        if direction not in (None, "request"):
            problems.append(
                refusal(
                    (*base, "signals", "jailbreak", i, "direction"),
                    f"direction {direction!r} (scoring the model's answer, for the "
                    "response_jailbreak plugin)",
                    "request (the prompt is scored), or no direction",
                )
            )
    return problems


def _embedding_problems(path: Path, sig: JsonObject) -> list[Problem]:
    """v0.4's embedding fields vllm-sr does not act on, each refused by name."""
    problems = []
    if sig.get("query_modality") == "image":
        problems.append(
            refusal(
                (*path, "query_modality"),
                "query_modality 'image'",
                "text (the request's text is embedded)",
            )
        )
    for key in ("image_candidates", "negative_image_candidates"):
        if as_list(sig.get(key)):
            problems.append(
                refusal(
                    (*path, key),
                    f"{key} (example images need a multimodal embedding model; the "
                    "deployments here embed text)",
                    "candidates (text); an empty list",
                )
            )
    if as_list(sig.get("negative_candidates")):
        problems.append(
            refusal(
                (*path, "negative_candidates"),
                "negative_candidates (a score against a bank of counter-examples)",
                "an empty list; candidates and threshold (every candidate scored by "
                "aggregation_method)",
            )
        )
    scoring = sig.get("prototype_scoring")
    if scoring is not None and as_dict(scoring).get("enabled") is not False:
        problems.append(
            refusal(
                (*path, "prototype_scoring", "enabled"),
                "per-rule prototype scoring of embedding candidates (enabled is upstream's "
                "default when omitted)",
                "enabled: false (every candidate scored by aggregation_method), or no "
                "prototype_scoring block",
            )
        )
    return problems


def _decision_problems(path: Path, dec: JsonObject) -> list[Problem]:
    problems = _leaf_problems((*path, "rules"), dec.get("rules"))
    problems += _algorithm_problems((*path, "algorithm"), dec.get("algorithm"))
    problems += _v04_decision_problems(path, dec)
    seen: dict[str, int] = {}
    for j, plugin in enumerate(as_list(dec.get("plugins"))):
        raw_kind = as_dict(plugin).get("type")
        kind = canonical_type(raw_kind)
        if kind not in SUPPORTED_PLUGINS:
            what = GENERATIVE_REFUSALS.get(kind, f"the plugin {raw_kind!r}")
            problems.append(
                refusal((*path, "plugins", j, "type"), what, ", ".join(SUPPORTED_PLUGINS))
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
    problems += _emits_problems((*path, "emits"), dec.get("emits"))
    return problems


def _emits_problems(path: Path, emits: object) -> list[Problem]:
    """Upstream's emit contract (``C/validator_decision_emit.go``): one ``retention`` per
    decision, its payload required, ``drop: true`` not with ``ttl_turns`` > 0. The directive
    is acted on (vllm_sr/router/retention.py)."""
    problems: list[Problem] = []
    first: int | None = None
    for k, emit in enumerate(as_list(emits)):
        entry = as_dict(emit)
        if entry.get("kind") != "retention":
            continue  # the model refuses another kind
        if first is None:
            first = k
        else:
            problems.append(
                problem(
                    (*path, k, "kind"),
                    f"a second retention directive (emits[{first}] is one); accepted: one "
                    "retention per decision (upstream refuses a duplicate kind)",
                )
            )
        if entry.get("retention") is None:
            problems.append(
                problem(
                    (*path, k, "retention"),
                    "kind retention without its retention mapping; accepted: retention: "
                    "{drop, ttl_turns, keep_current_model, prefer_prefix_retention}",
                )
            )
            continue
        ret = as_dict(entry.get("retention"))
        ttl = ret.get("ttl_turns")
        if ret.get("drop") is True and isinstance(ttl, int) and ttl > 0:
            problems.append(
                problem(
                    (*path, k, "retention"),
                    f"drop: true with ttl_turns {ttl}; accepted: one of them (drop skips the "
                    "cache write, ttl_turns sets its lifetime; upstream refuses both)",
                )
            )
    return problems


def _v04_decision_problems(path: Path, dec: JsonObject) -> list[Problem]:
    """v0.4's decision fields: ``action`` and ``modelRefs[].reasoning_mode`` refused by name,
    ``algorithm.minimum_candidates`` checked as upstream's validator does."""
    problems = []
    if dec.get("action") is not None:
        problems.append(
            refusal(
                (*path, "action"),
                "a decision action (an explicit route to a destination instead of candidate "
                "ranking)",
                "modelRefs (the decision's models, picked by its algorithm)",
            )
        )
    refs = [as_dict(r) for r in as_list(dec.get("modelRefs"))]
    for k, ref in enumerate(refs):
        if ref.get("reasoning_mode") is not None:
            problems.append(
                refusal(
                    (*path, "modelRefs", k, "reasoning_mode"),
                    f"reasoning_mode {ref['reasoning_mode']!r} (a reasoning type with "
                    "enabled/disabled/adaptive modes)",
                    "use_reasoning and reasoning_effort",
                )
            )
    least = as_dict(dec.get("algorithm")).get("minimum_candidates")
    distinct = {
        (str(r.get("model", "")).strip(), str(r.get("lora_name") or "").strip())
        for r in refs
        if str(r.get("model", "")).strip()
    }
    if isinstance(least, int) and least > 0 and refs and len(distinct) < least:
        problems.append(
            problem(
                (*path, "algorithm", "minimum_candidates"),
                f"minimum_candidates {least} but the decision has {len(distinct)} distinct "
                f"modelRefs; accepted: at most {len(distinct)}, or more modelRefs (as upstream)",
            )
        )
    return problems


def _leaf_problems(path: Path, node: object) -> list[Problem]:
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
        what = _with_reason(f"the rule leaf type {kind!r}", BY_NAME.get(kind))
        problems.append(refusal((*path, "type"), what, LEAVES_SUPPORTED))
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


def _with_reason(what: str, row: SignalFamily | None) -> str:
    """A refused family's name in a refusal, with its row's reason where it has one."""
    reason = row.refusal_reason if row is not None else None
    return f"{what} ({reason})" if reason else what


def _algorithm_problems(path: Path, algo: object) -> list[Problem]:
    algo = as_dict(algo)
    kind = algo.get("type")
    if not isinstance(kind, str):
        return []
    blocks = [k for k in BLOCK_TYPES if algo.get(k) is not None]
    if kind == "decision":
        return [refusal((*path, "type"), GENERATIVE_REFUSALS["algorithm"], ALGORITHMS_SUPPORTED)]
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
    elif kind in TRAINED_SELECTORS:
        problems.append(trained_selector_refusal(path, kind))
    elif kind not in LOOPER_TYPES and kind != STATIC:
        problems.append(refusal((*path, "type"), f"the algorithm {kind!r}", ALGORITHMS_SUPPORTED))
    return problems


def looper_problems(
    routing: object, looper_endpoint: str, base: Path = ("routing",)
) -> list[Problem]:
    """Each looper decision's block checked as upstream checks it; where upstream would run
    the looper (a looper endpoint is configured and it has enough models) vllm-sr runs it
    itself (vllm_sr/router/looper) and refuses by name the options it does not run
    (routing_looper, looper_fanout_checks)."""
    problems = []
    for i, dec in enumerate(as_list(as_dict(routing).get("decisions"))):
        kind = _algorithm_type(as_dict(dec))
        if kind not in LOOPER_TYPES:
            continue
        algo = as_dict(as_dict(dec).get("algorithm"))
        refs = [
            str(as_dict(r).get("model"))
            for r in as_list(as_dict(dec).get("modelRefs"))
            if as_dict(r).get("model")
        ]
        problems += looper_block_problems(
            (*base, "decisions", i, "algorithm", kind),
            kind,
            algo.get(kind),
            refs,
            looper_endpoint if looper_would_run(as_dict(dec), looper_endpoint) else "",
        )
    return problems
