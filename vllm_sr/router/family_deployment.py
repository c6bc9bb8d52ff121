"""The shape of a model-backed family's evaluator (``deployment`` in
``vllm_sr.config.signal_registry``) for families beyond the built-in questions of
:class:`~vllm_sr.router.deployment_questions.DeploymentQuestions`. ``vllm_sr/router/families.py``
binds such a family to a :data:`DeploymentBuilder` in ``DEPLOYMENT_BUILDERS``;
:class:`~vllm_sr.router.questions.QuestionPlan` builds the referenced ones once per config
generation, one :class:`DeploymentAsk` per deployment its rules name, and each deployment's
routing bundle carries the ask's tasks and hands it the answers to read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from vllm_sr.config.routing_signals import Signals
    from vllm_sr.jsontypes import JsonObject
    from vllm_sr.router.request_view import RequestView
    from vllm_sr.router.rules import SignalKey
    from vllm_sr.router.signals import SignalResult


class DeploymentAsk(Protocol):
    """One family's referenced rules on one deployment: what its bundle asks and how the
    answers read as results. Task ids are the family's own (start them with its name): they
    share the bundle with the deployment's other tasks."""

    @property
    def family(self) -> str: ...

    @property
    def shares_query(self) -> bool:
        """The ask reads the request text's embedding from the deployment's own ``query`` task
        (``deployment_questions.TASK_QUERY``, whose first row is the request's sampled text)
        rather than embedding it in a task of its own: the deployment then sends that task
        (one row per chat however many families read it) and :meth:`results` finds its body
        in the answers."""
        ...

    def signal_keys(self) -> list[SignalKey]:
        """The results :meth:`results` gives (and that fail together when the deployment does)."""
        ...

    def tasks(self, view: RequestView) -> list[JsonObject]:
        """The bundle tasks this request needs (``bundle.embed_task`` or a head's task)."""
        ...

    def results(
        self, answers: Mapping[str, object], view: RequestView
    ) -> dict[SignalKey, SignalResult]:
        """The answers' bodies by task id (the ask's own tasks', and the deployment's
        ``query`` task's where it shares it) -> results; raises ``ValueError`` when an answer
        is missing or unreadable (the deployment's signals then fail as a bad answer)."""
        ...


DeploymentBuilder = Callable[["Signals", "frozenset[SignalKey]", str], "dict[str, DeploymentAsk]"]
"""The family's asks from the generation's signals, the referenced keys and the decision
deployment (where a rule naming none goes): by deployment, none where nothing is referenced."""
