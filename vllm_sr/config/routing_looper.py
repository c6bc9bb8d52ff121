"""The ``confidence`` looper's settings and the checks of its block, as upstream's
``ValidateConfidenceAlgorithmConfig`` makes them (the loop and its scores:
vllm_sr/router/looper). Each error names the field, the value and what is accepted.

Upstream's fields: ``confidence_method`` (avg_logprob default, margin, hybrid, self_verify,
automix_entailment), ``threshold`` (0-1), ``hybrid_weights.{logprob_weight,margin_weight}``
(0-1 each, 0 meaning 0.5, summing to 1; only with hybrid), ``on_error`` (skip default, fail),
``escalation_order`` (size, small_to_large, declared, cost, automix), ``cost_quality_tradeoff``
(0-1), ``token_filter`` (all, tool_call_args), ``verifier_server_url`` /
``verifier_timeout_seconds`` / ``max_response_bytes`` (only with automix_entailment).

What vllm-sr runs: the methods avg_logprob, margin, hybrid; the orders size and small_to_large
(smallest modelCard ``param_size`` first, unknown sizes last, else the modelRefs' order),
declared (the modelRefs' order) and cost (cheapest prompt price first); token_filter all.
self_verify, automix_entailment, the automix order and tool_call_args are refused by name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from vllm_sr.config.routing_base import (
    NOT_SUPPORTED,
    Path,
    Strict,
    as_dict,
    as_list,
    is_int,
    is_number,
    not_accepted,
    problem,
    refusal,
)

if TYPE_CHECKING:
    from vllm_sr.config.problems import Problem
    from vllm_sr.config.routing import Decision
    from vllm_sr.jsontypes import JsonObject

METHODS = ("avg_logprob", "margin", "hybrid", "self_verify", "automix_entailment")
RUN_METHODS = ("avg_logprob", "margin", "hybrid")
ORDERS = ("size", "small_to_large", "declared", "cost", "automix")
RUN_ORDERS = ("size", "small_to_large", "declared", "cost")
ON_ERROR = ("skip", "fail")
TOKEN_FILTERS = ("all", "tool_call_args")
FIELDS = (
    "confidence_method",
    "threshold",
    "hybrid_weights",
    "on_error",
    "escalation_order",
    "cost_quality_tradeoff",
    "token_filter",
    "verifier_server_url",
    "verifier_timeout_seconds",
    "max_response_bytes",
)
WEIGHT_FIELDS = ("logprob_weight", "margin_weight")
DEFAULT_HYBRID_WEIGHT = 0.5


class ConfidenceSettings(Strict):
    confidence_method: Literal["avg_logprob", "margin", "hybrid"] = "avg_logprob"
    """How an answer's confidence (0-1) is read from its token logprobs."""

    threshold: float = Field(default=0.0, ge=0.0, le=1.0)
    """The confidence at which an answer is kept (0: the first answer is kept)."""

    logprob_weight: float = DEFAULT_HYBRID_WEIGHT
    """hybrid: the weight of the average token probability."""

    margin_weight: float = DEFAULT_HYBRID_WEIGHT
    """hybrid: the weight of the top-1 / top-2 margin."""

    escalation_order: Literal["size", "small_to_large", "declared", "cost"] = "size"
    """The order the modelRefs are tried in."""

    on_error: Literal["skip", "fail"] = "skip"
    """skip: a model that fails is passed over; fail: the loop ends with its failure."""

    @classmethod
    def from_block(cls, block: object) -> ConfidenceSettings:
        """The settings of a block :func:`confidence_problems` accepted."""
        got = {k: v for k, v in as_dict(block).items() if v not in (None, "")}
        weights = as_dict(got.pop("hybrid_weights", None))
        for key in ("cost_quality_tradeoff", "token_filter", "verifier_server_url"):
            got.pop(key, None)
        got.pop("verifier_timeout_seconds", None)
        got.pop("max_response_bytes", None)
        for key in WEIGHT_FIELDS:
            weight = weights.get(key)
            ok = isinstance(weight, (int, float)) and not isinstance(weight, bool) and weight
            got[key] = (
                float(weight) if ok and isinstance(weight, (int, float)) else DEFAULT_HYBRID_WEIGHT
            )
        return cls(**got)


