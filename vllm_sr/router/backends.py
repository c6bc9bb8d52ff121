"""The LLM backends chat requests go to: OpenAI-compatible servers named by
``providers.models[].backend_refs``.

- Spread: a chat goes to one of its model's usable backends in proportion to
  ``backend_refs[].weight`` (0 counts as 1, as upstream): a smooth weighted round robin
  (nginx's: deterministic, each backend's share exact over every sum-of-weights picks). Under
  concurrency the backends with the fewest chats in flight per unit of weight go first and the
  round robin breaks ties, so a slow backend is not sent more than it can answer;
  ``reliability.lb_policy: round_robin`` asks for the plain weighted round robin instead.
- Health: ``GET {api}/models`` every ``HEALTH_EVERY_S`` while healthy; after a failure
  (a failed check, or a proxied request that could not reach the server) the backend is
  unhealthy and re-checked after a doubling backoff (0.5 s to 30 s), as the pool does for
  replicas. :class:`BackendHealth` is that logic on a clock; :class:`BackendSet` runs it.
- Proxy: ``POST {api}/chat/completions`` with ``model`` rewritten to the name that backend
  expects (``external_model_ids[type]``, else ``provider_model_id``, else the name, as
  upstream); an SSE answer is streamed through chunk by chunk as it arrives, any other answer
  is passed through with the backend's status. A backend error that is not an OpenAI-style
  ``{"error": ...}`` body is wrapped in ours (``backend_error``); a backend that cannot be
  reached is a 502 ``backend_unavailable``.
- Credential (upstream's rules): the key is ``api_key``, else the environment variable
  ``api_key_env`` (read once, when the set is built, and never logged: only the variable's
  name is, when it is unset). It goes as ``<auth_header>: <auth_prefix> <key>``; the header and
  prefix default by ``provider`` (openai and unset: ``Authorization: Bearer``), and an empty
  ``auth_prefix`` counts as unset, as upstream. With no key, the caller's own value of that
  header is passed on (upstream's Envoy keeps the caller's header), so a client may bring its
  own key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from vllm_sr.backoff import Backoff
from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.config.routing import BackendRef, ProviderModel, Providers
from vllm_sr.errors import DeadlineExceeded, VllmSrError
from vllm_sr.httpserver import Request, Response, StreamResponse
from vllm_sr.pool.stats import LatencyWindow, RateWindow

log = logging.getLogger("vllm_sr.router.backends")

HEALTH_EVERY_S = 5.0
HEALTH_TIMEOUT_S = 3.0
BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 30.0
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 600.0  # between two chunks of an answer: a slow model may think for a while
MAX_ERROR_TEXT = 500


class BackendUnavailable(VllmSrError):
    code = "backend_unavailable"
    http_status = 502
    retryable = True


class BackendHealth:
    """A backend's health on a clock: ``unknown`` until the first check (requests may go
    there), ``healthy`` (re-checked every ``every_s``), ``unhealthy`` (re-checked after a
    doubling backoff)."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK, every_s: float = HEALTH_EVERY_S) -> None:
        self._clock = clock
        self.every_s = every_s
        self.backoff = Backoff(BACKOFF_INITIAL_S, BACKOFF_MAX_S, clock=clock)
        self.state = "unknown"
        self.next_check_at = clock.monotonic()
        self.last_error: str | None = None
        self.failures = 0

    @property
    def usable(self) -> bool:
        return self.state != "unhealthy"

    def due(self) -> bool:
        return self._clock.monotonic() >= self.next_check_at

    def record_success(self) -> None:
        self.state = "healthy"
        self.backoff.reset()
        self.next_check_at = self._clock.monotonic() + self.every_s

    def record_failure(self, reason: str) -> None:
        self.state = "unhealthy"
        self.failures += 1
        self.last_error = reason
        self.next_check_at = self._clock.monotonic() + self.backoff.next_delay()


# provider -> (auth header, auth prefix): upstream's providerTypeRegistry.
PROVIDER_AUTH: dict[str, tuple[str, str]] = {
    "openai": ("Authorization", "Bearer"),
    "anthropic": ("x-api-key", ""),
    "azure-openai": ("api-key", ""),
    "bedrock": ("Authorization", "Bearer"),
    "gemini": ("Authorization", "Bearer"),
    "vertex-ai": ("Authorization", "Bearer"),
    "minimax": ("Authorization", "Bearer"),
}
DEFAULT_AUTH = PROVIDER_AUTH["openai"]


def credential_header(ref: BackendRef) -> tuple[str, str]:
    """(header, prefix) for ``ref``'s key: the provider's defaults, overridden by
    ``auth_header`` / a non-empty ``auth_prefix``."""
    header, prefix = PROVIDER_AUTH.get(ref.provider or "", DEFAULT_AUTH)
    return ref.auth_header or header, ref.auth_prefix or prefix


