"""The ``safety`` family on classification heads (config: vllm_sr/config/signal_safety.py), as
upstream's ``evaluateSafetySignals`` computes it on the request's current text:

- a rule's risk is the summed probability of its ``unsafe_labels`` (case-insensitive; unset:
  ``unsafe``) on its head; it matches when the risk reaches ``threshold``; value and
  confidence are the risk;
- with ``hazard``, the hazard head's best probability among ``categories`` is the hazard
  risk (under the internal key ``RULE:hazard``); a matched rule stays matched only when the
  hazard risk reaches ``hazard.threshold`` (:func:`apply_hazards`, once every deployment has
  answered, since the two heads may live on different deployments). A hazard that could not
  be evaluated makes a matched rule unknown (upstream's ``safety_hazard_classification_
  failed``).

The probabilities are what the head's worker answers: a softmax over its labels, or for a
multi-label head (config.json ``problem_type: multi_label_classification``, as hazard heads are
trained) each label's sigmoid (vllm_sr/worker/classify.py ``by_sigmoid``).

A rule with no head (upstream's built-in Vela Safety model), and a hazard with no hazard head,
are answered zero-shot on the decision deployment: vllm_sr/router/signals_safety_builtin.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vllm_sr.config.signal_safety import SafetySignal
from vllm_sr.router.rules import SignalKey
from vllm_sr.router.signals import SignalResult

HAZARD_SUFFIX = ":hazard"


def hazard_key(rule: SafetySignal) -> SignalKey:
    return ("safety", rule.name + HAZARD_SUFFIX)


def safety_results(
    rules: Sequence[SafetySignal], hazards: Sequence[SafetySignal], probs: Mapping[str, float]
) -> dict[SignalKey, SignalResult]:
    """``probs``: one head's label probabilities (lower-case labels) for the current text;
    ``rules`` are answered by this head, ``hazards`` have their hazard block here."""
    out: dict[SignalKey, SignalResult] = {}
    for rule in rules:
        risk = sum(p for label, p in probs.items() if label in rule.unsafe)
        out[("safety", rule.name)] = SignalResult(risk >= rule.threshold, risk, risk)
    for rule in hazards:
        assert rule.hazard is not None
        wanted = {c.lower() for c in rule.hazard.categories}
        risk = max((p for label, p in probs.items() if label in wanted), default=0.0)
        out[hazard_key(rule)] = SignalResult(risk >= rule.hazard.threshold, risk, risk)
    return out


def apply_hazards(rules: Sequence[SafetySignal], results: dict[SignalKey, SignalResult]) -> None:
    """Narrow each matched rule with a hazard block to its hazard's verdict, and drop the
    internal hazard keys."""
    for rule in rules:
        if rule.hazard is None:
            continue
        hazard = results.pop(hazard_key(rule), None)
        key = ("safety", rule.name)
        binary = results.get(key)
        if binary is None or not binary.matched or hazard is None:
            continue
        if hazard.unknown is not None:
            results[key] = SignalResult.unknown_because(hazard.unknown)
        elif not hazard.matched:
            results[key] = SignalResult(False, binary.confidence, binary.value)