def _unit(base: Path, key: str, value: object) -> list[Problem]:
    if is_number(value) and 0.0 <= value <= 1.0:
        return []
    return [not_accepted((*base, key), value, "a number within 0-1")]


def _one_of(base: Path, key: str, value: object, accepted: tuple[str, ...]) -> list[Problem]:
    if value in ("", None, *accepted):
        return []
    return [not_accepted((*base, key), value, ", ".join(accepted))]


def confidence_problems(base: Path, block: object) -> list[Problem]:
    """Upstream's checks of ``algorithm.confidence``, then vllm-sr's refusals by name."""
    got = as_dict(block)
    problems: list[Problem] = []
    for key in got:
        if key not in FIELDS:
            problems.append(
                problem((*base, key), f"unknown field {key!r}; accepted: {', '.join(FIELDS)}")
            )
    method = str(got.get("confidence_method") or "avg_logprob")
    problems += _one_of(base, "confidence_method", got.get("confidence_method"), METHODS)
    problems += _one_of(base, "on_error", got.get("on_error"), ON_ERROR)
    problems += _one_of(base, "escalation_order", got.get("escalation_order"), ORDERS)
    problems += _one_of(base, "token_filter", got.get("token_filter"), TOKEN_FILTERS)
    for key in ("threshold", "cost_quality_tradeoff"):
        if got.get(key) is not None:
            problems += _unit(base, key, got[key])
    if got.get("hybrid_weights") is not None:
        problems += _weights_problems((*base, "hybrid_weights"), method, got["hybrid_weights"])
    for key in ("verifier_timeout_seconds", "max_response_bytes"):
        value = got.get(key)
        if value is not None and not (is_int(value) and value >= 0):
            problems.append(not_accepted((*base, key), value, "a whole number >= 0"))
    if method != "automix_entailment":
        for key in ("verifier_server_url", "verifier_timeout_seconds", "max_response_bytes"):
            if got.get(key) not in (None, "", 0):
                problems.append(
                    problem(
                        (*base, key),
                        f"{got[key]!r} is not accepted with confidence_method {method!r}; "
                        "accepted: only with confidence_method automix_entailment",
                    )
                )
    if problems:
        return problems
    if method not in RUN_METHODS:
        problems.append(
            refusal(
                (*base, "confidence_method"),
                f"confidence_method {method!r} (a verifier call per answer)",
                ", ".join(RUN_METHODS),
            )
        )
    if got.get("escalation_order") == "automix":
        problems.append(
            refusal(
                (*base, "escalation_order"),
                "escalation_order 'automix' (upstream's POMDP ordering)",
                ", ".join(RUN_ORDERS),
            )
        )
    if got.get("token_filter") == "tool_call_args":
        problems.append(refusal((*base, "token_filter"), "token_filter 'tool_call_args'", "all"))
    return problems


def _weights_problems(base: Path, method: str, block: object) -> list[Problem]:
    if not isinstance(block, dict):
        return [not_accepted(base, block, f"a mapping of {', '.join(WEIGHT_FIELDS)}")]
    if method != "hybrid":
        return [
            problem(
                base,
                f"is not accepted with confidence_method {method!r}; accepted: only with "
                "confidence_method hybrid",
            )
        ]
    problems = [
        problem((*base, k), f"unknown field {k!r}; accepted: {', '.join(WEIGHT_FIELDS)}")
        for k in block
        if k not in WEIGHT_FIELDS
    ]
    for key in WEIGHT_FIELDS:
        if block.get(key) is not None:
            problems += _unit(base, key, block[key])
    if problems:
        return problems
    effective = [float(block.get(k) or DEFAULT_HYBRID_WEIGHT) for k in WEIGHT_FIELDS]
    if abs(sum(effective) - 1.0) > 1e-9:
        problems.append(
            problem(
                base,
                f"logprob_weight={effective[0]:g} and margin_weight={effective[1]:g} are not "
                "accepted; accepted: effective weights (0 meaning 0.5) that sum to 1",
            )
        )
    return problems


