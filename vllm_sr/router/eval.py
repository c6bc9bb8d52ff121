"""``POST /api/v1/eval``: upstream's routing preview (``pkg/apiserver/route_classify.go``,
``pkg/services/classification_signal_*.go``). It evaluates every declared signal of the routing
config on the request, every decision's rule tree, the winner and static's model, and answers
upstream's document; it calls no backend and skips authz, as upstream does. Recipe probes
(upstream's ``probes.yaml``) are run against it. A signal that could not be evaluated (its
deployment refused, timed out or failed: vllm_sr/router/unknown.py) is listed only in
``signal_errors``, as ``"type:name": "<reason>: <detail>"``; it matches no rule leaf.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from vllm_sr.config.routing_plugins import canonical_type
from vllm_sr.errors import VllmSrError
from vllm_sr.jsontypes import JsonObject, json_object
from vllm_sr.router.families import EVAL_KEY, NOT_REPORTED_UNMATCHED
from vllm_sr.router.learning.settings import changes_at_execution
from vllm_sr.router.route import Router, SignalRun
from vllm_sr.router.rules import (
    SignalKey,
    decision_value,
    evaluate3,
    leaves,
    on_unknown_of,
    trace,
)
from vllm_sr.router.unknown import DecisionUnresolved

if TYPE_CHECKING:
    from vllm_sr.config.routing import Decision
    from vllm_sr.router.pipeline import ChatRun

MAX_EVAL_BODY = 10 * 1024 * 1024


class EvalError(VllmSrError):
    """An eval request upstream would refuse; ``code`` is upstream's (INVALID_INPUT, ...)."""

    http_status = 400
    retryable = False

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def error_body(exc: EvalError) -> bytes:
    """Upstream's eval error document."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return json.dumps(
        {"error": {"code": exc.code, "message": exc.message, "timestamp": stamp}}
    ).encode()


def parse_payload(raw: bytes) -> JsonObject:
    if len(raw) > MAX_EVAL_BODY:
        raise EvalError("INVALID_INPUT", f"the body is {len(raw)} bytes; accepted: at most 10 MiB")
    try:
        payload = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise EvalError("INVALID_INPUT", f"the body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise EvalError("INVALID_INPUT", "the body must be a JSON object")
    return payload


def grouped(keys: list[SignalKey] | set[SignalKey]) -> dict[str, list[str]]:
    """Signal keys -> upstream's {family: [names]} (families with no names omitted)."""
    out: dict[str, list[str]] = {}
    for kind, name in sorted(keys):
        out.setdefault(EVAL_KEY.get(kind, kind), []).append(name)
    return out


def _signal_maps(run: SignalRun) -> tuple[dict[str, float], dict[str, float], dict[str, str]]:
    confidences: dict[str, float] = {}
    values: dict[str, float] = {}
    for (kind, name), res in run.results.items():
        key = f"{kind}:{name}"
        if res.matched:
            confidences[key] = res.confidence
        if res.value is not None:
            values[key] = float(res.value)
    errors = {f"{kind}:{name}": why.describe() for (kind, name), why in run.unknown().items()}
    return confidences, values, errors


def _metrics(run: SignalRun) -> dict[str, dict[str, float]]:
    best: dict[str, float] = {}
    for (kind, _), res in run.results.items():
        if res.matched:
            best[kind] = max(best.get(kind, 0.0), res.confidence)
    best.update(run.family_confidence)
    return {
        kind: {"execution_time_ms": round(ms, 3), "confidence": best.get(kind, 0.0)}
        for kind, ms in sorted(run.timings_ms.items())
    }


def document(chat_run: ChatRun, *, model: str, want_trace: bool) -> JsonObject:
    """The eval document of a request whose eval stages ran (vllm_sr/router/pipeline.py
    ``run_eval``: every declared signal, every decision; ``model`` already resolved to an
    auto name)."""
    router, view, run = chat_run.router, chat_run.view, chat_run.signals
    assert router is not None and view is not None and run is not None
    recipe, matches, ranking = chat_run.recipe, chat_run.matches, chat_run.ranking
    assert ranking is not None
    matched = {key for key, res in run.results.items() if res.matched}
    unmatched = {  # an unknown signal is neither: it is in signal_errors
        key
        for key, res in run.results.items()
        if key not in matched and res.unknown is None and key[0] not in NOT_REPORTED_UNMATCHED
    }
    confidences, values, errors = _signal_maps(run)
    doc: JsonObject = {
        "original_text": view.text,
        "requested_model": model,
        "recipe": recipe,
        "metrics": _metrics(run),
        "signal_confidences": confidences,
        "signal_values": values,
        "signal_errors": errors,
    }
    if ranking.applied:
        doc["applied_unknown_policies"] = dict(ranking.applied)
    best = matches[0] if matches else None
    decision = best.decision if best is not None else None
    result: JsonObject = {
        "decision_name": decision.name if decision is not None else "",
        "algorithm": router.algorithms[decision.name][0] if decision is not None else "static",
        "used_signals": grouped(set(leaves(decision.rules))) if decision is not None else {},
        "matched_signals": grouped(matched),
        "unmatched_signals": grouped(unmatched),
    }
    if decision is not None:
        plugins = [canonical_type(p.type) for p in decision.plugins]
        if plugins:
            result["plugins"] = plugins
    doc["decision_result"] = result
    if want_trace:
        doc["eval_trace"] = [_trace_entry(dec, run) for dec in router.routing.decisions]
    if ranking.unresolved:  # upstream answers 503 with this document
        doc["decision_error"] = DecisionUnresolved(ranking.unresolved[0]).message
        doc.update(selected_model="", selection_status="unresolved", selection_method="none")
        return doc
    doc.update(_selection(router, decision))
    return doc


