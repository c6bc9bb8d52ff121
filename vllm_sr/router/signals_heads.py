"""Signals answered by a deployment's classification head (a sequence-classification
artifact: ``AutoModelForSequenceClassification`` with its own ``config.json`` id2label), the
vllm-sr form of upstream's trained classifiers, chosen by configuration (the router does not
probe the artifact): a rule's ``deployment:`` (jailbreak: with ``method`` classifier/hybrid;
domains: with ``method: classifier``):

- jailbreak ``classifier``/``hybrid``: a text's risk is the summed probability of its labels
  named ``jailbreak`` (upstream's default ``prompt_guard.positive_labels``); a rule matches
  when its best text's risk reaches ``threshold`` and is above 0 (upstream's rule);
  ``include_history`` also classifies the history;
- user_feedbacks: after an assistant reply (upstream's gate), the head's top label when its
  probability reaches 0.7, else ``satisfied``; a rule matches when its name is that label
  (case-insensitive), confidence the probability;
- fact_check: P(needed) is the probability of the label ``FACT_CHECK_NEEDED`` (or
  ``needs_fact_check``); ``needs_fact_check`` when it reaches 0.6, else
  ``no_fact_check_needed``;
- pii, from a token-classification head (the worker answers each label's highest token
  probability): a type's confidence is the best of its BIO labels (``B-X``, ``I-X``: type
  ``X``; ``O`` is none); a rule matches when a type at >= ``threshold`` is not in
  ``pii_types_allowed``, on the current text (and its history with ``include_history``);
- domains with ``method: classifier``: upstream's rule (``ROUTER-REFERENCE.md`` §2.3) on the
  head's probabilities of the current text: a label names the domain listing it in
  ``mmlu_categories`` (the first such), else the domain named like it, else itself; when the
  distribution's normalised entropy (H / log2 N) is below 0.4 the top label is detected if its
  probability reaches the threshold, otherwise every label that reaches it is; the threshold
  is the label's domain's ``threshold`` when above 0, else upstream's
  ``modules.classifier.domain.threshold`` (0.5). A domain matches when a detected label
  names it or is one of its ``mmlu_categories``; confidence the probability;
- safety (v0.4) and its hazard block: vllm_sr/router/signals_safety.py, on the current text.

All texts go as one ``classify`` task (no labels: the head answers) in the deployment's one
bundle: the current text first, then the history when a jailbreak rule reads it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from vllm_sr.config.signal_safety import SafetySignal
from vllm_sr.jsontypes import JsonObject, json_object, json_type
from vllm_sr.router import signals_builtin as builtin
from vllm_sr.router.rules import SignalKey
from vllm_sr.router.signals import SignalResult
from vllm_sr.router.signals_embedded import FACT_CHECK_THRESHOLD, FEEDBACK_THRESHOLD, history
from vllm_sr.router.signals_safety import hazard_key, safety_results

if TYPE_CHECKING:
    from vllm_sr.config.routing_signals import DomainSignal
    from vllm_sr.config.signal_embedded import JailbreakSignal, NamedSignal, PIISignal
    from vllm_sr.router.request_view import RequestView

TASK_CLASSIFY = "classify"
POSITIVE_LABELS = frozenset({"jailbreak"})
FACT_CHECK_LABELS = frozenset({"fact_check_needed", "needs_fact_check"})
DOMAIN_THRESHOLD = 0.5  # upstream modules.classifier.domain.threshold
DOMAIN_ENTROPY_CUTOFF = 0.4  # upstream: below it, only the top label can be detected


class Heads:
    """The referenced rules one deployment's head answers."""

    def __init__(
        self,
        jailbreak: list[JailbreakSignal],
        feedbacks: list[NamedSignal] | None = None,
        fact_checks: list[NamedSignal] | None = None,
        pii: list[PIISignal] | None = None,
        domains: list[DomainSignal] | None = None,
        referenced_domains: frozenset[str] = frozenset(),
        domain_threshold: float = DOMAIN_THRESHOLD,
        safety: list[SafetySignal] | None = None,
        hazards: list[SafetySignal] | None = None,
    ) -> None:
        self.jailbreak = jailbreak
        self.safety = safety or []  # safety rules this head answers
        self.hazards = hazards or []  # safety rules whose hazard block this head answers
        self.feedbacks = feedbacks or []
        self.fact_checks = fact_checks or []
        self.pii = pii or []
        # The deployment's whole domain label set, and which of them a rule reads.
        self.domains = domains or []
        self.referenced_domains = referenced_domains
        self.domain_threshold = domain_threshold

    def texts(self, view: RequestView) -> list[str]:
        """The request's text, then (when a rule reads it) its history, each once."""
        out = [view.text]
        if any(r.include_history for r in self.jailbreak) or any(
            r.include_history for r in self.pii
        ):
            out += [t for t in history(view) if t not in out]
        return out

    def task(self, view: RequestView) -> JsonObject:
        return {"id": TASK_CLASSIFY, "classify": {"input": self.texts(view), "truncate": True}}

    def signal_keys(self) -> list[SignalKey]:
        keys: list[SignalKey] = [("jailbreak", r.name) for r in self.jailbreak]
        keys += [("user_feedback", r.name) for r in self.feedbacks]
        keys += [("pii", r.name) for r in self.pii]
        keys += [("domain", name) for name in sorted(self.referenced_domains)]
        keys += [("safety", r.name) for r in self.safety]
        keys += [hazard_key(r) for r in self.hazards]
        return keys + [("fact_check", r.name) for r in self.fact_checks]

    def results(self, view: RequestView, rows: list[object]) -> dict[SignalKey, SignalResult]:
        """``rows``: the classify answer's ``data`` for :meth:`texts`, in order. ValueError
        for a row with no ``probabilities`` object of numbers."""
        out: dict[SignalKey, SignalResult] = {}
        raw_rows = [probabilities(row) for row in rows]
        probs = [{k.lower(): p for k, p in row.items()} for row in raw_rows]
        risks = [sum(p for k, p in row.items() if k in POSITIVE_LABELS) for row in probs]
        for rule in self.jailbreak:
            own = risks if rule.include_history else risks[:1]
            risk = max(own, default=0.0)
            out[("jailbreak", rule.name)] = SignalResult(
                risk >= rule.threshold and risk > 0, risk, risk
            )
        if self.pii:
            out.update(self._pii(probs))
        current = probs[0] if probs else {}
        if self.safety or self.hazards:
            out.update(safety_results(self.safety, self.hazards, current))
        if self.referenced_domains and rows:
            domains = head_domain_results(self.domains, raw_rows[0], self.domain_threshold)
            for name, res in domains.items():
                if name in self.referenced_domains:
                    out[("domain", name)] = res
        if self.feedbacks:
            label, p = builtin.FEEDBACK_SATISFIED, 1.0
            if view.has_assistant_reply and current:
                best = min(current, key=lambda k: (-current[k], k))
                if current[best] >= FEEDBACK_THRESHOLD:
                    label, p = best, current[best]
            for feedback in self.feedbacks:
                hit = feedback.name.lower() == label
                out[("user_feedback", feedback.name)] = SignalResult(hit, p if hit else 0.0)
        if self.fact_checks:
            need = sum(p for k, p in current.items() if k in FACT_CHECK_LABELS)
            needed = need >= FACT_CHECK_THRESHOLD
            label = builtin.FACT_CHECK_NEEDED if needed else builtin.NO_FACT_CHECK_NEEDED
            conf = need if needed else 1.0 - need
            for fact_check in self.fact_checks:
                hit = fact_check.name == label
                out[("fact_check", fact_check.name)] = SignalResult(hit, conf if hit else 0.0)
        return out

    def _pii(self, probs: list[dict[str, float]]) -> dict[SignalKey, SignalResult]:
        types = [entity_types(row) for row in probs]
        out: dict[SignalKey, SignalResult] = {}
        for rule in self.pii:
            allowed = {t.upper() for t in rule.pii_types_allowed}
            rows = types if rule.include_history else types[:1]
            found = [
                p
                for row in rows
                for kind, p in row.items()
                if p >= rule.threshold and kind not in allowed
            ]
            best = max(found, default=None)
            out[("pii", rule.name)] = (
                SignalResult(True, 1.0, best) if best is not None else SignalResult.miss()
            )
        return out


