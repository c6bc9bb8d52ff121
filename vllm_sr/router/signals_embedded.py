"""The signal families computed from embeddings alone, on the decision deployment: complexity,
reask, preference, jailbreak, kb, user_feedback and fact_check (upstream's field names,
defaults and confidences; ``ROUTER-REFERENCE.md`` §2.8-2.12, 2.18).

Every example text these families need (complexity's hard/easy candidates, preference
examples, jailbreak patterns, KB exemplars, the built-in prototypes of ``signals_builtin``) is
one list, :meth:`EmbeddedFamilies.bank_texts`, embedded once per config generation with the
deployment's other cached texts. Per request, the texts to embed are the current text plus,
when a referenced family reads them, the prior user turns (reask) and the history (jailbreak
``include_history``): :meth:`EmbeddedFamilies.query_texts`. Both travel in the deployment's one
bundle (``questions.py``); this module only scores vectors (the named banks and the
logistic/softmax at temperature 0.05 are ``signals_prototypes``').

Where upstream runs a trained classifier (jailbreak ``classifier``/``hybrid``, user_feedbacks,
fact_check) we score built-in prototype banks and turn the two-sided margin into a probability
with a logistic at temperature 0.05 (the temperature vllm-sr's label classification uses),
centred for jailbreak at upstream's contrastive default margin 0.10, so upstream's probability
thresholds keep a rough meaning. docs/router.md says how they
route upstream's probes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_sr.config.routing_kbs import manifest_labels
from vllm_sr.config.routing_signals import Signals
from vllm_sr.config.signal_embedded import COMPLEXITY_LEVELS as LEVELS
from vllm_sr.router import signals_builtin as builtin
from vllm_sr.router.rules import SignalKey, decision_value, leaves
from vllm_sr.router.signals import FloatArray, SignalResult
from vllm_sr.router.signals_prototypes import (
    PrototypeBanks,
    PrototypeOptions,
    logistic,
    softmax_best,
)
from vllm_sr.router.unknown import FAILED, Unknown

if TYPE_CHECKING:
    from vllm_sr.config.routing_tree import RuleLeaf, RuleNode
    from vllm_sr.config.signal_embedded import ComplexitySignal, JailbreakSignal, KBSignal
    from vllm_sr.config.upstream_catalog import KnowledgeBase
    from vllm_sr.config.upstream_modules import Modules
    from vllm_sr.router.request_view import RequestView

DEFAULT_REASK_THRESHOLD = 0.8
DEFAULT_CONTRASTIVE_THRESHOLD = 0.10
FEEDBACK_THRESHOLD = 0.7  # upstream modules.feedback_detector.threshold
FACT_CHECK_THRESHOLD = 0.6  # upstream hallucination_mitigation.fact_check.threshold
# A KB's label scores, matched labels, metric values and group scores, per chat.
KBScores = tuple[dict[str, float], set[str], dict[str, float], dict[str, float]]
Scored = dict[str, float]  # every bank's score for a chat's text (PrototypeBanks.scores)

Vectors = Callable[[str], FloatArray]  # a query text -> its normalised embedding


class EmbeddedFamilies:
    """The referenced rules of the embedding-only families on one deployment."""

    def __init__(
        self,
        signals: Signals,
        referenced: set[SignalKey],
        kbs: list[KnowledgeBase] | None = None,
        modules: Modules | None = None,
    ) -> None:
        names: dict[str, set[str]] = {}
        for kind, name in referenced:
            names.setdefault(kind, set()).add(name)
        # upstream's modules.complexity / modules.classifier.preference prototype_scoring
        opts = PrototypeOptions()
        complexity = modules.complexity if modules is not None else None
        complexity_opts = PrototypeOptions.of(complexity.prototype_scoring if complexity else None)
        classifier = modules.classifier if modules is not None else None
        preference = classifier.preference if classifier is not None else None
        preference_cfg = preference.prototype_scoring if preference is not None else None
        preference_opts = PrototypeOptions.of(preference_cfg)
        # the best preference must lead the runner-up by this much (0: any lead)
        margin = preference_cfg.margin_threshold if preference_cfg is not None else None
        self.preference_margin = max(0.0, margin or 0.0)
        self.complexity = [
            c
            for c in signals.complexity
            if any(f"{c.name}:{lv}" in names.get("complexity", set()) for lv in LEVELS)
        ]
        self.reasks = [r for r in signals.reasks if r.name in names.get("reask", set())]
        # Preferences compete (only the best can match): all of them are scored.
        self.preferences = list(signals.preferences) if names.get("preference", set()) else []
        # A classifier/hybrid rule with a deployment is that deployment's head's
        # (signals_heads); the others are scored here.
        self.jailbreak = [
            j
            for j in signals.jailbreak
            if j.name in names.get("jailbreak", set())
            and (j.method == "contrastive" or not j.deployment)
        ]
        self.kb_rules = [k for k in signals.kb if k.name in names.get("kb", set())]
        self.kb_metrics = {n for k, n in referenced if k == "kb_metric"}
        # With a deployment, these families are that deployment's head's (signals_heads).
        headed = {
            kind: any(r.deployment for r in rules)
            for kind, rules in (("feedback", signals.user_feedbacks), ("fact", signals.fact_check))
        }
        self.feedbacks = (
            list(signals.user_feedbacks)
            if names.get("user_feedback", set()) and not headed["feedback"]
            else []
        )
        self.fact_checks = (
            list(signals.fact_check)
            if names.get("fact_check", set()) and not headed["fact"]
            else []
        )
        self.banks = PrototypeBanks()
        for c in self.complexity:
            rule_opts = (
                PrototypeOptions.of(c.prototype_scoring) if c.prototype_scoring else complexity_opts
            )
            self.banks.add(f"complexity:{c.name}:hard", c.hard.candidates, rule_opts)
            self.banks.add(f"complexity:{c.name}:easy", c.easy.candidates, rule_opts)
        for p in self.preferences:
            own = [p.description] if p.description else []
            self.banks.add(f"preference:{p.name}", [*own, *p.examples], preference_opts)
        builtin_jb = False
        for j in self.jailbreak:
            if j.method == "contrastive":
                self.banks.add(f"jailbreak:{j.name}:jb", j.jailbreak_patterns, None)
                self.banks.add(f"jailbreak:{j.name}:benign", j.benign_patterns, None)
            else:
                builtin_jb = True
        if builtin_jb:
            self.banks.add("jailbreak:builtin:jb", builtin.JAILBREAK, None)
            self.banks.add("jailbreak:builtin:benign", builtin.BENIGN, None)
        self.kbs = self._knowledge_bases(kbs or [], opts)
        if self.feedbacks:
            for label, texts in builtin.FEEDBACK.items():
                self.banks.add(f"feedback:{label}", texts, opts)
        if self.fact_checks:
            for label, texts in builtin.FACT_CHECK.items():
                self.banks.add(f"fact_check:{label}", texts, opts)

    def _knowledge_bases(
        self, kbs: list[KnowledgeBase], default_opts: PrototypeOptions
    ) -> dict[str, KBIndex]:
        """The referenced knowledge bases' label banks (their manifests read now; the config
        rules checked they read) and their scoring structure."""
        wanted = {r.kb for r in self.kb_rules} | {m.split(":", 1)[0] for m in self.kb_metrics}
        out = {}
        for kb in kbs:
            if kb.name not in wanted:
                continue
            labels = manifest_labels(kb)
            opts = PrototypeOptions.of(kb.prototype_scoring) if kb.prototype_scoring else None
            for label, texts in labels.items():
                self.banks.add(f"kb:{kb.name}:{label}", texts, opts or default_opts)
            out[kb.name] = KBIndex.of(kb, sorted(labels))
        return out

    # -- what is embedded ----------------------------------------------------------------

    @property
    def active(self) -> bool:
        return bool(
            self.complexity
            or self.reasks
            or self.preferences
            or self.jailbreak
            or self.kbs
            or self.feedbacks
            or self.fact_checks
        )

    def bank_texts(self) -> list[str]:
        return self.banks.texts()

    def take(self, vectors: FloatArray) -> None:
        self.banks.take(vectors)

    def query_texts(self, view: RequestView) -> list[str]:
        """The request's texts beyond the current one that these rules read."""
        out: list[str] = []
        if self.reasks:
            out += [t.strip() for t in view.prior_user_texts if t.strip()]
        if any(j.include_history for j in self.jailbreak):
            out += history(view)
        return out

    def signal_keys(self) -> list[SignalKey]:
        keys: list[SignalKey] = []
        for c in self.complexity:
            keys += [("complexity", f"{c.name}:{lv}") for lv in LEVELS]
        keys += [("reask", r.name) for r in self.reasks]
        keys += [("preference", p.name) for p in self.preferences]
        keys += [("jailbreak", j.name) for j in self.jailbreak]
        keys += [("kb", k.name) for k in self.kb_rules]
        keys += [("kb_metric", m) for m in sorted(self.kb_metrics)]
        keys += [("user_feedback", f.name) for f in self.feedbacks]
        keys += [("fact_check", f.name) for f in self.fact_checks]
        return keys

    # -- scoring ------------------------------------------------------------------------

    def results(
        self, view: RequestView, vec: Vectors, text: str | None = None
    ) -> dict[SignalKey, SignalResult]:
        """``text``: the current text as embedded (upstream's sample of it; default the
        view's text)."""
        text = view.text if text is None else text
        out: dict[SignalKey, SignalResult] = {}
        if not text.strip():
            return out
        query = vec(text)
        scored = self.banks.scores(query)  # every bank's score for the text, at once
        for c in self.complexity:
            out.update(self._complexity(c, scored))
        out.update(self._reasks(view, query, vec))
        out.update(self._preferences(scored))
        for j in self.jailbreak:
            out[("jailbreak", j.name)] = self._jailbreak(j, view, query, vec)
        kb_scores = {name: index.scores(scored) for name, index in self.kbs.items()}
        for rule in self.kb_rules:
            got = kb_scores.get(rule.kb)
            out[("kb", rule.name)] = (
                self.kbs[rule.kb].result(rule, got) if got is not None else SignalResult.miss()
            )
        for metric in self.kb_metrics:
            kb_name, _, metric_name = metric.partition(":")
            value = kb_scores[kb_name][2].get(metric_name) if kb_name in kb_scores else None
            out[("kb_metric", metric)] = SignalResult(False, 0.0, value)
        if self.feedbacks:
            out.update(self._feedback(view, scored))
        if self.fact_checks:
            out.update(self._fact_check(scored))
        return out

    def _complexity(self, c: ComplexitySignal, scored: Scored) -> dict[SignalKey, SignalResult]:
        hard = scored[f"complexity:{c.name}:hard"]
        easy = scored[f"complexity:{c.name}:easy"]
        margin = hard - easy
        level = c.level(margin)
        return {
            ("complexity", f"{c.name}:{lv}"): SignalResult(lv == level, abs(margin), margin)
            if lv == level
            else SignalResult(False, 0.0, margin)
            for lv in LEVELS
        }

    def _reasks(
        self, view: RequestView, query: FloatArray, vec: Vectors
    ) -> dict[SignalKey, SignalResult]:
        if not self.reasks:
            return {}
        priors = [t.strip() for t in reversed(view.prior_user_texts) if t.strip()]
        sims = [float(vec(t) @ query) for t in priors]
        found: dict[str, tuple[float, int, int]] = {}
        for r in self.reasks:
            threshold = r.threshold or DEFAULT_REASK_THRESHOLD
            lookback = r.lookback_turns or 1
            if len(sims) < lookback:
                continue
            streak, least = 0, 1.0
            for i, s in enumerate(sims):
                if s < threshold:
                    break
                streak += 1
                if i < lookback:
                    least = min(least, s)
            if streak >= lookback:
                found[r.name] = (least, streak, lookback)
        top = max((lb for _, _, lb in found.values()), default=0)
        out: dict[SignalKey, SignalResult] = {}
        for r in self.reasks:
            hit = found.get(r.name)
            if hit is not None and hit[2] == top:
                out[("reask", r.name)] = SignalResult(True, hit[0], float(hit[1]))
            else:
                out[("reask", r.name)] = SignalResult.miss()
        return out

    def _preferences(self, scored: Scored) -> dict[SignalKey, SignalResult]:
        if not self.preferences:
            return {}
        ranked = sorted(
            ((scored[f"preference:{p.name}"], p) for p in self.preferences),
            key=lambda sp: (-sp[0], sp[1].name),
        )
        out = {("preference", p.name): SignalResult(False, 0.0, s) for s, p in ranked}
        best_score, best = ranked[0]
        runner_up = ranked[1][0] if len(ranked) > 1 else None
        leads = runner_up is None or best_score - runner_up >= self.preference_margin
        if (best.threshold <= 0 or best_score >= best.threshold) and leads:
            out[("preference", best.name)] = SignalResult(True, best_score, best_score)
        return out

    def _jailbreak(
        self, j: JailbreakSignal, view: RequestView, query: FloatArray, vec: Vectors
    ) -> SignalResult:
        vectors = [query]
        if j.include_history:
            vectors += [vec(t) for t in history(view)]
        contrastive = j.method == "contrastive"
        prefix = f"jailbreak:{j.name}" if contrastive else "jailbreak:builtin"
        margins = [
            self.banks.max_cos(f"{prefix}:jb", v) - self.banks.max_cos(f"{prefix}:benign", v)
            for v in vectors
        ]
        if contrastive:
            score = max(margins)
            threshold = j.threshold if j.threshold > 0 else DEFAULT_CONTRASTIVE_THRESHOLD
            return SignalResult(score >= threshold, max(0.0, min(1.0, score)), score)
        # Risk 0.5 at upstream's contrastive default margin (0.10), 0.05 per e-fold.
        risk = max(logistic(m - DEFAULT_CONTRASTIVE_THRESHOLD) for m in margins)
        return SignalResult(risk >= j.threshold and risk > 0, risk, risk)

    def _feedback(self, view: RequestView, scored: Scored) -> dict[SignalKey, SignalResult]:
        label, p = builtin.FEEDBACK_SATISFIED, 1.0
        if view.has_assistant_reply:
            label, p = softmax_best({lb: scored[f"feedback:{lb}"] for lb in builtin.FEEDBACK})
            if p < FEEDBACK_THRESHOLD:
                label = builtin.FEEDBACK_SATISFIED
        return {
            ("user_feedback", f.name): SignalResult(f.name == label, p if f.name == label else 0)
            for f in self.feedbacks
        }

    def _fact_check(self, scored: Scored) -> dict[SignalKey, SignalResult]:
        need = scored["fact_check:FACT_CHECK_NEEDED"]
        not_need = scored["fact_check:NO_FACT_CHECK_NEEDED"]
        p = logistic(need - not_need)
        label = builtin.FACT_CHECK_NEEDED if p >= FACT_CHECK_THRESHOLD else None
        label = label or builtin.NO_FACT_CHECK_NEEDED
        conf = p if label == builtin.FACT_CHECK_NEEDED else 1.0 - p
        return {
            ("fact_check", f.name): SignalResult(f.name == label, conf if f.name == label else 0)
            for f in self.fact_checks
        }


