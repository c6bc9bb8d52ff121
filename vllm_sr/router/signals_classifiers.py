"""The ``classifiers`` family (config: vllm_sr/config/signal_classifiers.py), the first family
bound through ``families.DEPLOYMENT_BUILDERS``: one :class:`ClassifierAsk` per deployment its
referenced rules go to, carried in that deployment's routing bundle.

Each rule gives every one of its labels a probability; the label's signal key is
``("classifier", "NAME:LABEL")`` (eval's ``signal_values`` / ``signal_confidences`` key
``classifier:NAME:LABEL``, its matched entry ``NAME:LABEL``, as upstream's
``evaluateGenericClassifierRule``). Every label is scored on its own and matches at
``LABEL_THRESHOLD`` (upstream's operating point path: a per-label threshold); a leaf naming the
classifier with no label (key ``NAME``) matches when one of its labels does, with the best
matched probability. Where the probabilities come from:

- a head (the rule's ``deployment:`` or its model binding's declared deployment): the head's
  ``classify`` answer on the request's current text (softmax, or per-label sigmoids for a
  multi-label head); a declared label the head does not answer makes the rule unknown
  (upstream's ``classifier_invalid_score``);
- no head: zero-shot on the decision deployment. Each label's built-in examples
  (``signals_builtin.HAZARDS``) are contrasted with a built-in benign set (``SAFE``): the
  label's probability is ``logistic((max cos(label) - max cos(safe) - MARGIN_CENTER) / 0.05)``,
  as jailbreak ``method: classifier`` without a head scores its risk, so a benign prompt
  matches no label. The example texts are embedded once per config generation (task
  ``classifier:banks``, sent until an answer fills the cache); the request's sampled text is
  the first row of the decision deployment's own ``query`` task, which every family there
  reads (one row per chat: ``DeploymentAsk.shares_query``).

:class:`LabelBanks` is that zero-shot scorer; the safety family's rules with no head use it
too (vllm_sr/router/signals_safety_builtin.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from vllm_sr.config.routing_signals import Signals
from vllm_sr.config.signal_classifiers import LABEL_THRESHOLD, ClassifierSignal
from vllm_sr.jsontypes import JsonObject, json_object
from vllm_sr.router import bundle
from vllm_sr.router import signals_builtin as builtin
from vllm_sr.router.deployment_questions import TASK_QUERY
from vllm_sr.router.family_deployment import DeploymentAsk
from vllm_sr.router.request_view import RequestView
from vllm_sr.router.rules import SignalKey
from vllm_sr.router.signals import FloatArray, SignalResult, normalize_rows
from vllm_sr.router.signals_heads import probabilities
from vllm_sr.router.signals_prototypes import PrototypeBanks, logistic
from vllm_sr.router.unknown import FAILED, Unknown

FAMILY = "classifier"
MARGIN_CENTER = 0.10  # probability 0.5 at this margin: jailbreak's (upstream's contrastive default)
UNSAFE = "unsafe"  # the safety family's built-in label: every hazard's examples
SAFE_BANK = ":safe"


class LabelBanks:
    """Built-in example sets of some labels and the benign set they are contrasted with,
    embedded once; a query's per-label probabilities."""

    def __init__(self, labels: Iterable[str]) -> None:
        self.labels = sorted({label.lower() for label in labels})
        self.banks = PrototypeBanks()
        for label in self.labels:
            if label == UNSAFE:
                texts = [t for examples in builtin.HAZARDS.values() for t in examples]
            elif label in builtin.HAZARDS:
                texts = list(builtin.HAZARDS[label])
            else:  # (a config loaded with its file rules refuses it by name)
                raise ValueError(f"label {label!r} has no built-in examples")
            self.banks.add(label, texts, None)
        self.banks.add(SAFE_BANK, builtin.SAFE, None)
        self.cached = False

    def texts(self) -> list[str]:
        return self.banks.texts()

    def take(self, vectors: FloatArray) -> None:
        if vectors.shape[0] != len(self.texts()):
            raise ValueError(f"{vectors.shape[0]} embeddings for {len(self.texts())} examples")
        self.banks.take(normalize_rows(vectors))
        self.cached = True

    def probabilities(self, query: FloatArray) -> dict[str, float]:
        """One normalised query vector -> each label's probability."""
        safe = self.banks.max_cos(SAFE_BANK, query)
        return {
            label: logistic(self.banks.max_cos(label, query) - safe - MARGIN_CENTER)
            for label in self.labels
        }


