"""One round of concurrent internal calls (ratings' models, a remom round, fusion's panel, a
workflows step): at most ``max_concurrent`` at once, ended by a quorum of usable answers, by
the round's timeout or the caller's deadline (whichever is sooner), or by the first failure
with ``on_error: fail``; the calls still running then are cancelled. A looper states a round
as a :class:`RoundSpec` (its block's knobs) and runs it through its run's
:meth:`~vllm_sr.router.looper.runner.Loop.round`. Also the request edits the loopers make
(tool-free internal calls, the last user turn replaced or appended)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm_sr.errors import DeadlineExceeded, VllmSrError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from vllm_sr.jsontypes import JsonObject

    # (model, body) -> (the model that answered, its whole answer); raises VllmSrError.
    Call = Callable[[str, JsonObject], Awaitable[tuple[str, JsonObject]]]
    Sleep = Callable[[float], Awaitable[None]]

TOOL_KEYS = ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call")


@dataclass
class Answered:
    index: int  # the call's place in the round
    model: str  # the model that answered (the call's, or the chat's fallback)
    answer: JsonObject


def any_answer(_: JsonObject) -> bool:
    return True


@dataclass(frozen=True)
class RoundSpec:
    """One round as a looper's block states it: ``max_concurrent`` calls at once and a
    ``quorum`` of usable answers (0, or more than the round's calls: all of them), its own
    ``timeout_s`` (0: the caller's deadline alone), ``on_error`` (``skip`` or ``fail``) and
    which answers are ``usable`` (count toward the quorum)."""

    max_concurrent: int = 0
    quorum: int = 0
    timeout_s: float = 0
    on_error: str = "skip"
    usable: Callable[[JsonObject], bool] = any_answer

    def bounded(self, calls: int) -> tuple[int, int]:
        """(calls at once, quorum) for a round of ``calls`` calls."""
        return up_to(self.max_concurrent, calls), up_to(self.quorum, calls)


def up_to(value: int, calls: int) -> int:
    """``value`` when it is 1 to ``calls``, else ``calls``."""
    return value if 0 < value < calls else calls


@dataclass
class Round:
    answers: list[Answered] = field(default_factory=list)  # in the calls' order
    failures: list[tuple[str, str]] = field(default_factory=list)  # (model, why)
    cut_short: str = ""  # "timeout" or "deadline" when the round ended before its quorum


def round_timeout(
    round_timeout_s: float, deadline: float | None, monotonic: Callable[[], float]
) -> tuple[float | None, str]:
    """How long the next round may take: its own timeout (0: none) or what is left of the
    caller's deadline, whichever is sooner -> (seconds or None, "timeout" | "deadline").
    Raises DeadlineExceeded when the deadline has passed."""
    left = None if deadline is None else deadline - monotonic()
    if left is not None and left <= 0:
        raise DeadlineExceeded("the looper's deadline passed")
    if round_timeout_s > 0 and (left is None or round_timeout_s <= left):
        return round_timeout_s, "timeout"
    return left, "deadline"


async def fan_out(
    call: Call,
    jobs: Sequence[tuple[str, JsonObject]],
    *,
    max_concurrent: int,
    quorum: int,
    on_error: str,
    timeout_s: float | None,
    why: str = "timeout",
    sleep: Sleep = asyncio.sleep,
    usable: Callable[[JsonObject], bool] = any_answer,
) -> Round:
    """Run ``jobs`` (model, body) through ``call``. The round ends once ``quorum`` usable
    answers are in, every call has ended, ``timeout_s`` has passed on ``sleep``'s clock
    (``cut_short`` = ``why``), or, with ``on_error: fail``, at the first failure (raised)."""
    out = Round()
    gate = asyncio.Semaphore(max(1, max_concurrent))

    async def one(index: int, model: str, body: JsonObject) -> Answered:
        async with gate:
            answered_by, answer = await call(model, body)
        return Answered(index, answered_by, answer)

    tasks: dict[asyncio.Future[Answered], str] = {
        asyncio.ensure_future(one(i, m, b)): m for i, (m, b) in enumerate(jobs)
    }
    timer: asyncio.Future[None] | None = None
    if timeout_s is not None:
        timer = asyncio.ensure_future(sleep(timeout_s))
    pending = set(tasks)
    good = 0
    try:
        while pending and good < quorum:
            waiting: set[asyncio.Future[Answered] | asyncio.Future[None]] = set(pending)
            if timer is not None:
                waiting.add(timer)
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for task in [t for t in pending if t in done]:
                pending.discard(task)
                try:
                    got = task.result()
                except VllmSrError as exc:
                    out.failures.append((tasks[task], str(exc)))
                    if on_error == "fail":
                        raise
                    continue
                out.answers.append(got)
                good += usable(got.answer)
            if timer is not None and timer in done and pending and good < quorum:
                out.cut_short = why
                break
    finally:
        for task in pending:
            task.cancel()
        if timer is not None:
            timer.cancel()
        await asyncio.gather(*pending, *([timer] if timer else []), return_exceptions=True)
    out.answers.sort(key=lambda a: a.index)
    return out


# -- the request edits -----------------------------------------------------------------------


def tool_free(body: JsonObject) -> JsonObject:
    """An internal call's body: whole, not streamed, without the caller's tools."""
    out = {k: v for k, v in body.items() if k not in TOOL_KEYS and k != "stream_options"}
    out["stream"] = False
    return out


def messages_of(body: JsonObject) -> list[object]:
    got = body.get("messages")
    return list(got) if isinstance(got, list) else []


def text_of(content: object) -> str:
    """A message's text: its string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        return "\n".join(p for p in parts if isinstance(p, str))
    return ""


def last_user_text(body: JsonObject) -> str:
    for msg in reversed(messages_of(body)):
        if isinstance(msg, dict) and msg.get("role") == "user":
            return text_of(msg.get("content"))
    return ""


def with_last_message(body: JsonObject, text: str) -> JsonObject:
    """``body`` with its last message replaced by a user turn ``text`` (remom's rounds)."""
    messages = messages_of(body)
    messages[-1:] = [{"role": "user", "content": text}]
    return {**body, "messages": messages}


def with_user_turn(body: JsonObject, text: str) -> JsonObject:
    """``body`` with a user turn ``text`` appended (fusion's analysis and synthesis)."""
    return {**body, "messages": [*messages_of(body), {"role": "user", "content": text}]}


def first_message(answer: JsonObject) -> dict[str, object]:
    choices = answer.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    return message if isinstance(message, dict) else {}


def content_of(answer: JsonObject) -> str:
    return text_of(first_message(answer).get("content"))


def reasoning_of(answer: JsonObject) -> str:
    message = first_message(answer)
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and value:
            return value
    return ""