@dataclass(frozen=True)
class KBIndex:
    """One referenced knowledge base's scoring structure, read from its config once per
    generation (each chat then only looks its label banks' scores up): its labels (sorted)
    with their banks and thresholds, its groups with their members, and its group_margin
    metrics."""

    kb: KnowledgeBase
    labels: tuple[tuple[str, str, float], ...]  # (label, bank name, threshold)
    groups: tuple[tuple[str, tuple[str, ...], frozenset[str]], ...]  # (group, members, set)
    margins: tuple[tuple[str, str, str], ...]  # (metric, positive group, negative group)

    @staticmethod
    def of(kb: KnowledgeBase, labels: list[str]) -> KBIndex:
        thresholds = kb.label_thresholds or {}
        base = kb.threshold or 0.0
        return KBIndex(
            kb,
            tuple((lb, f"kb:{kb.name}:{lb}", thresholds.get(lb, base)) for lb in labels),
            tuple((g, tuple(m), frozenset(m)) for g, m in (kb.groups or {}).items()),
            tuple(
                (m.name, m.positive_group or "", m.negative_group or "")
                for m in kb.metrics or []
                if m.type == "group_margin"
            ),
        )

    def scores(self, scored: Scored) -> KBScores:
        """The KB's label scores, matched labels, metric values (upstream's
        ``kb_metric:<kb>:<metric>``: group_margin metrics, best_score, best_matched_score)
        and group scores."""
        scores: dict[str, float] = {}
        matched: set[str] = set()
        matched_scores: list[float] = []
        for lb, bank, threshold in self.labels:
            s = scores[lb] = scored[bank]
            if s >= threshold:
                matched.add(lb)
                matched_scores.append(s)
        get = scores.get
        groups = {
            g: max([get(lb, 0.0) for lb in members], default=0.0) for g, members, _ in self.groups
        }
        metrics = {
            "best_score": max(scores.values(), default=0.0),
            "best_matched_score": max(matched_scores, default=0.0),
        }
        for name, pos, neg in self.margins:
            metrics[name] = groups.get(pos, 0.0) - groups.get(neg, 0.0)
        return scores, matched, metrics, groups

    def result(self, rule: KBSignal, scored: KBScores) -> SignalResult:
        """A kb rule's result from the KB's :meth:`scores`."""
        scores, matched, _, groups = scored
        if rule.target.kind == "label":
            pool, hits = scores, matched
        else:
            pool = groups
            hits = {g for g, _, members in self.groups if not members.isdisjoint(matched)}
        target = rule.target.value
        score = pool.get(target, 0.0)
        if rule.match == "best":
            best = min(pool, key=lambda n: (-pool[n], n)) if pool else None
            hit = best == target
        else:
            hit = target in hits
        return SignalResult(hit, max(0.0, min(1.0, score)), score)


