"""One chat to one LLM backend, over the one outbound client
(:mod:`vllm_sr.router.backend_client`), answered to the caller.

``POST {api}/chat/completions`` with ``model`` rewritten to the name that backend expects
(``external_model_ids[type]``, else ``provider_model_id``, else the name, as upstream); an SSE
answer is streamed through chunk by chunk as it arrives, any other answer is passed through
with the backend's status (a 3xx too: redirects are not followed). A backend error that is not
an OpenAI-style ``{"error": ...}`` body is wrapped in ours (``backend_error``); a backend that
cannot be reached is a 502 ``backend_unavailable``; one that sends nothing for
``READ_TIMEOUT_S`` is a 504 ``deadline_exceeded``.

Before the first byte reached the caller, a failure may be handed back as
:class:`AttemptFailed` instead (``early_failure``) so the chat can go to another model
(vllm_sr/router/fallback.py); once a byte went out it never is: a stream that breaks later just
ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from vllm_sr.errors import DeadlineExceeded, VllmSrError
from vllm_sr.httpserver import Request, Response, StreamResponse
from vllm_sr.jsontypes import JsonObject
from vllm_sr.pool.client import StreamedAnswer
from vllm_sr.router.backend import Backend
from vllm_sr.router.backend_client import (
    BROKEN,
    READ_TIMEOUT_S,
    BackendClients,
    connection_reason,
    is_timeout,
)

log = logging.getLogger("vllm_sr.router.backends")

MAX_ERROR_TEXT = 500
T = TypeVar("T")


class BackendUnavailable(VllmSrError):
    code = "backend_unavailable"
    http_status = 502
    retryable = True


class AnswerTap(Protocol):
    """What sees a proxied answer on its way out (the response cache's writer)."""

    def whole(self, status: int, body: bytes) -> None: ...

    def chunk(self, data: bytes) -> None: ...

    def finish(self) -> None:
        """The backend's stream ended normally (a stream that broke never calls this)."""


class StreamRewrite(Protocol):
    """What turns a streamed answer into another on its way out (the Responses API's event
    stream): ``chunk`` maps what the backend sent to what the caller gets, ``finish`` adds the
    end of a stream that ended normally; ``headers`` go on the answer."""

    content_type: str
    headers: dict[str, str]

    def chunk(self, data: bytes) -> bytes: ...

    def finish(self) -> bytes: ...


@dataclass(slots=True)  # one per attempt: not frozen (a frozen __init__ sets each field by a call)
class Exchange:
    """One chat to send to a backend and answer to the caller (one attempt of it).

    ``body`` goes out with ``model`` rewritten to ``upstream_model`` when given (a modelRef's
    LoRA goes by its own name, as upstream), else to the backend's name for the model;
    ``request`` is the caller's (its headers, shaped by ``extra_headers`` / ``drop_headers``:
    header_mutation, go to the backend, and the answer is written to it); ``headers`` are added
    to the answer.

    With ``early_failure``, a failure before the first byte reached the caller (the backend
    cannot be reached or reset the connection, answered 429 or 5xx, or its stream broke or
    ended before its first chunk, or nothing came within ``first_byte_timeout_s``) raises
    :class:`AttemptFailed` instead of answering, so the caller can try another backend or
    model. ``tap`` sees the answer as it goes out (the response cache's writer); ``rewrite``
    turns a streamed answer into another as it goes out (the Responses API)."""

    body: JsonObject
    request: Request
    headers: Mapping[str, str]
    upstream_model: str | None = None
    early_failure: bool = False
    first_byte_timeout_s: float | None = None
    tap: AnswerTap | None = None
    extra_headers: Mapping[str, str] | None = None
    drop_headers: Sequence[str] = ()
    rewrite: StreamRewrite | None = None


class AttemptFailed(Exception):
    """A backend failed before the first byte reached the caller (an :class:`Exchange` with
    ``early_failure``): ``reason`` (``connect``, ``reset``, ``http_503``, ``stream_first_chunk``,
    ``deadline``...) and what the caller gets if nothing else answers: ``answer`` (the
    backend's own error answer) or ``error``."""

    def __init__(
        self, reason: str, answer: Response | None = None, error: VllmSrError | None = None
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.answer = answer
        self.error = error


class BackendProxy:
    """Sends chats through ``clients``; a backend that fails is reported to ``mark_failed``
    (the set's health, which re-checks it)."""

    def __init__(
        self, clients: BackendClients, mark_failed: Callable[[Backend, str], None]
    ) -> None:
        self.clients = clients
        self.mark_failed = mark_failed

    async def proxy(
        self, backend: Backend, ex: Exchange, tap: AnswerTap | None
    ) -> tuple[Response | StreamResponse, bool]:
        """Send ``ex`` to ``backend`` and answer its request with what comes back, streamed
        through when it is SSE -> (the answer, whether the backend answered well: below 400
        and, for a stream, to its end). ``tap`` sees the answer instead of ``ex.tap`` (the
        backend set's timing tap, which passes everything on to ``ex.tap``: given apart, so a
        chat does not copy its exchange). Raises :class:`AttemptFailed` (with
        ``ex.early_failure``), :class:`BackendUnavailable` or ``DeadlineExceeded``."""
        payload = json.dumps(
            {**ex.body, "model": ex.upstream_model or backend.model_id}, ensure_ascii=False
        ).encode()
        loop = asyncio.get_running_loop()
        timeout_s = ex.first_byte_timeout_s
        deadline = None if timeout_s is None else loop.time() + timeout_s

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - loop.time())

        outgoing = request_headers(backend, ex.request, ex.extra_headers, ex.drop_headers)
        try:
            client, prefix = self.clients.for_url(backend.api_base)
            path = f"{prefix}/chat/completions"
            upstream = await _wait(client.stream("POST", path, payload, headers=outgoing), left())
            try:
                status = upstream.status
                if (status == 429 or status >= 500) and ex.early_failure:
                    answer = await _whole(backend, upstream, ex.headers)
                    if status >= 500 and not backend.ejects_on_5xx:
                        self.mark_failed(backend, f"chat answered {status}")
                    raise AttemptFailed(f"http_{status}", answer)
                if status < 400 and upstream.media_type == "text/event-stream":
                    return await self._stream(backend, upstream, ex, tap, left())
                answer = await _whole(backend, upstream, ex.headers)
                if tap is not None:
                    tap.whole(status, answer.body)
                return answer, status < 400
            finally:
                await upstream.aclose()
        except BROKEN as exc:
            if is_timeout(exc):
                raise _timed_out(backend, timeout_s, ex.early_failure) from None
            self.mark_failed(backend, f"chat failed: {type(exc).__name__}: {exc}")
            error = BackendUnavailable(
                f"backend {backend.api_base} of model {backend.model!r} cannot be reached: "
                f"{type(exc).__name__}: {exc}",
                model=backend.model,
            )
            if ex.early_failure:
                raise AttemptFailed(connection_reason(exc), error=error) from None
            raise error from None

    async def _stream(
        self,
        backend: Backend,
        upstream: StreamedAnswer,
        ex: Exchange,
        tap: AnswerTap | None,
        first_chunk_s: float | None,
    ) -> tuple[StreamResponse, bool]:
        """Chunks go out as they arrive; the caller's answer begins only once the backend's
        first chunk is in hand (so a stream that fails before it can go elsewhere).
        -> (the answer, whether the backend finished it)."""
        chunks = upstream  # each read: everything that arrived since the last one
        first: bytes | None
        try:
            first = await _wait(chunks.__anext__(), first_chunk_s)
        except StopAsyncIteration:
            first = None
        except TimeoutError:
            raise  # the caller's deadline: ``deadline``, not the backend's fault
        except BROKEN as exc:
            first = None
            log.info("backend %s: stream broke before its first chunk: %s", backend.id, exc)
        if first is None:
            self.mark_failed(backend, "chat stream ended before its first chunk")
            error = BackendUnavailable(
                f"backend {backend.api_base} of model {backend.model!r} ended its stream "
                "before the first chunk",
                model=backend.model,
            )
            if ex.early_failure:
                raise AttemptFailed("stream_first_chunk", error=error)
            raise error
        rewrite = ex.rewrite
        content_type = rewrite.content_type if rewrite is not None else "text/event-stream"
        out = StreamResponse(upstream.status, content_type, {"Cache-Control": "no-cache"})
        out.headers.update(ex.headers)
        if rewrite is not None:
            out.headers.update(rewrite.headers)
        await out.prepare(ex.request)
        chunk = first
        while True:
            if tap is not None:
                tap.chunk(chunk)
            try:
                await out.write(chunk if rewrite is None else rewrite.chunk(chunk))
            except (ConnectionError, OSError):
                return out, True  # the caller hung up; not the backend's fault
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                break
            except BROKEN as exc:
                # The status is already sent: the stream just ends, without "data: [DONE]".
                log.warning("backend stream broke after the answer began: %s", exc)
                return out, False
        if tap is not None:
            tap.finish()
        with contextlib.suppress(ConnectionError, OSError):
            if rewrite is not None:
                await out.write(rewrite.finish())
            await out.write_eof()  # the caller may have hung up: not the backend's fault
        return out, True


def request_headers(
    backend: Backend,
    request: Request,
    extra_headers: Mapping[str, str] | None,
    drop_headers: Sequence[str],
) -> dict[str, str]:
    """The headers to the backend: its credential (else the caller's own), less
    ``drop_headers``, with ``extra_headers`` set over any of the same name (header_mutation)."""
    out = backend.headers(request.headers)
    drop = {h.lower() for h in drop_headers}
    out = {k: v for k, v in out.items() if k.lower() not in drop}
    for name, value in (extra_headers or {}).items():
        out = {k: v for k, v in out.items() if k.lower() != name.lower()}
        out[name] = value
    return out


def _timed_out(
    backend: Backend, first_byte_timeout_s: float | None, early_failure: bool
) -> Exception:
    reason = (
        f"nothing for {READ_TIMEOUT_S:g} s"
        if first_byte_timeout_s is None
        else f"nothing within the caller's deadline ({first_byte_timeout_s:.3f} s)"
    )
    error = DeadlineExceeded(
        f"backend {backend.api_base} of model {backend.model!r} sent {reason}",
        model=backend.model,
    )
    return AttemptFailed("deadline", error=error) if early_failure else error


async def _wait(aw: Awaitable[T], timeout_s: float | None) -> T:
    """``aw`` within ``timeout_s`` (``TimeoutError``); no task per call, unlike ``wait_for``
    on Python 3.11."""
    if timeout_s is None:
        return await aw
    async with asyncio.timeout(timeout_s):
        return await aw


async def _whole(
    backend: Backend, upstream: StreamedAnswer, headers: Mapping[str, str]
) -> Response:
    raw = await upstream.read()
    status = upstream.status
    content_type = upstream.headers.get("content-type", "application/json")
    if status >= 400 and not _is_openai_error(raw):
        text = raw.decode("utf-8", "replace")[:MAX_ERROR_TEXT]
        err = {
            "error": {
                "code": "backend_error",
                "message": f"backend {backend.api_base} of model {backend.model!r} answered "
                f"{status}: {text}",
                "retryable": status >= 500 or status == 429,
            }
        }
        raw, content_type = json.dumps(err).encode(), "application/json"
    return Response(raw, status, content_type, dict(headers))


def _is_openai_error(raw: bytes) -> bool:
    try:
        doc = json.loads(raw)
    except ValueError:
        return False
    return isinstance(doc, dict) and isinstance(doc.get("error"), dict)
