"""The ``classifiers`` signal family (upstream ``config/classifier_signal.go``; ROUTER-REFERENCE
§2.19), with upstream's field names, and the built-in label sets vllm-sr answers with no head.

A rule leaf ``{type: classifier, name: NAME, label: LABEL}`` reads one label of the classifier
``NAME`` (its signal key is ``NAME:LABEL``); a leaf without ``label`` reads the classifier as a
whole (matched when one of its labels is). How a rule is answered
(vllm_sr/router/signals_classifiers.py):

- ``type: local`` with a head: the classifier's ``deployment:`` (vllm-sr), else
  ``routing.model_bindings["classifier.NAME"].deployment`` when it names a declared
  deployment; that deployment's sequence-classification head gives each label's probability;
- ``type: local`` with no head (upstream's ``model_path`` or a binding to a deployment the file
  does not declare, as v0.4's ``vault`` binds ``hazard``): zero-shot, on the decision
  deployment, from built-in example sets of upstream's hazard labels (:data:`BUILTIN_LABELS`);
  a label outside them is refused by name;
- ``type: llm`` (a chat model of ``global.model_catalog.external``, which vllm-sr refuses) is
  refused by name.

``model_path``, ``use_cpu`` and a binding's ``adapter``, ``contract``, ``head`` and
``operating_point`` are metadata (vllm-sr's heads are deployments; the operating point's file
is not read: every label is matched at :data:`LABEL_THRESHOLD`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, PrivateAttr

from vllm_sr.config.routing_base import Description, Strict, as_dict, as_list, problem, refusal
from vllm_sr.config.routing_tree import RuleLeaf, RuleNode

if TYPE_CHECKING:
    from vllm_sr.config.problems import Problem

# Upstream's hazard labels (v0.4 mom-v1's ``vault`` content-risk classifier, the hazard head's
# label set): the labels vllm-sr's built-in example sets know (signals_builtin.HAZARDS).
BUILTIN_LABELS: tuple[str, ...] = (
    "violence",
    "criminal_activity",
    "sexual_content",
    "child_exploitation",
    "hate",
    "harassment_abuse",
    "regulated_substances",
    "weapons",
    "self_harm",
    "privacy",
    "specialized_advice",
    "misinformation",
)
LABEL_THRESHOLD = 0.5
"""A label's operating point where vllm-sr has none of its own: each label matches at this
probability or more, scored independently (as a multi-label head's sigmoids are)."""

BINDING_PREFIX = "classifier."


class ClassifierSignal(Strict):
    name: str = Field(min_length=1, max_length=128)
    """The signal's name."""

    description: str | None = Description
    """Free text for people."""

    type: Literal["local", "llm"]
    """local (a head, else vllm-sr's built-in label sets) or llm (refused)."""

    model: str | None = Field(default=None, max_length=256)
    """llm: a global.model_catalog.external name (refused)."""

    model_path: str | None = Field(default=None, max_length=1000)
    """local: upstream's model path (metadata: vllm-sr's heads are deployments)."""

    labels: list[str] = Field(min_length=1, max_length=256)
    """The labels (matched case-insensitively against the head's)."""

    instructions: str | None = Field(default=None, max_length=20000)
    """llm: the instructions (refused with the type)."""

    use_cpu: bool = False
    """local: run on CPU (metadata)."""

    disable_rationale: bool | None = None
    """v0.4, llm: ask for no rationale with the label (refused with the type)."""

    deployment: str | None = Field(default=None, max_length=63)
    """vllm-sr: a deployment whose artifact is a sequence-classification head over the labels
    (unset: the model binding's deployment when declared, else the built-in label sets)."""

    _bound: str | None = PrivateAttr(default=None)

    @property
    def head(self) -> str | None:
        """The deployment whose head answers the rule (None: the built-in label sets)."""
        return self.deployment or self._bound

    def bind_deployment(self, deployment: str | None) -> None:
        """``routing.model_bindings["classifier.NAME"].deployment`` when it names a declared
        deployment (RootConfig binds it at load)."""
        self._bound = deployment


def bound_deployment(routing: object, name: str, deployments: set[str]) -> str | None:
    """The declared deployment ``routing.model_bindings["classifier.NAME"]`` names, if any."""
    bindings = as_dict(as_dict(routing).get("model_bindings"))
    dep = as_dict(bindings.get(BINDING_PREFIX + name)).get("deployment")
    return dep if isinstance(dep, str) and dep in deployments else None


def classifier_problems(
    routing: object, base: tuple[str | int, ...], deployments: set[str]
) -> list[Problem]:
    """The refusals of one raw ``routing`` mapping's classifiers (type llm; a label the built-in
    sets do not know on a classifier with no head) and its classifier leaves' labels."""
    problems: list[Problem] = []
    rules: dict[str, set[str]] = {}
    for i, raw in enumerate(as_list(as_dict(as_dict(routing).get("signals")).get("classifiers"))):
        rule = as_dict(raw)
        here = (*base, "signals", "classifiers", i)
        name = rule.get("name")
        labels = [x for x in as_list(rule.get("labels")) if isinstance(x, str)]
        if isinstance(name, str):
            rules[name] = set(labels)
        if rule.get("type") == "llm":
            problems.append(
                refusal(
                    (*here, "type"),
                    "a classifier of type 'llm' (a chat model of global.model_catalog.external)",
                    "type: local (a deployment's head, else the built-in labels "
                    + ", ".join(BUILTIN_LABELS)
                    + ")",
                )
            )
            continue
        headed = rule.get("deployment") is not None
        if not headed and isinstance(name, str):
            headed = bound_deployment(routing, name, deployments) is not None
        if headed:
            continue
        for j, label in enumerate(labels):
            if label.lower() not in BUILTIN_LABELS:
                problems.append(
                    refusal(
                        (*here, "labels", j),
                        f"the label {label!r} on a classifier with no head (no deployment:, and "
                        f"no model_bindings['{BINDING_PREFIX}{name}'] naming a declared "
                        "deployment)",
                        "a deployment: whose head has the label, or one of the built-in labels "
                        + ", ".join(BUILTIN_LABELS),
                    )
                )
    for i, dec in enumerate(as_list(as_dict(routing).get("decisions"))):
        path = (*base, "decisions", i, "rules")
        problems += _leaf_label_problems(as_dict(dec).get("rules"), path, rules)
    return problems


def _leaf_label_problems(
    node: object, path: tuple[str | int, ...], rules: dict[str, set[str]]
) -> list[Problem]:
    if isinstance(node, (RuleNode, RuleLeaf)):
        node = node.model_dump(exclude_none=True)
    tree = as_dict(node)
    if "operator" in tree or "type" not in tree:
        out: list[Problem] = []
        for j, child in enumerate(as_list(tree.get("conditions"))):
            out += _leaf_label_problems(child, (*path, "conditions", j), rules)
        return out
    kind, name, label = tree.get("type"), tree.get("name"), tree.get("label")
    if not (isinstance(kind, str) and kind.strip().lower() == "classifier"):
        return []
    known = rules.get(name) if isinstance(name, str) else None
    if known is None or not isinstance(label, str) or label in known:
        return []  # (an undeclared name is reported with every family's leaf names)
    return [
        problem(
            (*path, "label"),
            f"label {label!r} is not a label of classifier {name!r}; accepted: one of "
            + ", ".join(sorted(known)),
        )
    ]
