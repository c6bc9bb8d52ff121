"""The ``remom`` looper (upstream's ``ReMoMLooper``, "reasoning mixture of models"): rounds
of parallel answers, each round after the first asked to synthesise the previous round's
answers, then a final round of one call (``synthesis_model`` when set).

- Calls per round: ``breadth_schedule`` then 1; spread over the modelRefs by
  ``model_distribution`` (weighted by modelRef ``weight``, largest remainders first; equal;
  round_robin; first_only). Weighted and equal lists are shuffled with ``shuffle_seed``.
- A round ends at its quorum (``min_successful_responses``; 0: every call), its
  ``round_timeout_seconds`` or the caller's deadline. An answer with neither content nor
  reasoning is not usable. A round with no usable answer (or, with ``on_error: fail``, any
  failure) ends the loop: with ``skip`` the last good round's answers stand, else it fails.
- A round's usable answers, longest first then shuffled with the seed, are kept up to
  ``max_responses_per_round``; each is compacted (``last_n_tokens``: its last
  ``compaction_tokens`` x 4 characters) for the next round's synthesis prompt.
- The final answer: the final round's first answer with content; if the final round did
  not complete, the longest answer of the latest rounds.

Shuffles use Python's seeded generator, not Go's PCG: the same seed orders calls differently
from upstream (the spread of calls over models is the same)."""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

from vllm_sr.config.looper_fanout_checks import REMOM_TEMPLATE_FIELD
from vllm_sr.errors import DeadlineExceeded, Unavailable, VllmSrError
from vllm_sr.router.looper.fanout import (
    RoundSpec,
    content_of,
    last_user_text,
    reasoning_of,
    tool_free,
    with_last_message,
)
from vllm_sr.router.looper.runner import Loop, looper

if TYPE_CHECKING:
    from collections.abc import Sequence

    from vllm_sr.config.looper_fanout_settings import RemomSettings
    from vllm_sr.jsontypes import JsonObject

INTRO = (
    "You are given a problem and a list of reference responses. Your job is to analyze these "
    "references and provide your own response."
)
INTRO_REASONING = (
    "You are given a problem and a list of reference responses with their reasoning processes. "
    "Your job is to analyze these reasoning processes and provide your own response."
)
OUTRO = (
    "Now, based on the original problem and reference responses above, please provide your own "
    "comprehensive solution."
)
OUTRO_REASONING = (
    "Now, analyze these reasoning processes and reference responses, then provide your own "
    "comprehensive solution with clear reasoning."
)


