"""The looper runner: vllm-sr runs a looper decision itself, each internal call through
``call`` (the chat path's own backends, retries, ejection and fallback; never cached nor
replayed as a chat of its own), within the caller's deadline. What every looper shares lives
here: the entry point's signature (:class:`Looper`, made by :func:`looper` from an algorithm),
the run an algorithm works on (:class:`Loop`: its internal calls, one at a time or as a round,
and the caller's deadline) and what the run keeps (:class:`LoopResult`: the final answer, the
models used, the iterations and the summed usage, as upstream's ``x-vsr-looper-*`` headers
report them). The final answer goes back whole, or as an SSE stream when the caller asked for
one. Each looper module owns only its algorithm."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

from vllm_sr.jsontypes import JsonObject
from vllm_sr.router.looper.fanout import Answered, fan_out, round_timeout

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from vllm_sr.router.looper.fanout import Call, Round, RoundSpec, Sleep

M = TypeVar("M")
S = TypeVar("S")
M_in = TypeVar("M_in", contravariant=True)
S_in = TypeVar("S_in", contravariant=True)

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


@dataclass
class Loop:
    """One looper run as its algorithm sees it: ``call`` (model, body) -> (the model that
    answered, its answer), the clock, the caller's ``deadline`` on it (None: none), the
    ``sleep`` rounds time out on, and the run's record, where every answer is counted."""

    call: Call
    monotonic: Callable[[], float]
    deadline: float | None
    sleep: Sleep
    result: LoopResult

    def expired(self) -> bool:
        """Whether the caller's deadline has passed."""
        return self.deadline is not None and self.monotonic() >= self.deadline

    def check_deadline(self) -> None:
        """Raises DeadlineExceeded when the caller's deadline has passed (no call starts)."""
        round_timeout(0, self.deadline, self.monotonic)

    async def ask(self, model: str, body: JsonObject) -> Answered:
        """One internal call, its answer counted; raises the call's VllmSrError."""
        answered_by, answer = await self.call(model, body)
        self.result.add(answered_by, answer)
        return Answered(0, answered_by, answer)

    def round(self, jobs: Sequence[tuple[str, JsonObject]], spec: RoundSpec) -> Awaitable[Round]:
        """``jobs`` (model, body) as one round (:func:`.fanout.fan_out`) within ``spec``'s
        timeout or the caller's deadline, whichever is sooner; every answer counted. A
        deadline that has passed already raises DeadlineExceeded here, before the round is
        awaited (so a caller can tell it from the round's own failures)."""
        timeout, why = round_timeout(spec.timeout_s, self.deadline, self.monotonic)
        return self._round(jobs, spec, timeout, why)

    async def _round(
        self,
        jobs: Sequence[tuple[str, JsonObject]],
        spec: RoundSpec,
        timeout: float | None,
        why: str,
    ) -> Round:
        max_concurrent, quorum = spec.bounded(len(jobs))
        done = await fan_out(
            self.call,
            jobs,
            max_concurrent=max_concurrent,
            quorum=quorum,
            on_error=spec.on_error,
            timeout_s=timeout,
            why=why,
            sleep=self.sleep,
            usable=spec.usable,
        )
        for got in done.answers:
            self.result.add(got.model, got.answer)
        return done


class Looper(Protocol[M_in, S_in]):
    """Every looper's entry point: ``call`` for its internal calls, the decision's
    ``models`` (as the looper reads them), the caller's ``body``, the looper's ``settings``,
    the clock, the caller's ``deadline`` on it and the ``sleep`` rounds time out on -> the
    run's :class:`LoopResult`. Raises VllmSrError when the loop fails."""

    def __call__(
        self,
        call: Call,
        models: Sequence[M_in],
        body: JsonObject,
        settings: S_in,
        monotonic: Callable[[], float],
        deadline: float | None = None,
        sleep: Sleep = ...,
    ) -> Awaitable[LoopResult]: ...


def looper(
    algorithm: str,
) -> Callable[[Callable[[Loop, Sequence[M], JsonObject, S], Awaitable[None]]], Looper[M, S]]:
    """Makes ``steps(loop, models, body, settings)`` (an algorithm, named ``algorithm`` in
    the ``x-vsr-looper-algorithm`` header) into its :class:`Looper`: a fresh :class:`Loop`
    and :class:`LoopResult` per run, its latency taken however the run ends."""

    def entry(
        steps: Callable[[Loop, Sequence[M], JsonObject, S], Awaitable[None]],
    ) -> Looper[M, S]:
        async def run(
            call: Call,
            models: Sequence[M],
            body: JsonObject,
            settings: S,
            monotonic: Callable[[], float],
            deadline: float | None = None,
            sleep: Sleep = asyncio.sleep,
        ) -> LoopResult:
            started = monotonic()
            loop = Loop(call, monotonic, deadline, sleep, LoopResult(algorithm))
            try:
                await steps(loop, models, body, settings)
                return loop.result
            finally:
                loop.result.latency_s = monotonic() - started

        run.__name__, run.__qualname__, run.__doc__ = (
            steps.__name__,
            steps.__qualname__,
            steps.__doc__,
        )
        return run

    return entry