def probabilities(row: object) -> dict[str, float]:
    """A classify row's ``probabilities`` (label -> probability); ValueError when it has
    none."""
    found = json_object(row)
    probs = json_object(found.get("probabilities")) if found is not None else None
    if probs is None:
        raise ValueError(f"a classify row without a probabilities object: {row!r:.80}")
    out = {}
    for label, p in probs.items():
        if not isinstance(p, (int, float)) or isinstance(p, bool):
            raise ValueError(f"probability of {label!r} is {json_type(p)}, not a number")
        out[label] = float(p)
    return out


def entity_types(row: dict[str, float]) -> dict[str, float]:
    """A token head's label maxima -> entity type (BIO prefix stripped, uppercased) -> its
    best probability; ``O`` (outside) is no type."""
    out: dict[str, float] = {}
    for label, p in row.items():
        kind = label.upper()
        if len(kind) > 2 and kind[1] == "-" and kind[0] in "BIES":
            kind = kind[2:]
        if kind != "O":
            out[kind] = max(out.get(kind, 0.0), p)
    return out


def domain_name(domains: list[DomainSignal], label: str) -> str:
    """Upstream's label -> name: the first domain listing the label in ``mmlu_categories``,
    else the domain named like it (case-insensitive), else the label itself."""
    low = label.lower()
    for dom in domains:
        if any(c.lower() == low for c in dom.mmlu_categories):
            return str(dom.name)
    for dom in domains:
        if dom.name.lower() == low:
            return str(dom.name)
    return label


