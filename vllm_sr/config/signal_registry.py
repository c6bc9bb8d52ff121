"""The signal-family registry: one row per family upstream has, and every name it goes by.

A row says a family's rule-leaf type (``keyword``), its list under ``routing.signals``
(``keywords``) and that list's pydantic model, the key of its entries that rule leaves name
(``name``; ``role`` for authz), the key of upstream's eval documents (``keywords``), the word of
its ``x-vsr-matched-<word>`` debug header, and where the router evaluates it
(:data:`Evaluated`). Config validation (``routing_support``, ``routing_rules``,
``deployment_needs``), the router's evaluation (``vllm_sr.router.families`` binds each row to
its evaluator), eval answers, headers and metrics read their names from here.

This module is pure data over the config models: the config imports it, and so does the router,
which adds the evaluators (``vllm_sr/router/families.py``). Adding a family is a row here, its
model and its ``Signals`` field, and its evaluator bound in ``vllm_sr/router/families.py``;
``tests/unit/test_signal_registry.py`` fails until they agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from vllm_sr.config.routing_signals import DomainSignal, EmbeddingSignal, KeywordSignal, Signals
from vllm_sr.config.signal_classifiers import ClassifierSignal
from vllm_sr.config.signal_embedded import (
    COMPLEXITY_LEVELS,
    ComplexitySignal,
    EventSignal,
    HallucinationSignal,
    JailbreakSignal,
    KBSignal,
    NamedSignal,
    PIISignal,
    PreferenceSignal,
    ReaskSignal,
)
from vllm_sr.config.signal_families import (
    ContextSignal,
    ConversationSignal,
    InputModalitySignal,
    LanguageSignal,
    StructureSignal,
)
from vllm_sr.config.signal_metadata import MetadataSignal, RoleBinding
from vllm_sr.config.signal_safety import SafetySignal

Evaluated = Literal["cpu_step", "loop", "deployment", "derived", "refused"]
"""Where the router evaluates a family:

- ``cpu_step``: deterministic and CPU-bound, with no model worker: the signal processes' step
  (``vllm_sr/router/cpu_signals.py``; on the event loop when no process takes it);
- ``loop``: on the event loop, before anything else (authz: it reads the identity headers and
  may refuse the chat);
- ``deployment``: asks a deployment (its embeddings or its classification head);
- ``derived``: computed from other signals' results (projections);
- ``refused``: upstream has it, vllm-sr does not evaluate it (``routing_support`` refuses a
  config that uses it, by name)."""

UnsetDeployment = Literal["decision_model", "system_safety", "model_binding"]
"""What an entry naming no ``deployment:`` asks, in a family whose entries may name one:

- ``decision_model``: the decision model's deployment (``global.model_catalog.system.
  decision_model``);
- ``system_safety``: ``global.model_catalog.system.safety`` when set, else the decision
  model's (safety rules: a head, else the built-in sets);
- ``model_binding``: the declared deployment ``routing.model_bindings["classifier.NAME"]``
  names, else the decision model's (classifiers: a head, else the built-in sets)."""

GENERATIVE_MODEL_NEEDED = (
    "needs a generative decision model (upstream asks global.model_catalog.system."
    "decision_model questions and reads its answer); vllm-sr's workers are encoders "
    "(embeddings and classification heads)"
)


@dataclass(frozen=True)
class SignalFamily:
    name: str
    """The rule-leaf type (``{type: NAME, name: ...}``) and the signal keys' first part."""

    config_key: str | None
    """Its list under ``routing.signals`` (None: projections, under ``routing.projections``)."""

    model: type[BaseModel] | None
    """The pydantic model of one entry of that list."""

    eval_key: str
    """Its key in upstream's eval documents (``matched_signals`` and the like)."""

    header: str | None
    """``x-vsr-matched-<header>``; None where upstream sends no such header."""

    evaluated: Evaluated

    leaf_field: str = "name"
    """The key of an entry that rule leaves name (authz leaves name a binding's role)."""

    takes_deployment: bool = False
    """Entries may name ``deployment:``, checked against the catalog; a ``cpu_step`` entry that
    names one asks that deployment instead (pii's token classifier)."""

    eval_unmatched: bool = True
    """Upstream lists the family's unmatched signals in eval's ``unmatched_signals``."""

    leaf_names: Callable[[Signals], Iterable[str]] | None = None
    """The names rule leaves may give its declared entries (complexity: ``RULE:LEVEL``); None
    where they are not under ``routing.signals`` (projections) or not evaluated."""

    leaf: bool = True
    """Rule leaves may name the family (``routing_tree.LeafType`` has it); False for a
    ``routing.signals`` list no leaf names (v0.4's response-stage ``hallucination``)."""

    leaf_names_checked: bool = False
    """The config rules refuse a rule leaf naming no declared entry of the family (the others'
    leaf names are labels or ``RULE:LEVEL``, checked by their own rules or not at all)."""

    unset_deployment: UnsetDeployment = "decision_model"
    """Where ``takes_deployment``: what an entry naming no ``deployment:`` asks (a
    ``cpu_step`` entry naming none asks nothing: :func:`entry_asks_deployment`)."""

    refusal_reason: str | None = None
    """A refused family: why, where it says more than "not supported" (the refusals of its
    ``routing.signals`` list and of its rule leaves carry it)."""

    @property
    def supported(self) -> bool:
        return self.evaluated != "refused"