def distribute(settings: RemomSettings, calls: int, refs: Sequence[tuple[str, float]]) -> list[str]:
    """The models of a round's ``calls`` calls over ``refs`` (model, weight)."""
    if calls <= 0 or not refs:
        return []
    how = settings.model_distribution
    if how == "round_robin":
        return [refs[i % len(refs)][0] for i in range(calls)]
    if how == "first_only":
        return [refs[0][0]] * calls
    counts = [calls // len(refs) + (i < calls % len(refs)) for i in range(len(refs))]
    total = sum(w for _, w in refs if w > 0)
    if how == "weighted" and total > 0:
        exact = [(w / total * calls if w > 0 else 0.0) for _, w in refs]
        counts = [math.floor(e) for e in exact]
        by_remainder = sorted(range(len(refs)), key=lambda i: (-(exact[i] - counts[i]), i))
        for k in range(calls - sum(counts)):
            counts[by_remainder[k % len(refs)]] += 1
    out = [m for (m, _), n in zip(refs, counts, strict=True) for _ in range(n)]
    random.Random(settings.shuffle_seed).shuffle(out)
    return out


def synthesis_text(answer: JsonObject) -> str:
    """What an answer brings to the next round: its content, else its reasoning."""
    content = content_of(answer)
    return content if content.strip() else reasoning_of(answer)


def compact(settings: RemomSettings, text: str) -> str:
    if settings.compaction_strategy != "last_n_tokens":
        return text
    keep = (settings.compaction_tokens or 1000) * 4
    return text if len(text) <= keep else text[-keep:]


def synthesis_prompt(settings: RemomSettings, original: str, previous: Sequence[JsonObject]) -> str:
    """Upstream's default synthesis prompt over the previous round's kept answers; a
    ``synthesis_template`` instead (plain text, ``{{.OriginalContent}}`` filled in: the
    config refuses other template actions)."""
    if settings.synthesis_template:
        return settings.synthesis_template.replace(REMOM_TEMPLATE_FIELD, original)
    refs: list[str] = []
    for item in previous:
        text = str(item.get("content") or "") or str(item.get("reasoning") or "")
        if not text.strip():
            continue
        content = compact(settings, text)
        reasoning = str(item.get("reasoning") or "") if settings.include_reasoning else ""
        if reasoning and not str(item.get("content") or "").strip():
            content = ""
        model = str(item.get("model") or "")
        head = f"\nReference {len(refs) + 1}{f' ({model})' if model else ''}:\n"
        if reasoning:
            head += f"\nReasoning:\n{reasoning}\n\nAnswer:\n"
        refs.append(f"{head}\n{content}\n" if reasoning else f"{head}{content}\n")
    intro, outro = (
        (INTRO_REASONING, OUTRO_REASONING) if settings.include_reasoning else (INTRO, OUTRO)
    )
    return (
        f"{intro}\n\nOriginal Problem:\n{original}\n\nReference Responses:\n"
        + "".join(refs)
        + f"\n\n{outro}"
    )


def keep_round(
    settings: RemomSettings, number: int, breadth: int, answers: Sequence[tuple[str, JsonObject]]
) -> JsonObject:
    """A round's record (upstream's ``RoundResponse``) from its usable answers."""
    ordered = sorted(answers, key=lambda a: -len(synthesis_text(a[1])))
    random.Random(settings.shuffle_seed).shuffle(ordered)
    limit = settings.max_responses_per_round
    kept: list[object] = []
    for model, answer in ordered[: limit if limit > 0 else None]:
        text = synthesis_text(answer)
        item: dict[str, object] = {"model": model, "content": content_of(answer)}
        if reasoning_of(answer):
            item["reasoning"] = reasoning_of(answer)
        item["compacted_content"] = compact(settings, text)
        item["token_count"] = len(text) // 4
        kept.append(item)
    return {"round": number, "breadth": breadth, "responses": kept}


def _responses(record: JsonObject) -> list[JsonObject]:
    got = record.get("responses")
    return [r for r in got if isinstance(r, dict)] if isinstance(got, list) else []


def final_answer(rounds: Sequence[JsonObject], completed: bool) -> JsonObject:
    if completed:
        for item in _responses(rounds[-1]):
            if str(item.get("content") or "").strip():
                return item
        rounds = rounds[:-1]
    best: JsonObject | None = None
    for record in reversed(rounds):
        for item in _responses(record):
            text = str(item.get("content") or "").strip()
            if text and (best is None or len(text) > len(str(best.get("content")).strip())):
                best = item
    if best is None:
        raise Unavailable("remom produced no assistant content")
    return best


@looper("remom")
async def run_remom(
    loop: Loop, refs: Sequence[tuple[str, float]], body: JsonObject, settings: RemomSettings
) -> None:
    result = loop.result
    original = last_user_text(body)
    base = tool_free(body)
    if settings.temperature > 0:
        base["temperature"] = settings.temperature
    if settings.max_completion_tokens is not None:
        base.pop("max_tokens", None)
        base["max_completion_tokens"] = settings.max_completion_tokens
    schedule = [*settings.breadth_schedule, 1]
    rounds: list[JsonObject] = []
    for number, breadth in enumerate(schedule, start=1):
        last = number == len(schedule)
        asked = base
        if rounds:
            asked = with_last_message(
                base, synthesis_prompt(settings, original, _responses(rounds[-1]))
            )
        models = distribute(settings, breadth, refs)
        if last and settings.synthesis_model:
            models = [settings.synthesis_model]
        try:
            record = await _round(loop, settings, number, models, asked)
        except VllmSrError:
            if settings.on_error == "fail" or not rounds or not _responses(rounds[-1]):
                raise
            break
        rounds.append(record)
    final = final_answer(rounds, len(rounds) == len(schedule))
    result.model = str(final.get("model") or "")
    result.answer = {
        "id": "chatcmpl-remom",
        "object": "chat.completion",
        "created": 0,
        "model": result.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": final.get("content")},
                "finish_reason": "stop",
            }
        ],
    }
    if settings.include_intermediate_responses:
        result.extra["reasoning_mom_responses"] = rounds


def _usable(answer: JsonObject) -> bool:
    """An answer with content or reasoning (one without says nothing to the next round)."""
    return bool(synthesis_text(answer).strip())


async def _round(
    loop: Loop, settings: RemomSettings, number: int, models: Sequence[str], asked: JsonObject
) -> JsonObject:
    spec = RoundSpec(
        max_concurrent=settings.max_concurrent,
        quorum=settings.min_successful_responses,
        timeout_s=settings.round_timeout_seconds,
        on_error=settings.on_error,
        usable=_usable,
    )
    done = await loop.round([(m, asked) for m in models], spec)
    usable = [(g.model, g.answer) for g in done.answers if _usable(g.answer)]
    if settings.on_error == "fail" and (done.cut_short or len(usable) < len(done.answers)):
        raise Unavailable(f"remom round {number}: {done.cut_short or 'an unusable answer'}")
    if not usable:
        if done.cut_short == "deadline":
            raise DeadlineExceeded(f"remom round {number}: the deadline passed")
        reasons = "; ".join(f"{m}: {why}" for m, why in done.failures) or "no usable content"
        raise Unavailable(f"remom round {number}: no usable answer ({reasons})")
    return keep_round(settings, number, len(models), usable)
