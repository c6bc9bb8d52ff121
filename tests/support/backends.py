"""Stand-ins for Router mode's neighbours.

- :class:`StandInBackend`: a real OpenAI-compatible HTTP server (aiohttp on a real TCP socket)
  with ``GET /v1/models`` (and ``GET /health``; each check's path goes in ``probes``) and
  ``POST /v1/chat/completions``, streaming (SSE) and not. It
  records what it received. Streaming can be held between chunks (``gate``) so a test can see
  the first chunk arrive before the second is even sent (no buffering on the way). A request
  whose last user message is ``FAIL <status>`` gets that status with an OpenAI-style error;
  ``PLAIN <status>`` gets a plain-text error body. Chats can be held before any answer
  (``hold``), so a test can see how many arrive at once and over how many connections
  (``inflight``, ``max_inflight``, ``peers``); ``start(ssl_context=...)`` serves https.
- :class:`FakeWorkerExchange`: the injected ``exchange`` answering ``/v1/bundle`` in the
  worker's own format: the bundle is parsed and answered by the worker's code
  (``vllm_sr.worker.surfaces``, ``classify``) over a toy encoder (a hashed bag of words), so
  texts sharing words are similar. It counts exchanges per deployment and can be told to fail.

``python -m tests.support.backends --port P --name N`` serves a stand-in backend (for
bench/router.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import ssl
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy
from aiohttp import web

from vllm_sr.errors import VllmSrError
from vllm_sr.worker import classify, surfaces

TOY_DIMS = 64


# -- the LLM backend ------------------------------------------------------------------------


@dataclass
class Received:
    body: dict[str, Any]
    headers: dict[str, str]
    peer: tuple[str, int] | None = None  # the client's end of the connection


def last_user_text(body: dict[str, Any]) -> str:
    for msg in reversed(body.get("messages") or []):
        if isinstance(msg, dict) and msg.get("role") == "user":
            content = msg.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


class StandInBackend:
    def __init__(self, name: str, *, chunks: int = 3) -> None:
        self.name = name
        self.chunks = chunks
        self.received: list[Received] = []
        self.healthy = True
        self.gate: asyncio.Event | None = None  # set: streams wait on it after the first chunk
        # Every chat fails this way: "reset" (connection dropped, no answer), "503"/"429"
        # (that status), "stream_before_first" (SSE headers, then dropped before any chunk),
        # "stream_after_first" (dropped after the first chunk), "slow" (answers after slow_s),
        # "stream_slow_first" (SSE headers at once, the first chunk after slow_s), "redirect"
        # (302 to redirect_to).
        self.fault: str | None = None
        self.slow_s = 1.0
        self.redirect_to = ""
        self.hold: asyncio.Event | None = None  # set: chats wait on it before answering
        # A chat that asks for ``logprobs`` gets, for each word of its reply, this token
        # probability (and ``top_logprobs`` a runner-up sharing what is left).
        self.token_prob = 0.5
        self.reply: str | None = None  # set: every chat's answer text, instead of "<name> got: …"
        self.inflight = 0
        self.max_inflight = 0
        self.app = web.Application()
        self.probes: list[str] = []  # the paths of the health checks received
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_get("/health", self.models)  # vLLM's own health path
        self.app.router.add_post("/v1/chat/completions", self.chat)
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def peers(self) -> set[tuple[str, int]]:
        """The client connections chats came over."""
        return {r.peer for r in self.received if r.peer is not None}

    async def start(
        self, port: int = 0, ssl_context: ssl.SSLContext | None = None
    ) -> StandInBackend:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port, ssl_context=ssl_context)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def models(self, request: web.Request) -> web.Response:
        self.probes.append(request.path)
        if self.fault == "redirect":
            raise web.HTTPFound(self.redirect_to)
        if not self.healthy:
            return web.json_response({"error": {"message": "down"}}, status=503)
        return web.json_response({"object": "list", "data": [{"id": self.name}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.received.append(Received(body, dict(request.headers), peer))
        if self.hold is not None:
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            try:
                await self.hold.wait()
            finally:
                self.inflight -= 1
        if self.fault == "redirect":
            raise web.HTTPFound(self.redirect_to)
        if self.fault == "slow":
            await asyncio.sleep(self.slow_s)
        if self.fault == "reset":
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        if self.fault in ("503", "429"):
            err = {"error": {"message": f"{self.name} fault {self.fault}", "type": "server_error"}}
            return web.json_response(err, status=int(self.fault))
        text = last_user_text(body)
        if text.startswith("FAIL "):
            status = int(text.split()[1])
            err = {"error": {"message": f"{self.name} says no", "type": "invalid_request_error"}}
            return web.json_response(err, status=status)
        if text.startswith("PLAIN "):
            return web.Response(text="upstream exploded", status=int(text.split()[1]))
        reply = self.reply if self.reply is not None else f"{self.name} got: {text}"
        if body.get("stream"):
            return await self._stream(request, body["model"], reply)
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": reply},
            "finish_reason": "stop",
        }
        if body.get("logprobs") is True:
            choice["logprobs"] = {"content": self._logprobs(reply, body.get("top_logprobs"))}
        return web.json_response(
            {
                "id": "chatcmpl-standin",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [choice],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    def _logprobs(self, reply: str, top: Any) -> list[dict[str, Any]]:
        lp = math.log(self.token_prob)
        rival = math.log(max(1e-9, 1.0 - self.token_prob) / 2)
        out = []
        for word in reply.split(" "):
            entry: dict[str, Any] = {"token": word, "logprob": lp}
            if isinstance(top, int) and top > 0:
                entry["top_logprobs"] = [
                    {"token": word, "logprob": lp},
                    {"token": "~", "logprob": rival},
                ][:top]
            out.append(entry)
        return out

    async def _stream(self, request: web.Request, model: str, reply: str) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        words = reply.split(" ")
        step = max(1, len(words) // self.chunks)
        pieces = [" ".join(words[i : i + step]) for i in range(0, len(words), step)]
        if self.fault == "stream_slow_first":
            await asyncio.sleep(self.slow_s)
        for i, piece in enumerate(pieces):
            if self.fault == "stream_before_first" or (self.fault == "stream_after_first" and i):
                assert request.transport is not None
                request.transport.abort()
                return out
            delta = {"role": "assistant", "content": piece} if i == 0 else {"content": " " + piece}
            await out.write(_sse(model, delta, None))
            if i == 0 and self.gate is not None:
                await self.gate.wait()
        await out.write(_sse(model, {}, "stop"))
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        return out


def _sse(model: str, delta: dict[str, Any], finish: str | None) -> bytes:
    chunk = {
        "id": "chatcmpl-standin",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(chunk)}\n\n".encode()


# -- the worker side: a fake exchange answering in the worker's format ----------------------


def toy_embedding(text: str) -> numpy.ndarray:
    """A hashed bag of words: texts that share words point the same way."""
    vec = numpy.zeros(TOY_DIMS, dtype=numpy.float32)
    for word in text.lower().split():
        word = word.strip(".,?!")
        rng = numpy.random.default_rng(zlib.crc32(word.encode()))
        vec += rng.standard_normal(TOY_DIMS).astype(numpy.float32)
    norm = float(numpy.linalg.norm(vec))
    return vec / norm if norm else vec


def _toy_view() -> surfaces.ModelView:
    return surfaces.ModelView(
        name="toy",
        names=frozenset({"toy"}),
        dimensions=TOY_DIMS,
        max_length=10_000,
        head_labels=None,
        encode=lambda texts: [[1] * max(1, len(t.split())) for t in texts],
        truncate=lambda ids, n: ids[:n],
    )


def answer_bundle(body: bytes) -> bytes:
    """A /v1/bundle answer as the worker gives it (its own parse and finish code)."""
    view = _toy_view()
    results = []
    for task_id, surface, inner in surfaces.parse_bundle(json.loads(body), view):
        try:
            results.append({"id": task_id, "status": 200, "body": _answer(view, surface, inner)})
        except VllmSrError as exc:
            results.append({"id": task_id, "status": exc.http_status, "body": exc.to_json()})
    return json.dumps({"object": "bundle", "results": results}, default=_plain).encode()


def _answer(view: surfaces.ModelView, surface: str, inner: dict[str, Any]) -> dict[str, Any]:
    if surface == "embeddings":
        texts, _, fmt = surfaces.validate_embeddings(inner, view)
        out = numpy.stack([toy_embedding(t) for t in texts])
        return surfaces.embeddings_finisher(view, fmt, len(texts))(out)
    texts, _, key = surfaces.validate_classify(inner, view)
    assert key is not None
    examples = numpy.stack([toy_embedding(e) for _, ex in key for e in ex])
    centroids = classify.centroids_from(examples, key)
    out = numpy.stack([toy_embedding(t) for t in texts])
    return surfaces.classify_finisher(view, len(texts), centroids, key)(out)


def _plain(obj: Any) -> Any:
    if isinstance(obj, numpy.ndarray):
        return obj.tolist()
    if isinstance(obj, numpy.generic):
        return obj.item()
    raise TypeError(type(obj).__name__)


@dataclass
class FakeWorkerExchange:
    """``exchange(deployment, path, body, timeout_ms) -> (status, body)`` for tests."""

    deployments: set[str]
    calls: Counter[str] = field(default_factory=Counter)
    bodies: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    raise_error: VllmSrError | None = None
    status: int = 200
    fail: dict[str, VllmSrError] = field(default_factory=dict)  # per deployment

    async def __call__(
        self, deployment: str, path: str, body: bytes, timeout_ms: float | None
    ) -> tuple[int, bytes]:
        assert path == "/v1/bundle", path
        assert deployment in self.deployments, deployment
        self.calls[deployment] += 1
        self.bodies.append((deployment, json.loads(body)))
        if self.raise_error is not None:
            raise self.raise_error
        if deployment in self.fail:
            raise self.fail[deployment]
        if self.status != 200:
            return self.status, b'{"error": {"code": "internal_error", "message": "x"}}'
        return 200, answer_bundle(body)


async def _serve(port: int, name: str, delay_ms: float = 0.0) -> None:
    backend = StandInBackend(name)
    if delay_ms > 0:  # a think time before every answer
        backend.fault, backend.slow_s = "slow", delay_ms / 1000.0
    await backend.start(port)
    print(f"stand-in backend {name} on {backend.endpoint}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description="a stand-in OpenAI-compatible backend")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", default="standin")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="think time per answer")
    args = parser.parse_args()
    asyncio.run(_serve(args.port, args.name, args.delay_ms))


if __name__ == "__main__":
    main()