# Order: the order of the "accepted:" lists in config errors (upstream's, then the refused).
FAMILIES: tuple[SignalFamily, ...] = (
    SignalFamily(
        "keyword",
        "keywords",
        KeywordSignal,
        "keywords",
        "keywords",
        "cpu_step",
        leaf_names_checked=True,
        leaf_names=lambda s: (e.name for e in s.keywords),
    ),
    SignalFamily(
        "embedding",
        "embeddings",
        EmbeddingSignal,
        "embeddings",
        "embeddings",
        "deployment",
        takes_deployment=True,
        leaf_names_checked=True,
        leaf_names=lambda s: (e.name for e in s.embeddings),
    ),
    SignalFamily(
        "domain",
        "domains",
        DomainSignal,
        "domains",
        "domains",
        "deployment",
        takes_deployment=True,
        leaf_names_checked=True,
        leaf_names=lambda s: (e.name for e in s.domains),
    ),
    SignalFamily(
        "context",
        "context",
        ContextSignal,
        "context",
        "context",
        "cpu_step",
        leaf_names_checked=True,
        leaf_names=lambda s: (e.name for e in s.context),
    ),
    SignalFamily(
        "structure",
        "structure",
        StructureSignal,
        "structure",
        "structure",
        "cpu_step",
        leaf_names_checked=True,
        leaf_names=lambda s: (e.name for e in s.structure),
    ),
    SignalFamily(
        "conversation",
        "conversation",
        ConversationSignal,
        "conversation",
        "conversation",
        "cpu_step",
        eval_unmatched=False,
        leaf_names_checked=True,
        leaf_names=lambda s: (e.name for e in s.conversation),
    ),
    SignalFamily(
        "language",
        "language",
        LanguageSignal,
        "language",
        "language",
        "cpu_step",
        leaf_names_checked=True,
        leaf_names=lambda s: (e.name for e in s.language),
    ),
    SignalFamily(
        "metadata",
        "metadata",
        MetadataSignal,
        "metadata",
        None,
        "cpu_step",
        leaf_names_checked=True,
        leaf_names=lambda s: (e.name for e in s.metadata),
    ),
    SignalFamily(  # v0.4
        "input_modality",
        "input_modality",
        InputModalitySignal,
        "input_modality",
        "input-modality",
        "cpu_step",
        leaf_names_checked=True,
        leaf_names=lambda s: (e.name for e in s.input_modality),
    ),
    SignalFamily(
        "authz",
        "role_bindings",
        RoleBinding,
        "authz",
        "authz",
        "loop",
        leaf_field="role",
        leaf_names_checked=True,
        leaf_names=lambda s: (b.role for b in s.role_bindings),
    ),
    SignalFamily(
        "fact_check",
        "fact_check",
        NamedSignal,
        "fact_check",
        "fact-check",
        "deployment",
        takes_deployment=True,
        leaf_names=lambda s: (e.name for e in s.fact_check),
    ),
    SignalFamily(
        "user_feedback",
        "user_feedbacks",
        NamedSignal,
        "user_feedback",
        "user-feedback",
        "deployment",
        takes_deployment=True,
        leaf_names=lambda s: (e.name for e in s.user_feedbacks),
    ),
    SignalFamily(
        "reask",
        "reasks",
        ReaskSignal,
        "reask",
        "reask",
        "deployment",
        leaf_names=lambda s: (e.name for e in s.reasks),
    ),
    SignalFamily(
        "preference",
        "preferences",
        PreferenceSignal,
        "preferences",
        "preference",
        "deployment",
        leaf_names=lambda s: (e.name for e in s.preferences),
    ),
    SignalFamily(
        "complexity",
        "complexity",
        ComplexitySignal,
        "complexity",
        "complexity",
        "deployment",
        leaf_names=lambda s: (f"{c.name}:{lv}" for c in s.complexity for lv in COMPLEXITY_LEVELS),
    ),
    SignalFamily(
        "jailbreak",
        "jailbreak",
        JailbreakSignal,
        "jailbreak",
        "jailbreak",
        "deployment",
        takes_deployment=True,
        leaf_names=lambda s: (e.name for e in s.jailbreak),
    ),
    SignalFamily(
        "pii",
        "pii",
        PIISignal,
        "pii",
        "pii",
        "cpu_step",
        takes_deployment=True,
        leaf_names=lambda s: (e.name for e in s.pii),
    ),
    SignalFamily(
        "kb",
        "kb",
        KBSignal,
        "kb",
        "kb",
        "deployment",
        eval_unmatched=False,
        leaf_names=lambda s: (e.name for e in s.kb),
    ),
    SignalFamily(  # v0.4: a classification head's unsafe labels (and hazard categories)
        "safety",
        "safety",
        SafetySignal,
        "safety",
        "safety",
        "deployment",
        takes_deployment=True,
        unset_deployment="system_safety",
        leaf_names_checked=True,
        leaf_names=lambda s: (e.name for e in s.safety),
    ),
    SignalFamily(  # a head's label probabilities, else built-in label sets; upstream sends
        # no debug header for it; rule leaves name NAME with a label (key NAME:LABEL)
        "classifier",
        "classifiers",
        ClassifierSignal,
        "classifier",
        None,
        "deployment",
        takes_deployment=True,
        unset_deployment="model_binding",
        leaf_names_checked=True,
        leaf_names=lambda s: (f"{c.name}:{label}" for c in s.classifiers for label in c.labels),
    ),
    SignalFamily("projection", None, None, "projection", "projections", "derived"),
    SignalFamily("modality", "modality", NamedSignal, "modality", "modality", "refused"),
    SignalFamily("event", "events", EventSignal, "event", "event", "refused", eval_unmatched=False),
    # v0.4: a generative decision model's verdict (refused: docs/router.md; its entries are
    # not modelled, so no model)
    SignalFamily(
        "decision",
        "decision",
        None,
        "decision",
        "decision",
        "refused",
        refusal_reason=GENERATIVE_MODEL_NEEDED,
    ),
    # v0.4: a response-stage check (refused); no rule leaf names it
    SignalFamily(
        "hallucination",
        "hallucination",
        HallucinationSignal,
        "hallucination",
        None,
        "refused",
        leaf=False,
    ),
)

