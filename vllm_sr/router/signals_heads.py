"""Signals answered by a deployment's classification head (a sequence-classification
artifact: ``AutoModelForSequenceClassification`` with its own ``config.json`` id2label), the
vllm-sr form of upstream's ``method: classifier``: today jailbreak ``classifier``/``hybrid``
with ``deployment:``. The texts go as one ``classify`` task (no labels: the head answers) in
that deployment's one bundle; the risk of a text is the summed probability of its labels named
``jailbreak`` (upstream's default ``prompt_guard.positive_labels``), and a rule matches when
its best text's risk reaches ``threshold`` and is above 0 (upstream's rule)."""

from __future__ import annotations

from typing import Any

from vllm_sr.router.rules import SignalKey
from vllm_sr.router.signals import SignalResult
from vllm_sr.router.signals_embedded import history

TASK_CLASSIFY = "classify"
POSITIVE_LABELS = frozenset({"jailbreak"})


class JailbreakHeads:
    """The referenced jailbreak rules one deployment's head answers."""

    def __init__(self, rules: list[Any]) -> None:
        self.rules = rules

    def texts(self, view: Any) -> list[str]:
        """The request's text, then (when a rule reads it) its history, each once."""
        out = [view.text]
        if any(r.include_history for r in self.rules):
            out += [t for t in history(view) if t not in out]
        return out

    def task(self, view: Any) -> dict[str, Any]:
        return {"id": TASK_CLASSIFY, "classify": {"input": self.texts(view), "truncate": True}}

    def signal_keys(self) -> list[SignalKey]:
        return [("jailbreak", r.name) for r in self.rules]

    def results(self, view: Any, rows: list[dict[str, Any]]) -> dict[SignalKey, SignalResult]:
        """``rows``: the classify answer's ``data`` for :meth:`texts`, in order."""
        risks = [
            sum(float(p) for label, p in row["probabilities"].items()
                if label.lower() in POSITIVE_LABELS)
            for row in rows
        ]  # fmt: skip
        out: dict[SignalKey, SignalResult] = {}
        for rule in self.rules:
            own = risks if rule.include_history else risks[:1]
            risk = max(own, default=0.0)
            out[("jailbreak", rule.name)] = SignalResult(
                risk >= rule.threshold and risk > 0, risk, risk
            )
        return out
