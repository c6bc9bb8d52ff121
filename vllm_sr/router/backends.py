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
import errno
import json
import logging
import os
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

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
T = TypeVar("T")


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
        early_failure: bool = False,
        first_byte_timeout_s: float | None = None,
        tap: AnswerTap | None = None,
        extra_headers: Mapping[str, str] | None = None,
        drop_headers: Sequence[str] = (),
    ) -> Response | StreamResponse:
        """Send the chat to ``backend`` and answer ``request`` with what comes back, streamed
        through when it is SSE; ``headers`` are added to the answer. ``model`` is rewritten to
        ``upstream_model`` when given (a modelRef's LoRA goes by its own name, as upstream),
        else to the backend's name for the model.

        With ``early_failure``, a failure before the first byte reached the caller (the backend
        cannot be reached or reset the connection, answered 429 or 5xx, or its stream broke or
        ended before its first chunk, or nothing came within ``first_byte_timeout_s``) raises
        :class:`AttemptFailed` instead of answering, so the caller can try another model.
        ``tap`` sees the answer as it goes out (the response cache's writer);
        ``extra_headers`` / ``drop_headers`` shape the request to the backend
        (header_mutation)."""
        model = upstream_model or backend.model_id
        payload = json.dumps({**body, "model": model}, ensure_ascii=False).encode()
        started = self.clock.monotonic()
        backend.inflight += 1
        ok = False
        out_headers = backend.headers(request.headers)
        drop = {h.lower() for h in drop_headers}
        out_headers = {k: v for k, v in out_headers.items() if k.lower() not in drop}
        for name, value in (extra_headers or {}).items():
            out_headers = {k: v for k, v in out_headers.items() if k.lower() != name.lower()}
            out_headers[name] = value
        try:
            upstream = await _wait(
                self.session.post(
                    f"{backend.api_base}/chat/completions", data=payload, headers=out_headers
                ),
                first_byte_timeout_s,
            )
            async with upstream:
                ok = upstream.status < 400
                failing = upstream.status == 429 or upstream.status >= 500
                if failing and early_failure:
                    answer = await _whole(backend, upstream, headers)
                    if upstream.status >= 500:
                        self.mark_failed(backend, f"chat answered {upstream.status}")
                    raise AttemptFailed(f"http_{upstream.status}", answer)
                if upstream.content_type == "text/event-stream" and ok:
                    streamed, ok = await self._stream(
                        backend,
                        upstream,
                        request,
                        headers,
                        early_failure,
                        first_byte_timeout_s,
                        tap,
                    )
                    return streamed
                answer = await _whole(backend, upstream, headers)
                if tap is not None:
                    tap.whole(upstream.status, answer.body)
                return answer
        except TimeoutError:
            ok = False
            reason = (
                f"nothing for {READ_TIMEOUT_S:g} s"
                if first_byte_timeout_s is None
                else f"nothing within the caller's deadline ({first_byte_timeout_s:.3f} s)"
            )
            if early_failure:
                raise AttemptFailed(
                    "deadline",
                    error=DeadlineExceeded(
                        f"backend {backend.api_base} of model {backend.model!r} sent {reason}",
                        model=backend.model,
                    ),
                ) from None
            raise DeadlineExceeded(
                f"backend {backend.api_base} of model {backend.model!r} sent {reason}",
                model=backend.model,
            ) from None
        except (aiohttp.ClientConnectionError, OSError) as exc:
            ok = False
            self.mark_failed(backend, f"chat failed: {type(exc).__name__}: {exc}")
            error = BackendUnavailable(
                f"backend {backend.api_base} of model {backend.model!r} cannot be reached: "
                f"{type(exc).__name__}: {exc}",
                model=backend.model,
            )
            if early_failure:
                raise AttemptFailed(connection_reason(exc), error=error) from None
            raise error from None
        finally:
            backend.inflight -= 1
            backend.record(self.clock.monotonic() - started, ok)

    async def _stream(
        self,
        backend: Backend,
        upstream: aiohttp.ClientResponse,
        request: Request,
        headers: Mapping[str, str],
        early_failure: bool,
        first_byte_timeout_s: float | None,
        tap: AnswerTap | None,
    ) -> tuple[StreamResponse, bool]:
        """Chunks go out as they arrive; the caller's answer begins only once the backend's
        first chunk is in hand (so a stream that fails before it can go elsewhere).
        -> (the answer, whether the backend finished it)."""
        chunks = upstream.content.iter_any().__aiter__()
        try:
            first: bytes | None = await _wait(chunks.__anext__(), first_byte_timeout_s)
        except StopAsyncIteration:
            first = None
        except (aiohttp.ClientError, OSError) as exc:
            first = None
            log.info("backend %s: stream broke before its first chunk: %s", backend.id, exc)
        if first is None:
            self.mark_failed(backend, "chat stream ended before its first chunk")
            error = BackendUnavailable(
                f"backend {backend.api_base} of model {backend.model!r} ended its stream "
                "before the first chunk",
                model=backend.model,
            )
            if early_failure:
                raise AttemptFailed("stream_first_chunk", error=error)
            raise error
        out = StreamResponse(upstream.status, "text/event-stream", {"Cache-Control": "no-cache"})
        out.headers.update(headers)
        await out.prepare(request)
        chunk = first
        while True:
            if tap is not None:
                tap.chunk(chunk)
            try:
                await out.write(chunk)
            except (ConnectionError, OSError):
                return out, True  # the caller hung up; not the backend's fault
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                break
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                # The status is already sent: the stream just ends, without "data: [DONE]".
                log.warning("backend stream broke after the answer began: %s", exc)
                return out, False
        if tap is not None:
            tap.finish()
        with contextlib.suppress(ConnectionError, OSError):
            await out.write_eof()  # the caller may have hung up: not the backend's fault
        return out, True


class AnswerTap(Protocol):
    """What sees a proxied answer on its way out (the response cache's writer)."""

    def whole(self, status: int, body: bytes) -> None: ...

    def chunk(self, data: bytes) -> None: ...

    def finish(self) -> None:
        """The backend's stream ended normally (a stream that broke never calls this)."""


class AttemptFailed(Exception):
    """A backend failed before the first byte reached the caller (``proxy(early_failure=
    True)``): ``reason`` (``connect``, ``reset``, ``http_503``, ``stream_first_chunk``,
    ``deadline``...) and what the caller gets if nothing else answers: ``answer`` (the
    backend's own error answer) or ``error``."""

    def __init__(
        self, reason: str, answer: Response | None = None, error: VllmSrError | None = None
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.answer = answer
        self.error = error


def connection_reason(exc: BaseException) -> str:
    """``reset`` for a connection the backend dropped, else ``connect`` (refused, unreachable)."""
    if isinstance(exc, aiohttp.ServerDisconnectedError | ConnectionResetError):
        return "reset"
    if isinstance(exc, aiohttp.ClientOSError) and isinstance(exc.__cause__, ConnectionResetError):
        return "reset"
    if isinstance(exc, aiohttp.ClientOSError) and exc.errno == errno.ECONNRESET:
        return "reset"
    return "connect"


async def _wait(aw: Awaitable[T], timeout_s: float | None) -> T:
    if timeout_s is None:
        return await aw
    return await asyncio.wait_for(aw, max(0.0, timeout_s))


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
