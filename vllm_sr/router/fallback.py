"""Retries and backend fallback before the first byte: when the chosen model's backend fails
before any byte of its answer reached the caller (it cannot be reached or resets the
connection, answers 429 or 5xx, or its stream fails before its first chunk), the chat is first
retried on the model's other usable backends when its ``reliability`` asks for it
(``retry_count`` times at most, for the failures ``retry_on`` names:
vllm_sr/router/backend_retry.py), then goes to the decision's next ``modelRefs`` entry
(decision order) with a healthy backend, then to ``default_model``, while the caller's
deadline (``X-Request-Timeout-Ms``) lasts. Never after a byte went out: a stream that breaks
later just ends, as before.

Only routed chats whose decision matched fall back (a chat naming a model asked for that model;
a chat no decision matched is already on ``default_model``); retries apply to every chat. The
answer's ``x-vsr-selected-model`` is the model that answered; ``x-vsr-backend-fallback`` lists
the ones that failed as ``model:reason`` (reasons: ``connect``, ``reset``, ``http_<status>``,
``stream_first_chunk``, ``deadline``), and ``x-vsr-backend-retries`` the backends a chat was
retried away from as ``backend id:reason``.

:func:`forward` is the one way a body goes to a model: the chat's own answer, and each
internal call of a looper (vllm_sr/router/looper), go through it. Top down: it asks
vllm_sr/router/outgoing.py for each attempt's body and vllm_sr/router/backends.py for the
backend and the exchange; nothing it calls calls back."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Literal

from vllm_sr.config.routing import ModelRef
from vllm_sr.config.routing_plugins import DecisionPlugins
from vllm_sr.config.routing_providers import ProviderModel, Providers
from vllm_sr.errors import Unavailable
from vllm_sr.httpserver import Request, Response, StreamResponse, error_response
from vllm_sr.jsontypes import JsonObject
from vllm_sr.router import outgoing
from vllm_sr.router.answers import answer_headers
from vllm_sr.router.backend_proxy import AnswerTap, AttemptFailed, Exchange, StreamRewrite
from vllm_sr.router.plugins.replay import TeeTap
from vllm_sr.router.route import RouteResult, RouterStats

if TYPE_CHECKING:
    from vllm_sr.config.routing import ModelRef
    from vllm_sr.router.backend import Backend
    from vllm_sr.router.backends import BackendSet

log = logging.getLogger("vllm_sr.router.chat")

H_BACKEND_FALLBACK = "x-vsr-backend-fallback"
H_BACKEND_RETRIES = "x-vsr-backend-retries"


def candidates(
    result: RouteResult, default_model: str, healthy: Callable[[str], bool]
) -> list[tuple[str, ModelRef | None]]:
    """(model, modelRef) in the order they are tried: the chosen one first."""
    out: list[tuple[str, ModelRef | None]] = [(result.model, result.model_ref)]
    if not result.routed or result.decision is None:
        return out
    seen = {result.model}
    for ref in result.decision_refs:
        if ref.model not in seen and healthy(ref.model):
            out.append((ref.model, ref))
            seen.add(ref.model)
    if default_model not in seen and healthy(default_model):
        out.append((default_model, None))
    return out


def failure_header(failed: list[tuple[str, str]]) -> str:
    return ",".join(f"{model}:{reason}" for model, reason in failed)


@dataclass(slots=True)  # one per attempt: not frozen (a frozen __init__ sets each field by a call)
class Attempt:
    """One backend a chat was sent to: the model, the backend's id, and ``answered`` or the
    reason it failed before its first byte."""

    model: str
    backend: str
    outcome: str


class Attempts:
    """The backends one chat tries, in order: for each model of ``order``, a picked backend,
    then (``record`` of a failure its retry policy covers) another usable backend of the model
    not tried yet, then the next model; all while ``deadline`` (a clock time) lasts."""

    def __init__(
        self,
        order: list[tuple[str, ModelRef | None]],
        backends: BackendSet,
        deadline: float | None,
    ) -> None:
        self.order = order
        self.backends = backends
        self.deadline = deadline
        self.failed: list[tuple[str, str]] = []  # (model fallen back from, reason)
        self.retried: list[tuple[str, str]] = []  # (backend id retried away from, reason)
        self.tried: list[Attempt] = []  # every backend tried, in order
        self.last: AttemptFailed | None = None
        self.fell_back_from_last = False  # the last failure moved the chat to another model
        self.model = order[0][0]
        self._i = 0
        self._tried: list[Backend] = []
        self._next: Backend | None = None

    def remaining(self) -> float | None:
        """Seconds left of the caller's deadline (None: no deadline)."""
        if self.deadline is None:
            return None
        return self.deadline - self.backends.clock.monotonic()

    def _time_left(self) -> bool:
        left = self.remaining()
        return left is None or left > 0

    def next(self) -> tuple[int, str, ModelRef | None, Backend] | None:
        """(index in order, model, modelRef, backend) to try now; None when nothing is left
        or the deadline ran out after a failure."""
        if self._i >= len(self.order) or (self.last is not None and not self._time_left()):
            return None
        self.model, ref = self.order[self._i]
        if self._next is None:
            self._next = self.backends.pick(self.model)
        return self._i, self.model, ref, self._next

    def more_after(self, backend: Backend) -> bool:
        """Whether something could still be tried if ``backend`` fails now (another model,
        or a retry): then its failure before the first byte comes back to ``record``."""
        if self._i < len(self.order) - 1:
            return True
        policy = self.backends.retry_policy(self.model)
        tried = [*self._tried, backend]
        return policy.count >= len(tried) and self.backends.has_other(self.model, tried)

    def answered(self, backend: Backend) -> None:
        self.tried.append(Attempt(self.model, backend.id, "answered"))

    def record(self, backend: Backend, exc: AttemptFailed) -> Literal["retry", "fallback", "last"]:
        """A failure of ``backend`` -> what happens next: a retry on another backend of the
        model, a fallback to the next model, or nothing (the last model's own failure)."""
        self.last = exc
        self.tried.append(Attempt(self.model, backend.id, exc.reason))
        self._tried.append(backend)
        policy = self.backends.retry_policy(self.model)
        if policy.retries(exc.reason, len(self._tried) - 1) and self._time_left():
            other = self.backends.retry_pick(self.model, self._tried)
            if other is not None:
                log.info("backend %s failed (%s); retrying on %s", backend.id, exc.reason, other.id)
                backend.retried_from += 1
                self.retried.append((backend.id, exc.reason))
                self._next = other
                return "retry"
        self._i += 1
        self._tried, self._next = [], None
        self.fell_back_from_last = self._i < len(self.order)
        if not self.fell_back_from_last:
            return "last"
        log.info(
            "model %s failed before its first byte (%s); trying the next", self.model, exc.reason
        )
        self.failed.append((self.model, exc.reason))
        return "fallback"

    def headers(self) -> dict[str, str]:
        """The answer headers that say what failed so far."""
        out = {}
        if self.failed:
            out[H_BACKEND_FALLBACK] = failure_header(self.failed)
        if self.retried:
            out[H_BACKEND_RETRIES] = failure_header(self.retried)
        return out