def _trace_entry(dec: Decision, run: SignalRun) -> JsonObject:
    """One decision's eval_trace entry; with v0.4's on_unknown set, also its three-valued
    ``state`` (true, false, unknown) and the policy (``on_unknown``)."""
    node = trace(dec.rules, run.results)
    entry: JsonObject = {
        "decision_name": dec.name,
        "matched": node["matched"],
        "confidence": node["confidence"],
        "root_trace": node,
    }
    policy = on_unknown_of(dec.rules)
    if policy is not None:
        value = evaluate3(dec.rules, run.results)
        decided = decision_value(dec.rules, run.results).value
        entry.update(matched=decided.matched, confidence=decided.confidence)
        entry["state"] = "unknown" if value is None else str(value.matched).lower()
        entry["on_unknown"] = policy
    return entry


def _selection(router: Router, decision: Decision | None) -> JsonObject:
    """The decision's pick (static's, a latency_aware / multi_factor selector's dry run on
    the live observations, or execution_required for the request-time selectors), or the
    default model when none matched."""
    if decision is None:
        return {
            "selected_model": router.default_model,
            "selection_status": "fallback",
            "selection_method": "default",
            "selection_reason": "no decision matched: providers.defaults.default_model",
        }
    refs = list(decision.model_refs)
    if not refs:
        return {
            "selected_model": router.default_model,
            "selection_status": "fallback",
            "selection_method": "default",
            "selection_reason": f"decision {decision.name!r} has no modelRefs: default_model",
        }
    ref = router.static_pick(decision)
    assert ref is not None  # the decision has modelRefs
    kind, status = router.algorithms[decision.name]
    if status != "selected":  # a looper run as static: upstream's eval plans, it does not pick
        final = planned_final_model(decision) if status == "planned_final" else None
        return {
            "recommended_models": [r.model for r in refs],
            "routing_decision": decision.name,
            **({"selected_model": final} if final else {}),
            "selection_status": status,
            "selection_method": kind,
            "selection_reason": f"{kind} is a multi-call algorithm: run as a looper, its model "
            "is known only once its calls are made; with no looper endpoint vllm-sr (as "
            "upstream) sends the chat to static's choice",
        }
    if changes_at_execution(router.learning, decision.adaptations):
        return {
            "recommended_models": [r.model for r in refs],
            "routing_decision": decision.name,
            "selection_status": "execution_required",
            "selection_method": kind,
            "selection_reason": "Router Learning can adapt or protect the base selector only "
            "during request execution",
        }
    if len(refs) > 1 and router.selection.runs_selector(decision):
        preview = router.selection.preview(decision)
        return {
            "recommended_models": [r.model for r in refs],
            "routing_decision": decision.name,
            **(
                {"selected_model": preview.ref.lora_name or preview.ref.model}
                if preview.ref is not None
                else {}
            ),
            "selection_status": preview.status,
            "selection_method": preview.method,
            "selection_reason": preview.reason,
        }
    return {
        "recommended_models": [r.model for r in refs],
        "routing_decision": decision.name,
        "selected_model": ref.lora_name or ref.model,
        "selection_status": "selected",
        "selection_method": "single" if len(refs) == 1 else "static",
        "selection_reason": (
            "the decision's only modelRef"
            if len(refs) == 1
            else "static: the first modelRef, unless the domain named like the decision "
            "scores another higher in model_scores"
        ),
    }


def planned_final_model(decision: Decision) -> str | None:
    """The final model a looper names (fusion.model, workflows.final.model,
    remom.synthesis_model), as upstream's eval reports it for planned_final."""
    algorithm = decision.algorithm
    if algorithm is None:
        return None
    value: object = None
    if algorithm.type == "fusion" and algorithm.fusion is not None:
        value = algorithm.fusion.get("model")
    elif algorithm.type == "workflows" and algorithm.workflows is not None:
        final = json_object(algorithm.workflows.get("final"))
        value = final.get("model") if final is not None else None
    elif algorithm.type == "remom" and algorithm.remom is not None:
        value = algorithm.remom.get("synthesis_model")
    return value if isinstance(value, str) and value else None