def pricing_of(model: ProviderModel) -> dict[str, Any] | None:
    """The model's prices as reported (currency USD unless given), or None when it has none
    (upstream's rule: any price, or a currency alone)."""
    if model.pricing is None or not model.pricing.configured:
        return None
    doc = model.pricing.model_dump(exclude_none=True)
    doc["currency"] = model.pricing.currency or "USD"
    return doc


class Backend:
    """One backend ref of one model, with its health and request statistics."""

    def __init__(self, model: ProviderModel, ref: BackendRef, index: int, clock: Clock) -> None:
        self.model = model.name
        self.ref = ref
        self.id = ref.endpoint_name(model.name, index)  # upstream's endpoint id <model>_<name>
        self.name = self.id[len(model.name) + 1 :]
        self.model_id = model.model_id_for(ref)  # what the backend calls the model
        self.weight = ref.effective_weight
        self.api_base = ref.api_base()
        self.api_key_env = ref.api_key_env
        self.auth_header, self.auth_prefix = credential_header(ref)
        self._key = ref.api_key or (os.environ.get(ref.api_key_env) if ref.api_key_env else None)
        if ref.api_key_env and not self._key:
            log.warning(
                "backend %s of model %s: environment variable %s is unset; requests carry "
                "only the caller's own %s header",
                self.api_base,
                model.name,
                ref.api_key_env,
                self.auth_header,
            )
        self.health = BackendHealth(clock)
        self.latency = LatencyWindow(1024)
        self.rate = RateWindow(clock)
        self.requests = 0
        self.errors = 0
        self.inflight = 0
        self.rr_current = 0  # the smooth weighted round robin's running score

    def headers(self, caller: Mapping[str, str] | None = None) -> dict[str, str]:
        """The request headers: the configured credential, else the caller's own value of
        the credential header (``caller`` has lower-case names, as httpserver reads them)."""
        out = {"Content-Type": "application/json"}
        if self._key:
            out[self.auth_header] = (
                f"{self.auth_prefix} {self._key}" if self.auth_prefix else self._key
            )
        elif caller is not None and caller.get(self.auth_header.lower()):
            out[self.auth_header] = caller[self.auth_header.lower()]
        return out

    def record(self, seconds: float, ok: bool) -> None:
        self.requests += 1
        self.rate.add()
        self.latency.add(seconds)
        if not ok:
            self.errors += 1

    def inventory(self) -> dict[str, Any]:
        p50, p99 = self.latency.percentiles(0.5, 0.99)
        return {
            "model": self.model,
            "name": self.name,
            "id": self.id,
            "provider_model_id": self.model_id,
            "url": self.api_base,
            "weight": self.weight,
            "type": self.ref.endpoint_type,
            "provider": self.ref.provider,
            "state": self.health.state,
            "inflight": self.inflight,
            "requests": self.requests,
            "requests_per_s": round(self.rate.rate(), 3),
            "latency_p50_ms": None if p50 is None else round(p50 * 1000, 3),
            "latency_p99_ms": None if p99 is None else round(p99 * 1000, 3),
            "errors": self.errors,
            "health_failures": self.health.failures,
            "last_error": self.health.last_error,
        }


def weighted_pick(candidates: Sequence[Backend], *, least_request: bool = True) -> Backend:
    """One of ``candidates`` (non-empty) by smooth weighted round robin: every candidate's
    score grows by its weight, the highest score wins (first on ties) and gives back the
    weights' sum. With ``least_request`` only the candidates with the fewest chats in flight
    per unit of weight take part in the choice (all of them still gain their weight)."""
    total = 0
    for b in candidates:
        b.rr_current += b.weight
        total += b.weight
    pool: Sequence[Backend] = candidates
    if least_request:
        low = min(b.inflight / b.weight for b in candidates)
        pool = [b for b in candidates if b.inflight / b.weight == low]
    chosen = max(pool, key=lambda b: b.rr_current)
    chosen.rr_current -= total
    return chosen


