"""The questions a request asks the deployments, and their answers as signal inputs.

Only signals some decision references are evaluated (plus the signals complexity composers
and projections read). Per deployment, one request asks ONE bundle (``POST /v1/bundle``, see
vllm_sr/worker/surfaces.py) with ONE task ``query``: the embeddings (base64 float32) of the
request text and, when a referenced family reads them, of its prior user turns (reask) and
history (jailbreak ``include_history``). Everything else is computed here from those:

- embedding signals: the prototype score of the candidates' embeddings
  (``embedding_matching``: upstream's scoring, soft matching and ``top_k``; every declared
  embedding signal is evaluated once one is referenced, as upstream does);
- domain signals (``method: centroids``, the default): the labelled classification the
  worker's ``/v1/classify`` does (the same code, ``vllm_sr.worker.classify``): each domain's
  centroid is the normalised mean of its examples' embeddings (description + examples), the
  probabilities are ``softmax(cosine / 0.05)`` over every domain on the deployment, and the
  label is the best (a domain with ``mmlu_categories`` and no ``examples`` also takes our
  built-in examples of those categories, ``signals_builtin.MMLU_EXAMPLES``);
- a deployment whose domains say ``method: classifier`` (by configuration: the router does
  not probe the artifact) gets no embedding task for them: its head's ``classify`` task (the
  one every family's head rules on that deployment share) answers them (``signals_heads``);
  which rules each head answers is each family's ``HeadBuilder`` (``head_rules``, bound in
  ``families.HEAD_BUILDERS``), and the asks of the families bound in
  ``families.DEPLOYMENT_BUILDERS`` join the same bundle (the zero-shot ones read its ``query``
  row);
- on the decision deployment, the embedding-only families (complexity, reask, preference,
  jailbreak, kb, user_feedback, fact_check): ``signals_embedded``.

The candidates and the examples are embedded once per config generation (task
``candidates``, in :meth:`DeploymentQuestions.warm_bundle` or else in the first request's
bundle) and cached here, so a routed request costs one row of one forward, however many
signals ask. Texts go with ``truncate: true``: a long prompt is routed on its first tokens
rather than refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_signals import DomainSignal, EmbeddingSignal
from vllm_sr.config.signal_registry import FAMILIES
from vllm_sr.router import families as bound
from vllm_sr.router import head_rules
from vllm_sr.router.deployment_questions import DeploymentQuestions
from vllm_sr.router.embedding_matching import EmbeddingMatching
from vllm_sr.router.message_text import QUESTION, message_text
from vllm_sr.router.rules import SignalKey, leaves
from vllm_sr.router.signals import KeywordMatcher, SignalResult, keyword_matcher
from vllm_sr.router.signals_embedded import EmbeddedFamilies
from vllm_sr.router.signals_heads import Heads
from vllm_sr.router.signals_pii import PiiSignals
from vllm_sr.router.signals_projections import projection_inputs

if TYPE_CHECKING:
    from vllm_sr.config.upstream_catalog import KnowledgeBase
    from vllm_sr.config.upstream_modules import Modules
    from vllm_sr.router.family_deployment import DeploymentAsk


class QuestionPlan:
    """What one config generation asks: the referenced keyword matchers, and per deployment the
    referenced embedding signals, domain label set and (on the decision deployment) the
    embedding-only families, with their caches."""

    def __init__(
        self,
        routing: Routing,
        decision_deployment: str,
        wanted: set[SignalKey] | None = None,
        *,
        kbs: list[KnowledgeBase] | None = None,
        modules: Modules | None = None,
        embedding: EmbeddingMatching | None = None,
    ) -> None:
        self.referenced: set[SignalKey] = with_dependencies(
            routing,
            set(wanted)
            if wanted is not None
            else {key for dec in routing.decisions for key in leaves(dec.rules)},
        )
        sigs = routing.signals
        # upstream's embedding_config (scoring, soft matching, top_k: embedding_matching)
        self.embedding = embedding if embedding is not None else EmbeddingMatching()
        # soft matching and top_k have nothing to do on a plan with no embedding signal
        self.uses_embeddings = any(kind == "embedding" for kind, _ in self.referenced)
        if self.uses_embeddings:
            # Upstream evaluates the family's every rule once one is used: soft matching and
            # top_k compare them all.
            self.referenced |= {("embedding", e.name) for e in sigs.embeddings}
        # the authz rules a chat checks first, on the loop (they may refuse it)
        self.authz_keys = frozenset(k for k in self.referenced if k[0] == "authz")
        self.keywords: dict[str, KeywordMatcher] = {
            s.name: keyword_matcher(s)
            for s in sigs.keywords
            if ("keyword", s.name) in self.referenced
        }
        embeddings: dict[str, list[EmbeddingSignal]] = {}
        for e in sigs.embeddings:
            if ("embedding", e.name) in self.referenced:
                embeddings.setdefault(e.deployment or decision_deployment, []).append(e)
        domains: dict[str, list[DomainSignal]] = {}
        for d in sigs.domains:
            if d.method != "classifier" or not d.deployment:  # (else its head's: head_rules)
                domains.setdefault(d.deployment or decision_deployment, []).append(d)
        self.pii = PiiSignals(
            [p for p in sigs.pii if ("pii", p.name) in self.referenced and not p.deployment]
        )
        families = EmbeddedFamilies(sigs, self.referenced, kbs, modules)
        # The referenced families' bound evaluators by deployment (families.BINDINGS, table
        # order): their parts of each deployment's head, and their asks.
        heads: dict[str, Heads] = {}
        asks: dict[str, list[DeploymentAsk]] = {}
        referenced_keys = frozenset(self.referenced)
        referenced_kinds = {kind for kind, _ in referenced_keys}
        for name, binding in bound.BINDINGS.items():
            if name not in referenced_kinds:
                continue
            if binding.heads is not None:
                for dep, part in binding.heads(sigs, referenced_keys, modules).items():
                    heads[dep] = head_rules.merged(heads[dep], part) if dep in heads else part
            ask_builder = binding.deployment
            if ask_builder is not None:
                for dep, ask in ask_builder(sigs, referenced_keys, decision_deployment).items():
                    asks.setdefault(dep, []).append(ask)
        self.deployments: dict[str, DeploymentQuestions] = {}
        deps = set(embeddings) | set(domains) | set(heads) | set(asks)
        deps |= {decision_deployment} if families.active else set()
        for dep in sorted(deps):
            referenced = frozenset(
                d.name for d in domains.get(dep, []) if ("domain", d.name) in self.referenced
            )
            fam = families if dep == decision_deployment and families.active else None
            head = heads.get(dep)
            if (
                not embeddings.get(dep)
                and not referenced
                and fam is None
                and head is None
                and not asks.get(dep)
            ):
                continue  # only unreferenced domains there: nothing to ask
            self.deployments[dep] = DeploymentQuestions(
                dep,
                embeddings.get(dep, []),
                domains.get(dep, []) if referenced else [],
                referenced,
                fam,
                head,
                self.embedding,
                asks.get(dep, []),
            )

    def keyword_results(self, text: str) -> dict[SignalKey, SignalResult]:
        return {("keyword", name): m.score(text) for name, m in self.keywords.items()}


def with_dependencies(routing: Routing, keys: set[SignalKey]) -> set[SignalKey]:
    """``keys`` plus what they read: a referenced complexity rule's composer leaves, a
    referenced projection's inputs (transitively), as upstream's signal usage does."""
    out = set(keys)
    complexity = {c.name: c for c in routing.signals.complexity}
    pending = list(out)
    while pending:
        kind, name = pending.pop()
        more: set[SignalKey] = set()
        if kind == "complexity":
            rule = complexity.get(name.rsplit(":", 1)[0])
            if rule is not None and rule.composer is not None:
                more = set(leaves(rule.composer))
        elif kind == "projection":
            more = projection_inputs(routing, name)
        for key in more - out:
            out.add(key)
            pending.append(key)
    return out


def declared_keys(routing: Routing) -> set[SignalKey]:
    """Every declared signal of the families we evaluate, as rule leaves name them (for
    /api/v1/eval, which runs them all): the registry's leaf names, projection outputs, and
    every leaf a decision names (a whole classifier, ``{type: classifier, name}``, is no
    declared label but matches when any of its labels does)."""
    keys: set[SignalKey] = set()
    for row in FAMILIES:
        if row.supported and row.leaf_names is not None:
            keys |= {(row.name, name) for name in row.leaf_names(routing.signals)}
    keys |= {("projection", o.name) for m in routing.projections.mappings for o in m.outputs}
    keys |= {key for dec in routing.decisions for key in leaves(dec.rules)}
    return keys


def request_text(messages: object) -> str:
    """The last user message's text (the text parts of a multi-part content, joined by a
    newline); "" when there is none."""
    if not isinstance(messages, list):
        return ""
    for msg in reversed(messages):
        if not isinstance(msg, dict) or msg.get("role") != "user":
            continue
        return message_text(msg.get("content"), QUESTION)
    return ""
