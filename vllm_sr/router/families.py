"""The router's half of the signal-family registry (``vllm_sr.config.signal_registry``, pure
data the config reads too): each evaluated family bound to its evaluator, and the wire names
derived from the rows (eval's ``matched_signals`` keys, the ``x-vsr-matched-<word>`` headers).

A ``cpu_step`` family's evaluator is the builder of its
:class:`~vllm_sr.router.family_step.StepFamily`: ``cpu_signals`` builds every such family a
generation references from :data:`STEP_BUILDERS` and runs them, on the loop or in a signal
process. A ``deployment`` family outside the built-in questions binds the builder of its
per-deployment :class:`~vllm_sr.router.family_deployment.DeploymentAsk` in
:data:`DEPLOYMENT_BUILDERS`; ``QuestionPlan`` asks every referenced one. A family a
classification head can answer binds the builder of its part of the deployment's
:class:`~vllm_sr.router.signals_heads.Heads` in :data:`HEAD_BUILDERS` (``head_rules``:
which referenced rules go to which head). The other families
name the evaluator that answers them: authz on the loop (``DeterministicSignals``), the
built-in deployment families through the deployment's one routing bundle
(``DeploymentQuestions``: embedding matching, the domain centroids, the embedded families, the
classification heads), projections after every other signal (``signals_projections``).
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_sr.config.signal_registry import FAMILIES, SignalFamily
from vllm_sr.router import head_rules, signals_classifiers
from vllm_sr.router.deployment_questions import DeploymentQuestions
from vllm_sr.router.deterministic import (
    ContextFamily,
    ConversationFamily,
    DeterministicSignals,
    MetadataFamily,
    StructureFamily,
)
from vllm_sr.router.family_deployment import DeploymentBuilder
from vllm_sr.router.family_step import StepBuilder
from vllm_sr.router.head_rules import HeadBuilder
from vllm_sr.router.input_modality import InputModalityFamily
from vllm_sr.router.language import LanguageFamily
from vllm_sr.router.signals import KeywordFamily
from vllm_sr.router.signals_embedded import EmbeddedFamilies
from vllm_sr.router.signals_heads import Heads
from vllm_sr.router.signals_pii import PiiSignals
from vllm_sr.router.signals_projections import apply_projections
from vllm_sr.router.signals_safety import apply_hazards
from vllm_sr.router.signals_safety_builtin import build_builtin as build_builtin_safety

# cpu_step families: the builder of each one's evaluator.
STEP_BUILDERS: dict[str, StepBuilder] = {
    "keyword": KeywordFamily.build,
    "context": ContextFamily.build,
    "structure": StructureFamily.build,
    "conversation": ConversationFamily.build,
    "language": LanguageFamily.build,
    "metadata": MetadataFamily.build,
    "input_modality": InputModalityFamily.build,
    "pii": PiiSignals.build,
}

# deployment families beyond DeploymentQuestions' built-in questions: the builder of each
# one's per-deployment asks (QuestionPlan puts them in the deployment's bundle).
DEPLOYMENT_BUILDERS: dict[str, DeploymentBuilder] = {
    "classifier": signals_classifiers.build,
    "safety": build_builtin_safety,  # rules no head answers (the others: Heads)
}

# deployment families a classification head can answer: the builder of each one's part of
# the heads (QuestionPlan merges the parts by deployment into one Heads per bundle).
HEAD_BUILDERS: dict[str, HeadBuilder] = {
    "domain": head_rules.domain,  # method: classifier
    "fact_check": head_rules.fact_check,
    "user_feedback": head_rules.user_feedback,
    "jailbreak": head_rules.jailbreak,  # classifier/hybrid with a deployment
    "pii": head_rules.pii,  # entries naming a deployment: its token classifier
    "safety": head_rules.safety,
}

# The other evaluated families: what answers them (a class, or a function over results).
ANSWERED_BY: dict[str, tuple[object, ...]] = {
    "authz": (DeterministicSignals,),
    "embedding": (DeploymentQuestions,),
    "domain": (DeploymentQuestions, Heads),
    "fact_check": (EmbeddedFamilies, Heads),
    "user_feedback": (EmbeddedFamilies, Heads),
    "reask": (EmbeddedFamilies,),
    "preference": (EmbeddedFamilies,),
    "complexity": (EmbeddedFamilies,),
    "jailbreak": (EmbeddedFamilies, Heads),
    "kb": (EmbeddedFamilies,),
    "pii": (Heads,),  # entries naming a deployment: its token classifier
    "safety": (Heads, apply_hazards),  # v0.4: the heads' risks, narrowed by hazard heads
    "projection": (apply_projections,),
}


@dataclass(frozen=True)
class Binding:
    row: SignalFamily
    step: StepBuilder | None
    deployment: DeploymentBuilder | None
    answered_by: tuple[object, ...]
    heads: HeadBuilder | None = None


def _bind() -> dict[str, Binding]:
    out = {}
    for row in FAMILIES:
        if row.supported:
            out[row.name] = Binding(
                row,
                STEP_BUILDERS.get(row.name),
                DEPLOYMENT_BUILDERS.get(row.name),
                ANSWERED_BY.get(row.name, ()),
                HEAD_BUILDERS.get(row.name),
            )
    return out


BINDINGS: dict[str, Binding] = _bind()
STEP_FAMILIES: tuple[str, ...] = tuple(f.name for f in FAMILIES if f.evaluated == "cpu_step")

# rule-leaf type -> eval MatchedSignals key; -> debug header word (where upstream sends one).
EVAL_KEY: dict[str, str] = {f.name: f.eval_key for f in FAMILIES}
DEBUG_HEADER_WORD: dict[str, str] = {f.name: f.header for f in FAMILIES if f.header is not None}
# Families eval leaves out of unmatched_signals (and kb_metric: KB metric values, no family).
NOT_REPORTED_UNMATCHED: frozenset[str] = frozenset(
    {f.name for f in FAMILIES if not f.eval_unmatched} | {"kb_metric"}
)
