"""The ``confidence`` looper (its settings and their checks: vllm_sr/config/routing_looper.py):
the escalation order, the answers' scores and the loop over the models.

Scores are 0-1: ``avg_logprob`` is the exponent of the mean token logprob (the geometric mean
token probability); ``margin`` the mean gap between the chosen token's probability and the
best other candidate's (from ``top_logprobs``); ``hybrid`` their weighted sum."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from vllm_sr.config.routing_base import as_dict
from vllm_sr.errors import DeadlineExceeded, VllmSrError
from vllm_sr.jsontypes import JsonObject
from vllm_sr.router.looper.runner import Loop, looper

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from vllm_sr.config.routing_looper import ConfidenceSettings

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmbt]?)\s*$", re.IGNORECASE)
_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def parse_size(text: str | None) -> float | None:
    """A modelCard's ``param_size`` ("8b", "70B", "1.5b", "350m") as a number; None if not."""
    if not text:
        return None
    got = _SIZE.match(text)
    return float(got.group(1)) * _SCALE[got.group(2).lower()] if got else None


def ordered(
    models: Sequence[str],
    settings: ConfidenceSettings,
    size_of: Callable[[str], float | None],
    price_of: Callable[[str], float | None],
) -> list[str]:
    """The escalation order: ``declared`` the modelRefs' order; ``size`` / ``small_to_large``
    the smallest ``param_size`` first; ``cost`` the cheapest prompt price first. A model
    without the fact goes after those with it; ties keep the modelRefs' order."""
    if settings.escalation_order == "declared":
        return list(models)
    fact = price_of if settings.escalation_order == "cost" else size_of

    def key(pair: tuple[int, str]) -> tuple[bool, float, int]:
        value = fact(pair[1])
        return (value is None, value or 0.0, pair[0])

    return [m for _, m in sorted(enumerate(models), key=key)]


def token_logprobs(answer: JsonObject) -> list[JsonObject]:
    """The first choice's ``logprobs.content`` entries of an OpenAI chat answer ([] if none)."""
    choices = answer.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else {}
    logprobs = as_dict(as_dict(first).get("logprobs"))
    content = logprobs.get("content")
    return [as_dict(t) for t in content] if isinstance(content, list) else []


def _number(value: object) -> float | None:
    """``value`` as a float when it is a JSON number (not a bool), else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def score(tokens: Sequence[JsonObject], settings: ConfidenceSettings) -> float | None:
    """The answer's confidence (0-1); None when it carries no logprobs."""
    scored = [(t, lp) for t in tokens if (lp := _number(t.get("logprob"))) is not None]
    if not scored:
        return None
    tokens = [t for t, _ in scored]
    lps = [lp for _, lp in scored]
    avg = math.exp(sum(lps) / len(lps))
    method = settings.confidence_method
    if method == "avg_logprob":
        return avg
    gaps = []
    for t, lp in zip(tokens, lps, strict=True):
        top = t.get("top_logprobs")
        rivals = [
            rival
            for r in (top if isinstance(top, list) else [])
            if isinstance(r, dict)
            and (rival := _number(r.get("logprob"))) is not None
            and r.get("token") != t.get("token")
        ]
        gaps.append(math.exp(lp) - (math.exp(max(rivals)) if rivals else 0.0))
    margin = max(0.0, min(1.0, sum(gaps) / len(gaps)))
    if method == "margin":
        return margin
    return settings.logprob_weight * avg + settings.margin_weight * margin


@looper("confidence")
async def run_confidence(
    loop: Loop, models: Sequence[str], body: JsonObject, settings: ConfidenceSettings
) -> None:
    """Ask ``models`` (in the escalation order, :func:`ordered`) one by one, each with
    logprobs on, until an answer's confidence reaches the threshold (else the last answer is
    kept). The caller's deadline bounds the whole loop: once it has passed, no further call
    starts and the best answer so far is kept (none: DeadlineExceeded). ``on_error: skip``
    passes a failing model over; ``fail`` (or a failure of every model) raises its error."""
    result = loop.result
    inner = {**body, "stream": False, "logprobs": True}
    if settings.confidence_method != "avg_logprob":
        inner.setdefault("top_logprobs", 2)
    inner.pop("stream_options", None)
    last_error: VllmSrError | None = None
    for model in models:
        if loop.expired():
            if result.answer is None:
                raise DeadlineExceeded("the looper's deadline passed before any answer")
            break
        try:
            got = await loop.ask(model, inner)
        except VllmSrError as exc:
            if settings.on_error == "fail":
                raise
            last_error = exc
            continue
        confidence = score(token_logprobs(got.answer), settings)
        result.scores.append(confidence)
        result.answer, result.model = got.answer, got.model
        if confidence is not None and confidence >= settings.threshold:
            break
    if result.answer is None:
        raise last_error or DeadlineExceeded("no model answered the looper")
    if "logprobs" not in body:
        choices = result.answer.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if isinstance(choice, dict):
                choice.pop("logprobs", None)