@dataclass
class ZeroShot:
    """A family's zero-shot questions on the decision deployment: its banks' task (named
    ``<family>:banks``, until an answer fills the cache) and the probabilities of the request
    text, the first row of the deployment's ``query`` task (shared: the ask's
    ``shares_query``)."""

    family: str
    banks: LabelBanks

    def tasks(self, view: RequestView) -> list[JsonObject]:
        if self.banks.cached:
            return []
        return [bundle.embed_task(f"{self.family}:banks", self.banks.texts())]

    def probabilities(self, answers: Mapping[str, object]) -> dict[str, float]:
        """ValueError when the answers lack the query's (or, uncached, the banks') rows."""
        try:
            if f"{self.family}:banks" in answers:
                self.banks.take(bundle.embeddings(answers[f"{self.family}:banks"]))
            if not self.banks.cached:
                raise ValueError("no example embeddings")
            rows = bundle.embeddings(answers.get(TASK_QUERY))
        except bundle.BundleAnswerError as exc:
            raise ValueError(str(exc)) from None
        if rows.shape[0] < 1:
            raise ValueError("no query embedding for the request's text")
        return self.banks.probabilities(normalize_rows(rows[:1])[0])


@dataclass
class ClassifierAsk:
    """The referenced classifier rules on one deployment: those its head answers and (on the
    decision deployment) those answered by the built-in label sets."""

    headed: list[ClassifierSignal]
    builtin: list[ClassifierSignal]
    wanted: frozenset[SignalKey]
    zero_shot: ZeroShot | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.builtin:
            labels = {label for rule in self.builtin for label in rule.labels}
            self.zero_shot = ZeroShot(FAMILY, LabelBanks(labels))

    @property
    def family(self) -> str:
        return FAMILY

    @property
    def shares_query(self) -> bool:
        return self.zero_shot is not None  # a head alone reads no embedding

    def signal_keys(self) -> list[SignalKey]:
        keys: list[SignalKey] = []
        for rule in (*self.headed, *self.builtin):
            keys += [(FAMILY, f"{rule.name}:{label}") for label in rule.labels]
            if (FAMILY, rule.name) in self.wanted:
                keys.append((FAMILY, rule.name))
        return keys

    def tasks(self, view: RequestView) -> list[JsonObject]:
        tasks: list[JsonObject] = []
        if self.headed:
            tasks.append({"id": FAMILY, "classify": {"input": [view.text], "truncate": True}})
        if self.zero_shot is not None:
            tasks += self.zero_shot.tasks(view)
        return tasks

    def results(
        self, answers: Mapping[str, object], view: RequestView
    ) -> dict[SignalKey, SignalResult]:
        out: dict[SignalKey, SignalResult] = {}
        if self.headed:
            answer = json_object(answers.get(FAMILY))
            rows = answer.get("data") if answer is not None else None
            if not isinstance(rows, list) or len(rows) != 1:
                raise ValueError("no classify row for the text")
            probs = {k.lower(): p for k, p in probabilities(rows[0]).items()}
            for rule in self.headed:
                out.update(self._rule(rule, probs))
        if self.zero_shot is not None:
            probs = self.zero_shot.probabilities(answers)
            for rule in self.builtin:
                out.update(self._rule(rule, probs))
        return out

    def _rule(
        self, rule: ClassifierSignal, probs: dict[str, float]
    ) -> dict[SignalKey, SignalResult]:
        keys = [(FAMILY, f"{rule.name}:{label}") for label in rule.labels]
        whole = (FAMILY, rule.name)
        missing = [label for label in rule.labels if label.lower() not in probs]
        if missing:
            why = Unknown(
                FAILED, f"classifier_invalid_score: the head gives no score for {missing[0]!r}"
            )
            asked = (*keys, *((whole,) if whole in self.wanted else ()))
            return {key: SignalResult.unknown_because(why) for key in asked}
        out: dict[SignalKey, SignalResult] = {}
        best: float | None = None
        for key, label in zip(keys, rule.labels, strict=True):
            p = probs[label.lower()]
            hit = p >= LABEL_THRESHOLD
            out[key] = SignalResult(hit, p, p)
            if hit and (best is None or p > best):
                best = p
        if whole in self.wanted:
            top = max(probs[label.lower()] for label in rule.labels)
            out[whole] = SignalResult(best is not None, best or 0.0, top)
        return out


def asked(rule: ClassifierSignal, referenced: frozenset[SignalKey]) -> bool:
    """Whether a leaf reads the rule (by its name, or one of its labels)."""
    prefix = f"{rule.name}:"
    return any(
        kind == FAMILY and (name == rule.name or name.startswith(prefix))
        for kind, name in referenced
    )


def build(
    signals: Signals, referenced: frozenset[SignalKey], decision_deployment: str
) -> dict[str, DeploymentAsk]:
    """The referenced rules' asks by deployment: a rule with a head on its head's deployment,
    one with none (type local) on the decision deployment."""
    by_dep: dict[str, tuple[list[ClassifierSignal], list[ClassifierSignal]]] = {}
    for rule in signals.classifiers:
        if rule.type != "local" or not asked(rule, referenced):
            continue  # (type llm is refused at load)
        head = rule.head
        slots = by_dep.setdefault(head or decision_deployment, ([], []))
        (slots[0] if head is not None else slots[1]).append(rule)
    return {
        dep: ClassifierAsk(headed, builtin_rules, referenced)
        for dep, (headed, builtin_rules) in by_dep.items()
    }