def apply_composers(signals: Signals, results: dict[SignalKey, SignalResult]) -> None:
    """A complexity rule's ``composer`` filters its level afterwards: when the composer's rule
    tree over the other signals does not match, the rule's level does not match either. With
    v0.4's ``composer.on_unknown`` an unknown tree counts as no_match (filters), match (keeps)
    or fail_request: every level of the rule is then unknown itself (the first unknown input's
    reason), so the decisions reading it apply their own on_unknown."""
    for rule in signals.complexity:
        if rule.composer is None:
            continue
        verdict = decision_value(rule.composer, results)
        why = _first_unknown(rule.composer, results) if verdict.unresolved else None
        for lv in LEVELS:
            key = ("complexity", f"{rule.name}:{lv}")
            res = results.get(key)
            if res is None or res.unknown is not None:
                continue
            if why is not None:
                results[key] = SignalResult.unknown_because(why)
            elif res.matched and not verdict.value.matched:
                results[key] = SignalResult(False, 0.0, res.value)


def _first_unknown(
    node: RuleNode | RuleLeaf | None, results: dict[SignalKey, SignalResult]
) -> Unknown:
    for key in leaves(node):
        res = results.get(key)
        if res is not None and res.unknown is not None:
            return Unknown(res.unknown.reason, f"composer input {key[0]}:{key[1]}")
    return Unknown(FAILED, "composer input unknown")


def history(view: RequestView) -> list[str]:
    """jailbreak/pii ``include_history``: the non-user and prior user texts, deduplicated,
    without the current text."""
    seen = {view.text.strip()}
    out = []
    for t in (*view.non_user_texts, *view.prior_user_texts):
        t = t.strip()
        if t and t not in seen:
            seen.add(t)
            out.append(t)
    return out