@dataclass(frozen=True)
class Upstream:
    """What :func:`forward` sends with, per config generation: the backends, the providers
    (default model, each model's reasoning family) and the counters."""

    backends: BackendSet
    providers: Providers
    stats: RouterStats

    @cached_property
    def models(self) -> dict[str, ProviderModel]:
        """The providers' models by name (built once, on the first chat)."""
        return {m.name: m for m in self.providers.models}


@dataclass
class Forwarded:
    """:func:`forward`'s outcome: the answer, the model that answered, the models that failed
    with their reasons, and every backend attempt."""

    answer: Response | StreamResponse
    answered_by: str
    failed: list[tuple[str, str]]
    attempts: list[Attempt]


@dataclass
class Sending:
    """How a body is sent (besides where): whether the answer carries the debug headers, the
    caller's deadline (a clock time), the taps on the chosen model's answer and on every
    answer, headers added to the answer, the stream rewrite (the Responses API's events), and
    a list that gets the plugins' effects on the first attempt's body."""

    debug: bool = False
    deadline: float | None = None
    chosen_tap: AnswerTap | None = None
    tap: AnswerTap | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    rewrite: StreamRewrite | None = None
    effects: list[str] | None = None


async def forward(
    up: Upstream,
    body: JsonObject,
    result: RouteResult,
    plugins: DecisionPlugins,
    request: Request,
    how: Sending,
) -> Forwarded:
    """``body`` to ``result``'s model: retried on the model's other backends, then falling
    back to the decision's other models and ``default_model`` before the first byte; each
    attempt's body shaped by the decision's plugins (vllm_sr/router/outgoing.py)."""
    backends = up.backends
    order = candidates(result, up.providers.defaults.default_model, backends.healthy)
    attempts = Attempts(order, backends, how.deadline)
    changes = outgoing.header_changes(plugins)
    if how.effects is not None and (changes.set or changes.drop):
        how.effects.append("header_mutation")
    while (step := attempts.next()) is not None:
        i, model, ref, backend = step
        attempt = result if i == 0 else dataclasses.replace(result, model=model, model_ref=ref)
        sent = outgoing.shape(
            body,
            attempt,
            backend,
            plugins,
            up.models[model],
            up.providers.defaults,
            how.effects if not attempts.tried else None,
        )
        headers = answer_headers(attempt, debug=how.debug)
        headers.update(how.headers)
        headers.update(attempts.headers())
        try:
            exchange = Exchange(
                sent,
                request,
                headers,
                upstream_model=ref.lora_name if ref is not None else None,
                early_failure=attempts.more_after(backend),
                first_byte_timeout_s=attempts.remaining(),
                tap=_tap(how.chosen_tap if i == 0 else None, how.tap),
                extra_headers=changes.set,
                drop_headers=changes.drop,
                rewrite=how.rewrite,
            )
            answer = await backends.proxy(backend, exchange)
            attempts.answered(backend)
            return Forwarded(answer, model, attempts.failed, attempts.tried)
        except AttemptFailed as exc:
            if attempts.record(backend, exc) == "fallback":
                up.stats.backend_fallbacks[(model, exc.reason)] += 1
    last = attempts.last
    assert last is not None
    if not attempts.fell_back_from_last:
        # the last model's own failure: its answer, as without retries
        if last.answer is None:
            raise last.error or Unavailable("no backend answered")
        return Forwarded(last.answer, attempts.model, attempts.failed, attempts.tried)
    answer = last.answer or error_response(last.error or Unavailable("no backend answered"))
    answer.headers.update(attempts.headers())
    return Forwarded(answer, attempts.failed[-1][0], attempts.failed, attempts.tried)


def _tap(chosen: AnswerTap | None, every: AnswerTap | None) -> AnswerTap | None:
    """The taps on one attempt's answer as one (none: no tap)."""
    if chosen is None:
        return every
    if every is None:
        return chosen
    return TeeTap(chosen, every)
