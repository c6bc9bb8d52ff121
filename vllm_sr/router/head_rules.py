"""Which referenced rules a deployment's classification head answers, family by family: each
family that a head can answer binds a :data:`HeadBuilder` (``families.HEAD_BUILDERS``), and
:class:`~vllm_sr.router.questions.QuestionPlan` merges the parts by deployment into one
:class:`~vllm_sr.router.signals_heads.Heads` (one ``classify`` task per bundle). The rules no
head answers are the embedding-only families' (``signals_embedded``) or a bound
``DeploymentAsk``'s (``families.DEPLOYMENT_BUILDERS``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from vllm_sr.router.signals_heads import DOMAIN_THRESHOLD, Heads

if TYPE_CHECKING:
    from vllm_sr.config.routing_signals import DomainSignal, Signals
    from vllm_sr.config.signal_embedded import NamedSignal
    from vllm_sr.config.upstream_modules import Modules
    from vllm_sr.router.rules import SignalKey

HeadBuilder = Callable[["Signals", "frozenset[SignalKey]", "Modules | None"], "dict[str, Heads]"]
"""A family's part of the heads, by deployment, from the generation's signals, the referenced
keys and upstream's ``modules`` (none where nothing it answers is referenced)."""


def merged(a: Heads, b: Heads) -> Heads:
    """Two families' parts of one deployment's head (each part holds its own families' rules;
    the domain threshold is the part's with the domains)."""
    return Heads(
        a.jailbreak + b.jailbreak,
        a.feedbacks + b.feedbacks,
        a.fact_checks + b.fact_checks,
        a.pii + b.pii,
        domains=a.domains + b.domains,
        referenced_domains=a.referenced_domains | b.referenced_domains,
        domain_threshold=b.domain_threshold if b.domains else a.domain_threshold,
        safety=a.safety + b.safety,
        hazards=a.hazards + b.hazards,
    )


def jailbreak(
    signals: Signals, referenced: frozenset[SignalKey], modules: Modules | None
) -> dict[str, Heads]:
    """A classifier/hybrid rule naming a deployment (contrastive rules are prototypes)."""
    out: dict[str, Heads] = {}
    for rule in signals.jailbreak:
        asked = ("jailbreak", rule.name) in referenced
        if asked and rule.deployment and rule.method != "contrastive":
            out.setdefault(rule.deployment, Heads([])).jailbreak.append(rule)
    return out


def pii(
    signals: Signals, referenced: frozenset[SignalKey], modules: Modules | None
) -> dict[str, Heads]:
    """A rule naming a deployment (its token classifier; the others: the CPU step)."""
    out: dict[str, Heads] = {}
    for rule in signals.pii:
        if ("pii", rule.name) in referenced and rule.deployment:
            out.setdefault(rule.deployment, Heads([])).pii.append(rule)
    return out


def family_head(
    kind: str, rules: list[NamedSignal], referenced: frozenset[SignalKey]
) -> str | None:
    """A family whose rules compete for one label: all of them go where its first rule with a
    deployment says, when any of them is referenced."""
    dep = next((r.deployment for r in rules if r.deployment), None)
    return dep if dep and any((kind, r.name) in referenced for r in rules) else None


def user_feedback(
    signals: Signals, referenced: frozenset[SignalKey], modules: Modules | None
) -> dict[str, Heads]:
    dep = family_head("user_feedback", signals.user_feedbacks, referenced)
    return {dep: Heads([], feedbacks=list(signals.user_feedbacks))} if dep else {}


def fact_check(
    signals: Signals, referenced: frozenset[SignalKey], modules: Modules | None
) -> dict[str, Heads]:
    dep = family_head("fact_check", signals.fact_check, referenced)
    return {dep: Heads([], fact_checks=list(signals.fact_check))} if dep else {}


def safety(
    signals: Signals, referenced: frozenset[SignalKey], modules: Modules | None
) -> dict[str, Heads]:
    """A rule's head (its deployment, else ``system.safety``) and its hazard head; a rule or
    hazard with no head is ``signals_safety_builtin``'s."""
    out: dict[str, Heads] = {}
    for rule in signals.safety:
        if ("safety", rule.name) not in referenced:
            continue
        if rule.head is not None:
            out.setdefault(rule.head, Heads([])).safety.append(rule)
        if rule.hazard_head is not None:
            out.setdefault(rule.hazard_head, Heads([])).hazards.append(rule)
    return out


def domain(
    signals: Signals, referenced: frozenset[SignalKey], modules: Modules | None
) -> dict[str, Heads]:
    """Domains with ``method: classifier`` and a deployment: the deployment's whole label set,
    where one of them is referenced, at upstream's ``modules.classifier.domain.threshold``
    for labels whose domain sets none."""
    headed: dict[str, list[DomainSignal]] = {}
    for dom in signals.domains:
        if dom.method == "classifier" and dom.deployment:
            headed.setdefault(dom.deployment, []).append(dom)
    classifier = modules.classifier if modules is not None else None
    domain_module = classifier.domain if classifier is not None else None
    threshold = domain_module.threshold if domain_module is not None else None
    out: dict[str, Heads] = {}
    for dep, doms in headed.items():
        read = frozenset(d.name for d in doms if ("domain", d.name) in referenced)
        if read:
            out[dep] = Heads(
                [],
                domains=doms,
                referenced_domains=read,
                domain_threshold=DOMAIN_THRESHOLD if threshold is None else threshold,
            )
    return out
