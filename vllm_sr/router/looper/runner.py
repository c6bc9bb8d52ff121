"""The looper runner: vllm-sr runs a looper decision itself, each internal call through
``call`` (the chat path's own backends, retries, ejection and fallback; never cached nor
replayed as a chat of its own), within the caller's deadline. What it keeps: the final answer,
the models used, the iterations and the summed usage, as upstream's ``x-vsr-looper-*``
headers report them. The final answer goes back whole, or as an SSE stream when the caller
asked for one."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm_sr.config.routing_looper import ConfidenceSettings
from vllm_sr.errors import DeadlineExceeded, VllmSrError
from vllm_sr.jsontypes import JsonObject
from vllm_sr.router.looper.confidence import score, token_logprobs

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    # (model, body) -> (the model that answered: the model, or the chat's fallback; its whole
    # answer, an OpenAI chat completion); raises VllmSrError when nothing answered.
    Call = Callable[[str, JsonObject], Awaitable[tuple[str, JsonObject]]]

USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


@dataclass
class LoopResult:
    algorithm: str
    answer: JsonObject | None = None
    model: str | None = None
    models_used: list[str] = field(default_factory=list)
    iterations: int = 0
    usage: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USAGE_KEYS, 0))
    latency_s: float = 0.0
    scores: list[float | None] = field(default_factory=list)
    extra: dict[str, object] = field(default_factory=dict)  # top-level keys of the final answer

    def add(self, model: str, answer: JsonObject) -> None:
        """One internal call's answer: counted, its model used, its usage summed."""
        self.iterations += 1
        if model not in self.models_used or self.algorithm == "confidence":
            self.models_used.append(model)
        usage = answer.get("usage")
        got: JsonObject = usage if isinstance(usage, dict) else {}
        for key in USAGE_KEYS:
            value = got.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                self.usage[key] += value

    def headers(self) -> dict[str, str]:
        """Upstream's ``x-vsr-looper-*`` headers."""
        return {
            "x-vsr-looper-model": self.model or "",
            "x-vsr-looper-models-used": ",".join(self.models_used),
            "x-vsr-looper-iterations": str(self.iterations),
            "x-vsr-looper-algorithm": self.algorithm,
            "x-vsr-looper-latency-ms": str(round(self.latency_s * 1000)),
            "x-vsr-looper-prompt-tokens": str(self.usage["prompt_tokens"]),
            "x-vsr-looper-completion-tokens": str(self.usage["completion_tokens"]),
            "x-vsr-looper-total-tokens": str(self.usage["total_tokens"]),
        }

    def final_body(self) -> JsonObject:
        """The final answer with the loop's summed usage (and the looper's own top-level keys,
        e.g. fusion's trace)."""
        assert self.answer is not None
        return {**self.answer, **self.extra, "usage": dict(self.usage)}

    def final_sse(self) -> bytes:
        """The final answer as an OpenAI chat stream: the role chunk (with the looper's own
        top-level keys), the content, the finish reason, the summed usage, ``[DONE]``; every
        choice of the answer (ratings' one per model) in each chunk."""
        body = self.final_body()
        got = body.get("choices")
        choices = [c for c in got if isinstance(c, dict)] if isinstance(got, list) else []
        base = {
            "id": body.get("id", "chatcmpl-looper"),
            "object": "chat.completion.chunk",
            "created": body.get("created", 0),
            "model": body.get("model", self.model),
        }

        def chunk(part: str) -> dict[str, object]:
            out = []
            for i, choice in enumerate(choices or [{}]):
                message = choice.get("message") or {}
                delta: dict[str, object] = {}
                finish = None
                if part == "role":
                    delta = {"role": "assistant", "content": ""}
                elif part == "content":
                    delta = {"content": message.get("content") or ""}
                else:
                    finish = choice.get("finish_reason") or "stop"
                entry = {"index": choice.get("index", i), "delta": delta, "finish_reason": finish}
                if "model" in choice:
                    entry["model"] = choice["model"]
                out.append(entry)
            return {**base, "choices": out}

        parts = [{**chunk("role"), **self.extra}, chunk("content"), chunk("finish")]
        parts.append({**base, "choices": [], "usage": body["usage"]})
        out = b"".join(b"data: " + json.dumps(p).encode() + b"\n\n" for p in parts)
        return out + b"data: [DONE]\n\n"


async def run_confidence(
    call: Call,
    models: Sequence[str],
    body: JsonObject,
    settings: ConfidenceSettings,
    monotonic: Callable[[], float],
    deadline: float | None = None,
) -> LoopResult:
    """Ask ``models`` (in the escalation order, :func:`.confidence.ordered`) one by one,
    each with logprobs on, until an answer's confidence reaches the threshold (else the last
    answer is kept). ``deadline`` (on ``monotonic``'s clock) bounds the whole loop: once it
    has passed, no further call starts and the best answer so far is kept (none:
    DeadlineExceeded). ``on_error: skip`` passes a failing model over; ``fail`` (or a
    failure of every model) raises its error."""
    started = monotonic()
    result = LoopResult("confidence")
    inner = {**body, "stream": False, "logprobs": True}
    if settings.confidence_method != "avg_logprob":
        inner.setdefault("top_logprobs", 2)
    inner.pop("stream_options", None)
    last_error: VllmSrError | None = None
    try:
        for model in models:
            if deadline is not None and monotonic() >= deadline:
                if result.answer is None:
                    raise DeadlineExceeded("the looper's deadline passed before any answer")
                break
            try:
                answered_by, answer = await call(model, inner)
            except VllmSrError as exc:
                if settings.on_error == "fail":
                    raise
                last_error = exc
                continue
            result.add(answered_by, answer)
            confidence = score(token_logprobs(answer), settings)
            result.scores.append(confidence)
            result.answer, result.model = answer, answered_by
            if confidence is not None and confidence >= settings.threshold:
                break
        if result.answer is None:
            raise last_error or DeadlineExceeded("no model answered the looper")
        if "logprobs" not in body:
            choices = result.answer.get("choices")
            for choice in choices if isinstance(choices, list) else []:
                if isinstance(choice, dict):
                    choice.pop("logprobs", None)
        return result
    finally:
        result.latency_s = monotonic() - started
