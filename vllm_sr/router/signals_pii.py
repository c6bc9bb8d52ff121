"""The ``pii`` signal family without a trained model: presidio-analyzer's pattern recognizers
(regular expressions with checksums and context-free scores; no spaCy model, no NLP engine),
run in the router's own process.

Entity types found, under upstream's names (``C/model_config_types.go``): CREDIT_CARD (Luhn
checked), EMAIL_ADDRESS, PHONE_NUMBER (the phonenumbers library), IBAN_CODE (checksum),
IP_ADDRESS (v4 and v6), US_SSN, US_DRIVER_LICENSE, DATE_TIME. Upstream's NER types (PERSON,
GPE, ORGANIZATION, NRP, AGE, STREET_ADDRESS, ZIP_CODE, DOMAIN_NAME) need a model and are not
detected. A rule matches when some detected type with a score >= ``threshold`` (0: any) is not
in ``pii_types_allowed`` (case-insensitive); with ``include_history`` the prior user and
non-user texts are scanned too. Confidence: the best such entity's score (upstream records
none, so a leaf reads 1.0 there; we keep presidio's score as the value).

Importing presidio-analyzer takes seconds (it loads its NLP engine modules even when unused),
so the recognizers are built on first use or by :meth:`PiiDetector.load` (the router's warm-up
calls it in a thread).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_sr.router.family_step import Names, SignalKey, StepReport
from vllm_sr.router.signals import SignalResult
from vllm_sr.router.signals_embedded import history

if TYPE_CHECKING:
    from presidio_analyzer import EntityRecognizer

    from vllm_sr.config.routing_signals import Signals
    from vllm_sr.config.signal_embedded import PIISignal
    from vllm_sr.router.request_view import RequestView

# presidio recognizer class -> the entity type it reports (already upstream's names).
RECOGNIZERS = (
    "CreditCardRecognizer",
    "EmailRecognizer",
    "PhoneRecognizer",
    "IbanRecognizer",
    "IpRecognizer",
    "UsSsnRecognizer",
    "UsLicenseRecognizer",
    "DateRecognizer",
)
COVERED_TYPES = (
    "CREDIT_CARD",
    "EMAIL_ADDRESS",
    "PHONE_NUMBER",
    "IBAN_CODE",
    "IP_ADDRESS",
    "US_SSN",
    "US_DRIVER_LICENSE",
    "DATE_TIME",
)


@dataclass(frozen=True)
class Entity:
    type: str
    start: int
    end: int
    score: float


class PiiDetector:
    """presidio's pattern recognizers, built once."""

    def __init__(self) -> None:
        self._recognizers: list[EntityRecognizer] | None = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._recognizers is not None

    def load(self) -> None:
        with self._lock:
            if self._recognizers is not None:
                return
            from presidio_analyzer import predefined_recognizers

            self._recognizers = [getattr(predefined_recognizers, n)() for n in RECOGNIZERS]

    def entities(self, text: str) -> list[Entity]:
        if self._recognizers is None:
            self.load()
        assert self._recognizers is not None
        out = []
        for rec in self._recognizers:
            # pattern recognizers need no NLP artifacts (presidio types the argument as required)
            for hit in rec.analyze(text, rec.supported_entities, None):  # type: ignore[arg-type]
                out.append(Entity(hit.entity_type, hit.start, hit.end, float(hit.score)))
        return out


_DETECTOR = PiiDetector()


def detector() -> PiiDetector:
    """The process's detector (its recognizers are stateless; build them once)."""
    return _DETECTOR


class PiiSignals:
    """``pii`` rules answered here (those naming no ``deployment:``), as a CPU-step family
    (``family_step``)."""

    family = "pii"
    heavy = True  # hundreds of microseconds even for a short text

    def __init__(self, rules: list[PIISignal], found: PiiDetector | None = None) -> None:
        self.rules = rules
        self.detector = found or detector()

    @staticmethod
    def build(signals: Signals) -> PiiSignals | None:
        rules = [p for p in signals.pii if not p.deployment]
        return PiiSignals(rules) if rules else None

    @property
    def loaded(self) -> bool:
        return self.detector.loaded

    def load(self) -> None:
        self.detector.load()

    def keys(self, names: Names | None) -> set[SignalKey]:
        return {("pii", r.name) for r in self.rules if names is None or r.name in names}

    def evaluate(self, view: RequestView, names: Names | None, out: StepReport) -> float | None:
        if names is None:
            out.results.update(self.results(view))
        else:
            wanted = [r for r in self.rules if r.name in names]
            out.results.update(PiiSignals(wanted, self.detector).results(view))
        return None

    def results(self, view: RequestView) -> dict[SignalKey, SignalResult]:
        if not self.rules:
            return {}
        texts = [view.text] if view.text.strip() else []
        current = [e for t in texts for e in self.detector.entities(t)]
        past: list[Entity] | None = None
        out: dict[SignalKey, SignalResult] = {}
        for rule in self.rules:
            found = current
            if rule.include_history:
                if past is None:
                    past = [e for t in history(view) for e in self.detector.entities(t)]
                found = current + past
            allowed = {t.upper() for t in rule.pii_types_allowed}
            counted = [
                e for e in found if e.score >= rule.threshold and e.type.upper() not in allowed
            ]
            if counted:
                best = max(e.score for e in counted)
                out[("pii", rule.name)] = SignalResult(True, 1.0, best)
            else:
                out[("pii", rule.name)] = SignalResult.miss()
        return out
