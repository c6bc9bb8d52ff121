"""The ``safety`` family's rules that no head answers (vllm_sr/router/signals_safety.py
answers the others): upstream's built-in Vela Safety model, answered zero-shot on the decision
deployment as jailbreak ``method: classifier`` is without a head (:class:`BuiltinSafetyAsk`,
bound in ``families.DEPLOYMENT_BUILDERS``).

The label sets are ``signals_classifiers.LabelBanks``': label ``unsafe`` is every built-in
hazard example (``signals_builtin.HAZARDS``) against the built-in safe set, and a hazard label
its own examples against it; each label's probability is the logistic of its margin. A rule's
risk is the best probability of its ``unsafe_labels`` (labels scored on their own do not add
up, as a softmax head's do); it matches at ``threshold``. A ``hazard`` with no hazard head
reads the same sets' ``categories`` (the best of them is the hazard risk, under the rule's
internal hazard key, as on a head: ``signals_safety.apply_hazards`` narrows the rule)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from vllm_sr.config.routing_signals import Signals
from vllm_sr.config.signal_safety import SafetySignal
from vllm_sr.jsontypes import JsonObject
from vllm_sr.router.family_deployment import DeploymentAsk
from vllm_sr.router.request_view import RequestView
from vllm_sr.router.rules import SignalKey
from vllm_sr.router.signals import SignalResult
from vllm_sr.router.signals_classifiers import LabelBanks, ZeroShot
from vllm_sr.router.signals_safety import hazard_key, safety_results


@dataclass
class BuiltinSafetyAsk:
    """The referenced safety rules with no head (and hazards with no hazard head), on the
    decision deployment."""

    rules: list[SafetySignal]
    hazards: list[SafetySignal]
    zero_shot: ZeroShot = field(init=False)

    def __post_init__(self) -> None:
        labels = {label for rule in self.rules for label in rule.unsafe}
        for rule in self.hazards:
            assert rule.hazard is not None
            labels |= {c.lower() for c in rule.hazard.categories}
        self.zero_shot = ZeroShot("safety", LabelBanks(labels))

    @property
    def family(self) -> str:
        return "safety"

    @property
    def shares_query(self) -> bool:
        return True  # the request text's row of the deployment's query task

    def signal_keys(self) -> list[SignalKey]:
        return [("safety", r.name) for r in self.rules] + [hazard_key(r) for r in self.hazards]

    def tasks(self, view: RequestView) -> list[JsonObject]:
        return self.zero_shot.tasks(view)

    def results(
        self, answers: Mapping[str, object], view: RequestView
    ) -> dict[SignalKey, SignalResult]:
        probs = self.zero_shot.probabilities(answers)
        out: dict[SignalKey, SignalResult] = {}
        for rule in self.rules:
            risk = max(probs[label] for label in rule.unsafe)
            out[("safety", rule.name)] = SignalResult(risk >= rule.threshold, risk, risk)
        out.update(safety_results([], self.hazards, probs))
        return out


def build_builtin(
    signals: Signals, referenced: frozenset[SignalKey], decision_deployment: str
) -> dict[str, DeploymentAsk]:
    """The referenced rules no head answers, asked on the decision deployment."""
    asked = [r for r in signals.safety if ("safety", r.name) in referenced]
    rules = [r for r in asked if r.head is None]
    hazards = [r for r in asked if r.hazard is not None and r.hazard_head is None]
    if not rules and not hazards:
        return {}
    return {decision_deployment: BuiltinSafetyAsk(rules, hazards)}
