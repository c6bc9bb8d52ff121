"""The ``safety`` signal family (upstream v0.4, ``pkg/classification`` safety rules), with
upstream's field names and defaults, answered by a deployment's classification head as
jailbreak is (vllm_sr/router/signals_heads.py): a rule's risk is the summed probability of its
``unsafe_labels``; it matches at ``threshold`` or more. With ``hazard``, a matched rule is
narrowed to the hazard categories: the best probability of its ``categories`` on the hazard
head must reach ``hazard.threshold`` too.

Which head answers: the rule's ``deployment``, else ``global.model_catalog.system.safety``
(the hazard: ``hazard.deployment``, else ``system.hazard``, else the rule's own head). A rule
with neither (upstream's built-in Vela Safety model) is answered zero-shot on the decision
deployment, as jailbreak ``method: classifier`` is without a head: built-in unsafe against
safe example sets, and for ``hazard`` with no hazard head the built-in hazard label sets
(``signal_classifiers.BUILTIN_LABELS``; another label is refused by name). A rule naming
upstream's external classifier (``model``) is refused by name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field, PrivateAttr

from vllm_sr.config.routing_base import Description, Strict, as_dict, as_list, problem, refusal
from vllm_sr.config.signal_classifiers import BUILTIN_LABELS

if TYPE_CHECKING:
    from vllm_sr.config.problems import Problem

DEFAULT_LABELS = ("safe", "unsafe")
DEFAULT_UNSAFE = ("unsafe",)


class SafetyHazard(Strict):
    model: str | None = None
    """Upstream: an external hazard classifier (refused: vllm-sr's heads are deployments)."""

    labels: list[str] = Field(default_factory=list, max_length=256)
    """The hazard head's whole label set, as upstream declares it (metadata: the head's own
    config.json id2label decides)."""

    categories: list[str] = Field(default_factory=list, max_length=256)
    """The hazards of interest: the best of their probabilities is the hazard risk."""

    threshold: float = Field(default=0.0, ge=0, le=1)
    """Least hazard risk for the rule to stay matched."""

    deployment: str | None = Field(default=None, max_length=63)
    """vllm-sr: the deployment whose head answers the hazard (unset: system.hazard, else the
    rule's own head)."""


class SafetySignal(Strict):
    name: str = Field(min_length=1, max_length=128)
    """The signal's name."""

    description: str | None = Description
    """Free text for people."""

    model: str | None = None
    """Upstream: an external safety classifier (refused: vllm-sr's heads are deployments)."""

    labels: list[str] = Field(default_factory=list, max_length=256)
    """The head's whole label set (unset: safe, unsafe), as upstream declares it (metadata:
    the head's own config.json id2label decides)."""

    unsafe_labels: list[str] = Field(default_factory=list, max_length=256)
    """Labels whose probabilities add up to the risk (unset: unsafe); case-insensitive."""

    threshold: float = Field(default=0.0, ge=0, le=1)
    """Least risk for a match (upstream: ``risk >= threshold``)."""

    hazard: SafetyHazard | None = None
    """Narrow a match to hazard categories (see the module docstring)."""

    deployment: str | None = Field(default=None, max_length=63)
    """vllm-sr: a deployment whose artifact is a safety sequence classifier (unset:
    global.model_catalog.system.safety)."""

    _system_safety: str | None = PrivateAttr(default=None)
    _system_hazard: str | None = PrivateAttr(default=None)

    @property
    def unsafe(self) -> frozenset[str]:
        return frozenset(x.lower() for x in (self.unsafe_labels or DEFAULT_UNSAFE))

    @property
    def head(self) -> str | None:
        """The deployment whose head answers the rule."""
        return self.deployment or self._system_safety

    @property
    def hazard_head(self) -> str | None:
        """The deployment whose head answers the hazard block (None: no hazard block)."""
        if self.hazard is None:
            return None
        return self.hazard.deployment or self._system_hazard or self.head

    def bind_system(self, safety: str | None, hazard: str | None) -> None:
        """``global.model_catalog.system.{safety, hazard}``: the defaults of ``head`` and
        ``hazard_head`` (RootConfig binds them at load)."""
        self._system_safety, self._system_hazard = safety, hazard


def safety_problems(
    routing: object,
    base: tuple[str | int, ...],
    deployments: set[str],
    system: object,
) -> list[Problem]:
    """The refusals and deployment names of one raw ``routing`` mapping's safety rules, given
    the declared deployments and the raw ``global.model_catalog.system``."""
    sys_map = as_dict(system)
    accepted = ", ".join(sorted(deployments)) or "(none declared)"
    problems: list[Problem] = []

    def named(path: tuple[str | int, ...], dep: object) -> None:
        if isinstance(dep, str) and dep not in deployments:
            problems.append(
                problem(path, f"{dep!r} names no deployment; accepted: one of {accepted}")
            )

    default_head = sys_map.get("safety")
    for i, raw in enumerate(as_list(as_dict(as_dict(routing).get("signals")).get("safety"))):
        rule = as_dict(raw)
        here = (*base, "signals", "safety", i)
        hazard = as_dict(rule.get("hazard"))
        if rule.get("model") is not None:
            problems.append(
                refusal(
                    (*here, "model"),
                    "a safety rule's external classifier (model)",
                    "deployment: a deployment whose artifact is a safety classification head",
                )
            )
        if hazard.get("model") is not None:
            problems.append(
                refusal(
                    (*here, "hazard", "model"),
                    "a hazard rule's external classifier (model)",
                    "hazard.deployment: a deployment whose artifact is a hazard head",
                )
            )
        head = rule.get("deployment") or default_head
        if head is None:  # the built-in unsafe/safe sets (and hazard labels)
            problems += _builtin_label_problems(
                (*here, "unsafe_labels"), rule.get("unsafe_labels"), ("unsafe", *BUILTIN_LABELS)
            )
        if hazard and (hazard.get("deployment") or sys_map.get("hazard") or head) is None:
            problems += _builtin_label_problems(
                (*here, "hazard", "categories"), hazard.get("categories"), BUILTIN_LABELS
            )
        # (the rule's own deployment is checked with every DEPLOYMENT_LISTS entry's)
        named((*here, "hazard", "deployment"), hazard.get("deployment"))
    return problems


def _builtin_label_problems(
    path: tuple[str | int, ...], labels: object, known: tuple[str, ...]
) -> list[Problem]:
    return [
        refusal(
            (*path, j),
            f"the label {label!r} on a safety rule with no head (no deployment:, and no "
            "global.model_catalog.system.safety or .hazard)",
            "a deployment whose head has the label, or one of the built-in labels "
            + ", ".join(known),
        )
        for j, label in enumerate(as_list(labels))
        if isinstance(label, str) and label.lower() not in known
    ]


def system_problems(system: object, deployments: set[str]) -> list[Problem]:
    """``global.model_catalog.system.{safety, hazard}`` must name declared deployments."""
    sys_map = as_dict(system)
    accepted = ", ".join(sorted(deployments)) or "(none declared)"
    return [
        problem(
            ("global", "model_catalog", "system", role),
            f"{sys_map[role]!r} names no deployment; accepted: one of {accepted}",
        )
        for role in ("safety", "hazard")
        if isinstance(sys_map.get(role), str) and sys_map[role] not in deployments
    ]
