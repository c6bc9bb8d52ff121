"""The LLM backends chat requests go to: OpenAI-compatible servers named by
``providers.models[].backend_refs`` (each a :class:`~vllm_sr.router.backend.Backend`), the
spread of chats over them, their health checks, and the one outbound client they share
(:mod:`vllm_sr.router.backend_client`; a chat's exchange is
:mod:`vllm_sr.router.backend_proxy`).

- Spread: a chat goes to one of its model's usable backends in proportion to
  ``backend_refs[].weight`` (0 counts as 1, as upstream): a smooth weighted round robin
  (nginx's: deterministic, each backend's share exact over every sum-of-weights picks). Under
  concurrency the backends with the fewest chats in flight per unit of weight go first and the
  round robin breaks ties, so a slow backend is not sent more than it can answer;
  ``reliability.lb_policy: round_robin`` asks for the plain weighted round robin instead
  (:func:`vllm_sr.cluster.picking.weighted_pick`).
- Health: ``GET {api}/models``, or ``GET <reliability.health_check_path>`` on the backend's
  server (within ``health_check_timeout``, default 3 s; 200 is healthy, anything else, a
  redirect too, is not) on the cluster's :class:`~vllm_sr.cluster.health.HealthProbe` schedule
  (``health_check_interval``, default 5 s), in one task; a chat that could not reach its
  backend marks it failed and wakes that task.
- Ejection (``reliability.consecutive_5xx``): :mod:`vllm_sr.router.backend_outlier`, one
  detector per model, fed by every chat's outcome; an ejected backend is not usable.
- Retries (``reliability.retry_count`` / ``retry_on``): :mod:`vllm_sr.router.backend_retry`
  says which failures are retried; :meth:`BackendSet.retry_pick` gives the next backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.cluster.picking import weighted_pick
from vllm_sr.config.routing_providers import Providers
from vllm_sr.httpserver import Response, StreamResponse
from vllm_sr.jsontypes import JsonObject
from vllm_sr.router.backend import HEALTH_EVERY_S, Backend, pricing_of
from vllm_sr.router.backend_client import BROKEN, MAX_CONNECTIONS, BackendClients
from vllm_sr.router.backend_outlier import OutlierDetector
from vllm_sr.router.backend_proxy import (
    AttemptFailed,
    BackendProxy,
    BackendUnavailable,
    Exchange,
)
from vllm_sr.router.backend_retry import RetryPolicy
from vllm_sr.router.selection.observations import ModelObservations

log = logging.getLogger("vllm_sr.router.backends")

# failure reasons that count as a 5xx for ejection (Envoy counts local-origin failures so)
EJECTING_REASONS = ("connect", "reset", "stream_first_chunk")


class BackendSet:
    """Every model's backends; health checks in one task; chats through the one client.
    ``max_connections`` caps the open connections to each backend origin (host and port)."""

    def __init__(
        self,
        providers: Providers,
        clock: Clock = SYSTEM_CLOCK,
        *,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.clock = clock
        self.models: dict[str, list[Backend]] = {
            m.name: [Backend(m, ref, i, clock) for i, ref in enumerate(m.backend_refs)]
            for m in providers.models
        }
        self.pricing: dict[str, JsonObject | None] = {
            m.name: pricing_of(m) for m in providers.models
        }
        self._least_request = {
            m.name: m.reliability is None or m.reliability.lb_policy != "round_robin"
            for m in providers.models
        }
        self.outliers = {m.name: OutlierDetector.of(m, clock) for m in providers.models}
        self.retry_policies = {m.name: RetryPolicy.of(m) for m in providers.models}
        self.observations = ModelObservations(clock)  # TTFT/TPOT per model (the selectors')
        self._max_connections = max_connections
        self._proxy: BackendProxy | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    def all(self) -> list[Backend]:
        return [b for group in self.models.values() for b in group]

    def usable(self, backend: Backend) -> bool:
        """Not unhealthy and not ejected."""
        return backend.health.usable and not self.outliers[backend.model].ejected(backend.index)

    def healthy(self, model: str) -> bool:
        return any(self.usable(b) for b in self.models.get(model, []))

    def pick(self, model: str) -> Backend:
        """A usable backend of ``model`` by weight (:func:`weighted_pick`); with none usable,
        the first (the request then reports the real error)."""
        group = self.models[model]
        usable = [b for b in group if self.usable(b)]
        if not usable:
            return group[0]
        return weighted_pick(usable, least_request=self._least_request[model])

    def retry_pick(self, model: str, tried: Sequence[Backend]) -> Backend | None:
        """A usable backend of ``model`` this chat has not tried, by weight; None if none."""
        usable = [b for b in self.models[model] if b not in tried and self.usable(b)]
        if not usable:
            return None
        return weighted_pick(usable, least_request=self._least_request[model])

    def has_other(self, model: str, tried: Sequence[Backend]) -> bool:
        """Whether ``model`` has a usable backend not in ``tried`` (no pick is made)."""
        return any(b not in tried and self.usable(b) for b in self.models[model])

    def retry_policy(self, model: str) -> RetryPolicy:
        return self.retry_policies[model]

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self, *, health_checks: bool = True) -> None:
        if self._proxy is None:
            clients = BackendClients(max_connections=self._max_connections, clock=self.clock)
            self._proxy = BackendProxy(clients, self.mark_failed)
        if health_checks and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._health_loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._proxy is not None:
            await self._proxy.clients.aclose()
            self._proxy = None

    @property
    def clients(self) -> BackendClients:
        """The outbound clients (``start()`` makes them)."""
        return self._started().clients

    def _started(self) -> BackendProxy:
        if self._proxy is None:
            raise RuntimeError("BackendSet.start() was not awaited")
        return self._proxy

    # -- health ------------------------------------------------------------------------------
    async def check(self, backend: Backend) -> None:
        try:
            client, prefix = self.clients.for_url(backend.api_base)
            path = backend.health_path or f"{prefix}/models"
            async with asyncio.timeout(backend.health_timeout_s):
                answer = await client.stream("GET", path, headers=backend.headers())
                try:
                    await answer.read()
                finally:
                    await answer.aclose()
        except BROKEN as exc:
            backend.health.record_failure(f"GET {path} failed: {type(exc).__name__}: {exc}")
            return
        if answer.status != 200:
            backend.health.record_failure(f"GET {path} answered {answer.status}")
            return
        backend.health.record_success()

    async def check_due(self) -> None:
        due = [b for b in self.all() if b.health.due()]
        if due:
            await asyncio.gather(*(self.check(b) for b in due))

    async def _health_loop(self) -> None:
        while True:
            await self.check_due()
            now = self.clock.monotonic()
            wait = min(
                (t - now for b in self.all() if (t := b.health.next_check_at) is not None),
                default=HEALTH_EVERY_S,
            )
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=max(0.01, wait))

    def mark_failed(self, backend: Backend, reason: str) -> None:
        backend.health.record_failure(reason)
        self._wake.set()

    def inventory(self) -> list[JsonObject]:
        """Every backend's entry, each with its model's ``pricing`` (None: none configured)."""
        return [
            {
                **b.inventory(),
                "pricing": self.pricing[b.model],
                "ejected_for_s": self.outliers[b.model].ejected_for(b.index),
                "ejections": self.outliers[b.model].states[b.index].times_ejected,
            }
            for b in self.all()
        ]

    # -- proxy -------------------------------------------------------------------------------
    async def proxy(self, backend: Backend, ex: Exchange) -> Response | StreamResponse:
        """Send ``ex`` to ``backend`` (:meth:`BackendProxy.proxy`; ``ex`` says how) and count it
        in the backend's requests, errors, latency and chats in flight, in its model's observed
        timings (``ex.tap`` is wrapped to see them) and in its outlier detector. A chat
        cancelled on our side (a looper's round that reached its quorum, a caller gone) is
        not the backend's fault: a request, never an error, a latency or an outlier's 5xx."""
        proxy = self._started()
        started = self.clock.monotonic()
        tap = self.observations.timing(backend.model, started, ex.tap)
        backend.inflight += 1
        ok = False
        cancelled = False
        failed_5xx: bool | None = None  # None: says nothing of the backend (caller's deadline)
        try:
            answer, ok = await proxy.proxy(backend, ex, tap)
            failed_5xx = answer.status >= 500
            return answer
        except AttemptFailed as exc:
            if exc.reason != "deadline":
                failed_5xx = exc.reason.startswith("http_5") or exc.reason in EJECTING_REASONS
            raise
        except BackendUnavailable:
            failed_5xx = True
            raise
        except asyncio.CancelledError:
            cancelled = True
            raise
        finally:
            backend.inflight -= 1
            if cancelled:
                backend.record_cancelled()
            else:
                backend.record(self.clock.monotonic() - started, ok)
            if failed_5xx is not None and self.outliers[backend.model].record(
                backend.index, failed_5xx
            ):
                log.warning(
                    "backend %s ejected for %.1f s after consecutive 5xx",
                    backend.id,
                    self.outliers[backend.model].ejected_for(backend.index) or 0.0,
                )