def detected_labels(
    domains: list[DomainSignal],
    probabilities: dict[str, float],
    threshold: float = DOMAIN_THRESHOLD,
) -> dict[str, float]:
    """A head's label probabilities -> the detected labels and their probabilities (upstream's
    entropy rule: a confident distribution yields at most its top label, a spread one every
    label that reaches its threshold: its domain's ``threshold`` when above 0, else
    ``threshold``)."""
    by_name = {d.name: d for d in domains}

    def least(label: str) -> float:
        dom = by_name.get(domain_name(domains, label))
        return dom.threshold if dom is not None and dom.threshold > 0 else threshold

    labels = sorted(probabilities, key=lambda lb: (-probabilities[lb], lb))
    if normalized_entropy(list(probabilities.values())) < DOMAIN_ENTROPY_CUTOFF:
        labels = labels[:1]
    return {lb: probabilities[lb] for lb in labels if probabilities[lb] >= least(lb)}


def head_domain_results(
    domains: list[DomainSignal],
    probabilities: dict[str, float],
    threshold: float = DOMAIN_THRESHOLD,
) -> dict[str, SignalResult]:
    """Each domain's result: matched when a detected label names it or is one of its
    ``mmlu_categories`` (so two domains listing one category both match); confidence and
    value the best such label's probability."""
    found = detected_labels(domains, probabilities, threshold)
    out = {}
    for dom in domains:
        cats = {c.lower() for c in dom.mmlu_categories}
        hits = [
            p
            for label, p in found.items()
            if domain_name(domains, label) == dom.name or label.lower() in cats
        ]
        out[dom.name] = (
            SignalResult(True, min(1.0, max(hits)), max(hits)) if hits else SignalResult.miss()
        )
    return out


def normalized_entropy(probabilities: list[float]) -> float:
    """Shannon entropy over log2 of the label count (0: certain, 1: uniform); 0 for one
    label."""
    if len(probabilities) < 2:
        return 0.0
    h = -sum(p * math.log2(p) for p in probabilities if p > 0)
    return h / math.log2(len(probabilities))