BY_NAME: dict[str, SignalFamily] = {f.name: f for f in FAMILIES}
BY_CONFIG_KEY: dict[str, SignalFamily] = {f.config_key: f for f in FAMILIES if f.config_key}


def family(name: str) -> SignalFamily:
    """The row of a rule-leaf type; KeyError for a name that is no family."""
    return BY_NAME[name]


def names_where(evaluated: Evaluated) -> tuple[str, ...]:
    """The families evaluated there, in table order."""
    return tuple(f.name for f in FAMILIES if f.evaluated == evaluated)


# routing.signals lists vllm-sr evaluates, and those it refuses by name.
SUPPORTED_SIGNAL_LISTS: tuple[str, ...] = tuple(
    f.config_key for f in FAMILIES if f.config_key and f.supported
)
REFUSED_SIGNAL_LISTS: tuple[str, ...] = tuple(
    f.config_key for f in FAMILIES if f.config_key and not f.supported
)
# The rule-leaf types vllm-sr evaluates.
SUPPORTED_LEAF_TYPES: tuple[str, ...] = tuple(f.name for f in FAMILIES if f.supported)
# routing.signals lists whose entries may name a deployment.
DEPLOYMENT_LISTS: tuple[str, ...] = tuple(
    f.config_key for f in FAMILIES if f.config_key and f.takes_deployment
)
# routing.signals lists the frontend evaluates with no model (entries naming no deployment).
FRONTEND_SIGNAL_LISTS: frozenset[str] = frozenset(
    f.config_key
    for f in FAMILIES
    if f.config_key and f.evaluated in ("cpu_step", "loop") and not f.takes_deployment
)


def entry_asks_deployment(row: SignalFamily, deployment: object) -> bool:
    """Whether one entry of the family (its ``deployment:`` value) asks a model worker."""
    if row.evaluated == "deployment":
        return True
    return row.takes_deployment and deployment is not None


# rule-leaf type -> (routing.signals list, the entries' key leaves name), where leaf names are
# checked against the declared entries.
LEAF_NAME_LISTS: dict[str, tuple[str, str]] = {
    f.name: (f.config_key, f.leaf_field) for f in FAMILIES if f.config_key and f.leaf_names_checked
}