def looper_block_problems(
    base: Path, kind: str, block: object, ref_models: list[str], endpoint: str
) -> list[Problem]:
    """Upstream's checks of a looper decision's ``algorithm.<kind>`` block at ``base``, then,
    when the looper would run (through ``endpoint``; "" when it would not), vllm-sr's refusals
    by name (a looper upstream would not run is served as static: only upstream's own checks
    apply)."""
    runs = bool(endpoint)
    from vllm_sr.config import looper_fanout_checks as fanout

    if kind == "confidence":
        problems = confidence_problems(base, block)
    elif kind == "ratings":
        problems = fanout.ratings_problems(base, block)
    elif kind == "remom":
        problems = fanout.remom_problems(base, block, ref_models, runs)
    elif kind == "fusion":
        problems = fanout.fusion_problems(base, block, runs)
    else:
        problems = fanout.workflows_problems(base, block, ref_models)
    if runs:
        return problems
    return [p for p in problems if NOT_SUPPORTED not in str(p)]


# -- looper decisions with no modelRefs ------------------------------------------------------


def runs_unbound(decision: Decision | JsonObject, endpoint: str) -> bool:
    """A looper decision with no modelRefs (v0.4's built-in bundle before upstream's ``recipe
    builtin init`` binds them) that vllm-sr runs over the provider models because ``endpoint``
    is set (vllm_sr/router/looper/dispatch.py). Upstream's rule (``looper_would_run``) counts
    modelRefs, so it would serve such a decision as static; fusion with its own
    ``analysis_models`` already runs."""
    from vllm_sr.config.routing_support import LOOPER_TYPES, looper_would_run

    raw = (
        decision
        if isinstance(decision, dict)
        else decision.model_dump(by_alias=True, exclude_none=True)
    )
    kind = as_dict(raw.get("algorithm")).get("type")
    return (
        bool(endpoint)
        and kind in LOOPER_TYPES
        and not as_list(raw.get("modelRefs"))
        and not looper_would_run(raw, endpoint)
    )


def least_workers(decision: Decision) -> int:
    """The fewest admitted provider models an unbound looper decision runs with: upstream's
    count for its kind (confidence, ratings: 2; the others: 1), or ``minimum_candidates``
    when larger."""
    from vllm_sr.config.routing_support import SINGLE_REF_LOOPERS

    algo = decision.algorithm
    kind_least = 1 if algo is not None and algo.type in SINGLE_REF_LOOPERS else 2
    return max(kind_least, (algo.minimum_candidates or 0) if algo is not None else 0)


def unbound_refusals(routing: object, endpoint: str, base: Path = ("routing",)) -> list[Problem]:
    """vllm-sr's refusals by name (fusion ``grounding.enabled``, a remom template with Go
    actions) for the decisions :func:`runs_unbound` runs: the routing rules check a looper
    that upstream would not run only by upstream's own rules."""
    problems = []
    for i, dec in enumerate(as_list(as_dict(routing).get("decisions"))):
        raw = as_dict(dec)
        if not runs_unbound(raw, endpoint):
            continue
        kind = str(as_dict(raw.get("algorithm")).get("type"))
        block = as_dict(raw.get("algorithm")).get(kind)
        path = (*base, "decisions", i, "algorithm", kind)
        got = looper_block_problems(path, kind, block, [], endpoint)
        problems += [p for p in got if NOT_SUPPORTED in str(p)]
    return problems
