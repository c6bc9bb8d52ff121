"""v0.4's ``input_modality`` family: a rule matches (confidence 1.0) when a user message of the
request carries a content part of the rule's modality (``text``, ``image``, ``audio``,
``video``: ``ConversationFacts.input_modalities``, read from the content parts by
vllm_sr/router/request_view.py). It needs no model: a CPU-step family
(``vllm_sr.config.signal_registry``), with no value, and its eval confidence 1.0 when the
request carries any modality."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_sr.router.family_step import Names, SignalKey, StepReport
from vllm_sr.router.signals import MISS, SignalResult

if TYPE_CHECKING:
    from vllm_sr.config.routing_signals import Signals
    from vllm_sr.config.signal_families import InputModalitySignal
    from vllm_sr.router.request_view import RequestView

HIT = SignalResult(True, 1.0)


class InputModalityFamily:
    """The generation's input_modality rules (every rule is evaluated: a set lookup each)."""

    family = "input_modality"
    heavy = False
    loaded = True

    def __init__(self, rules: list[InputModalitySignal]) -> None:
        self.rules = rules

    @staticmethod
    def build(signals: Signals) -> InputModalityFamily | None:
        rules = list(signals.input_modality)
        return InputModalityFamily(rules) if rules else None

    def load(self) -> None:
        pass

    def keys(self, names: Names | None) -> set[SignalKey]:
        return {("input_modality", r.name) for r in self.rules}

    def evaluate(self, view: RequestView, names: Names | None, out: StepReport) -> float:
        present = view.facts.input_modalities
        for rule in self.rules:
            out.results[("input_modality", rule.name)] = HIT if rule.modality in present else MISS
        return 1.0 if present else 0.0