class BackendSet:
    """Every model's backends; health checks in one task; the proxy."""

    def __init__(self, providers: Providers, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self.models: dict[str, list[Backend]] = {
            m.name: [Backend(m, ref, i, clock) for i, ref in enumerate(m.backend_refs)]
            for m in providers.models
        }
        self.pricing: dict[str, dict[str, Any] | None] = {
            m.name: pricing_of(m) for m in providers.models
        }
        self._least_request = {
            m.name: m.reliability is None or m.reliability.lb_policy != "round_robin"
            for m in providers.models
        }
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    def all(self) -> list[Backend]:
        return [b for group in self.models.values() for b in group]

    def healthy(self, model: str) -> bool:
        return any(b.health.usable for b in self.models.get(model, []))

    def pick(self, model: str) -> Backend:
        """A usable backend of ``model`` by weight (:func:`weighted_pick`); with none usable,
        the first (the request then reports the real error)."""
        group = self.models[model]
        usable = [b for b in group if b.health.usable]
        if not usable:
            return group[0]
        return weighted_pick(usable, least_request=self._least_request[model])

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self, *, health_checks: bool = True) -> None:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S
            )
            self._session = aiohttp.ClientSession(
                timeout=timeout, connector=aiohttp.TCPConnector(limit=1024)
            )
        if health_checks and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._health_loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("BackendSet.start() was not awaited")
        return self._session

    # -- health ------------------------------------------------------------------------------
    async def check(self, backend: Backend) -> None:
        url = f"{backend.api_base}/models"
        try:
            timeout = aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)
            async with self.session.get(url, headers=backend.headers(), timeout=timeout) as r:
                await r.read()
                if r.status != 200:
                    backend.health.record_failure(f"GET /models answered {r.status}")
                    return
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            backend.health.record_failure(f"GET /models failed: {type(exc).__name__}: {exc}")
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
            wait = min((b.health.next_check_at - now for b in self.all()), default=HEALTH_EVERY_S)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=max(0.01, wait))

    def mark_failed(self, backend: Backend, reason: str) -> None:
        backend.health.record_failure(reason)
        self._wake.set()

    def inventory(self) -> list[dict[str, Any]]:
        """Every backend's entry, each with its model's ``pricing`` (None: none configured)."""
        return [{**b.inventory(), "pricing": self.pricing[b.model]} for b in self.all()]

    # -- proxy -------------------------------------------------------------------------------
    async def proxy(
        self,
        backend: Backend,
        body: dict[str, Any],
        request: Request,
        headers: Mapping[str, str],
        *,
        upstream_model: str | None = None,
    ) -> Response | StreamResponse:
        """Send the chat to ``backend`` and answer ``request`` with what comes back, streamed
        through when it is SSE; ``headers`` are added to the answer. ``model`` is rewritten to
        ``upstream_model`` when given (a modelRef's LoRA goes by its own name, as upstream),
        else to the backend's name for the model."""
        model = upstream_model or backend.model_id
        payload = json.dumps({**body, "model": model}, ensure_ascii=False).encode()
        started = self.clock.monotonic()
        backend.inflight += 1
        ok = False
        try:
            async with self.session.post(
                f"{backend.api_base}/chat/completions",
                data=payload,
                headers=backend.headers(request.headers),
            ) as upstream:
                ok = upstream.status < 400
                if upstream.content_type == "text/event-stream" and ok:
                    streamed, ok = await _stream(upstream, request, headers)
                    return streamed
                return await _whole(backend, upstream, headers)
        except (aiohttp.ClientConnectionError, OSError) as exc:
            ok = False
            if isinstance(exc, aiohttp.ServerTimeoutError | TimeoutError):
                raise DeadlineExceeded(
                    f"backend {backend.api_base} of model {backend.model!r} sent nothing for "
                    f"{READ_TIMEOUT_S:g} s",
                    model=backend.model,
                ) from None
            self.mark_failed(backend, f"chat failed: {type(exc).__name__}: {exc}")
            raise BackendUnavailable(
                f"backend {backend.api_base} of model {backend.model!r} cannot be reached: "
                f"{type(exc).__name__}: {exc}",
                model=backend.model,
            ) from None
        finally:
            backend.inflight -= 1
            backend.record(self.clock.monotonic() - started, ok)


async def _stream(
    upstream: aiohttp.ClientResponse, request: Request, headers: Mapping[str, str]
) -> tuple[StreamResponse, bool]:
    """Chunks go out as they arrive. -> (the answer, whether the backend finished it)."""
    out = StreamResponse(upstream.status, "text/event-stream", {"Cache-Control": "no-cache"})
    out.headers.update(headers)
    await out.prepare(request)
    chunks = upstream.content.iter_any().__aiter__()
    while True:
        try:
            chunk = await chunks.__anext__()
        except StopAsyncIteration:
            break
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            # The status is already sent: the stream just ends, without "data: [DONE]".
            log.warning("backend stream broke after the answer began: %s", exc)
            return out, False
        try:
            await out.write(chunk)
        except (ConnectionError, OSError):
            return out, True  # the caller hung up; not the backend's fault
    with contextlib.suppress(ConnectionError, OSError):
        await out.write_eof()  # the caller may have hung up: not the backend's fault
    return out, True


async def _whole(
    backend: Backend, upstream: aiohttp.ClientResponse, headers: Mapping[str, str]
) -> Response:
    raw = await upstream.read()
    content_type = upstream.headers.get("Content-Type", "application/json")
    if upstream.status >= 400 and not _is_openai_error(raw):
        text = raw.decode("utf-8", "replace")[:MAX_ERROR_TEXT]
        err = {
            "error": {
                "code": "backend_error",
                "message": f"backend {backend.api_base} of model {backend.model!r} answered "
                f"{upstream.status}: {text}",
                "retryable": upstream.status >= 500 or upstream.status == 429,
            }
        }
        raw, content_type = json.dumps(err).encode(), "application/json"
    return Response(raw, upstream.status, content_type, dict(headers))


def _is_openai_error(raw: bytes) -> bool:
    try:
        doc = json.loads(raw)
    except ValueError:
        return False
    return isinstance(doc, dict) and isinstance(doc.get("error"), dict)
