"""The ``confidence`` looper's settings and scores: try the decision's modelRefs one after
another in the escalation order and keep the first answer whose confidence, read from the
answer's token logprobs, reaches ``threshold`` (else the last answer).

Settings (upstream's ``algorithm.confidence`` block): ``confidence_method`` one of
``avg_logprob`` (exp of the mean token logprob), ``margin`` (the mean gap between the chosen
token's and the runner-up's probability) and ``hybrid`` (their mean); ``threshold`` within
0-1; ``escalation_order`` ``small_to_large`` (the modelRefs' order) or ``large_to_small``
(reversed); ``on_error`` ``skip`` (a model that fails is passed over) or ``fail`` (the loop
ends with that failure)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from vllm_sr.config.routing_base import Path, Strict, as_dict, problem

if TYPE_CHECKING:
    from collections.abc import Sequence

    from vllm_sr.config.problems import Problem

METHODS = ("avg_logprob", "margin", "hybrid")
ORDERS = ("small_to_large", "large_to_small")
ON_ERROR = ("skip", "fail")
FIELDS = ("confidence_method", "threshold", "escalation_order", "on_error")


class ConfidenceSettings(Strict):
    confidence_method: Literal["avg_logprob", "margin", "hybrid"] = "avg_logprob"
    """How an answer's confidence is read from its token logprobs."""

    threshold: float = Field(default=0.7, ge=0.0, le=1.0)
    """The confidence (0-1) at which an answer is kept."""

    escalation_order: Literal["small_to_large", "large_to_small"] = "small_to_large"
    """small_to_large: the modelRefs in their order; large_to_small: reversed."""

    on_error: Literal["skip", "fail"] = "skip"
    """skip: a model that fails is passed over; fail: the loop ends with its failure."""


def confidence_problems(base: Path, block: Any) -> list[Problem]:
    """Upstream's checks of ``algorithm.confidence``, each naming field, value and accepted."""
    got = as_dict(block)
    problems: list[Problem] = []
    for key in got:
        if key not in FIELDS:
            problems.append(
                problem((*base, key), f"unknown field {key!r}; accepted: {', '.join(FIELDS)}")
            )
    for key, accepted in (
        ("confidence_method", METHODS),
        ("escalation_order", ORDERS),
        ("on_error", ON_ERROR),
    ):
        if key in got and got[key] not in accepted:
            problems.append(
                problem(
                    (*base, key), f"{got[key]!r} is not accepted; accepted: {', '.join(accepted)}"
                )
            )
    if "threshold" in got:
        value = got["threshold"]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or not 0.0 <= value <= 1.0:
            problems.append(
                problem(
                    (*base, "threshold"),
                    f"{value!r} is not accepted; accepted: a number within 0-1",
                )
            )
    return problems


def ordered(models: Sequence[str], settings: ConfidenceSettings) -> list[str]:
    return list(models) if settings.escalation_order == "small_to_large" else list(reversed(models))


def token_logprobs(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The first choice's ``logprobs.content`` entries of an OpenAI chat answer ([] if none)."""
    choices = answer.get("choices") or [{}]
    logprobs = as_dict(as_dict(choices[0]).get("logprobs"))
    content = logprobs.get("content")
    return [as_dict(t) for t in content] if isinstance(content, list) else []


def score(tokens: Sequence[dict[str, Any]], method: str) -> float | None:
    """The answer's confidence (0-1) by ``method``; None when it carries no logprobs."""
    tokens = [t for t in tokens if isinstance(t.get("logprob"), (int, float))]
    lps = [float(t["logprob"]) for t in tokens]
    if not lps:
        return None
    avg = math.exp(sum(lps) / len(lps))
    if method == "avg_logprob":
        return avg
    gaps = []
    for t, lp in zip(tokens, lps, strict=True):
        rivals = sorted(
            (
                float(r["logprob"])
                for r in t.get("top_logprobs") or []
                if isinstance(r, dict)
                and isinstance(r.get("logprob"), (int, float))
                and r.get("token") != t.get("token")
            ),
            reverse=True,
        )
        gaps.append(math.exp(lp) - (math.exp(rivals[0]) if rivals else 0.0))
    margin = max(0.0, min(1.0, sum(gaps) / len(gaps)))
    return margin if method == "margin" else (avg + margin) / 2
