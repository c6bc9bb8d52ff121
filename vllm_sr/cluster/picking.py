"""Picking a cluster member: the least loaded, and the smooth weighted round robin.

The callers decide who may take part (ready, healthy, not ejected, not full) and what "load"
means (the pool: outstanding request bytes; LLM backends: chats in flight per unit of weight).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypeVar

T = TypeVar("T")


class Weighted(Protocol):
    weight: int
    inflight: int  # requests in flight: the load
    rr_current: int  # the smooth weighted round robin's running score


W = TypeVar("W", bound=Weighted)


def least_loaded(
    candidates: Iterable[T],
    load: Callable[[T], tuple[float, float]],
) -> T | None:
    """The candidate with the lowest ``load`` (a tuple: the load, then its tie-breaker), the
    first on ties; None when there is none."""
    best: T | None = None
    best_load: tuple[float, float] | None = None
    for c in candidates:
        key = load(c)
        if best_load is None or key < best_load:
            best, best_load = c, key
    return best


def weighted_pick(candidates: Sequence[W], *, least_request: bool = True) -> W:
    """One of ``candidates`` (non-empty) by smooth weighted round robin (nginx's): every
    candidate's score grows by its weight, the highest score wins (first on ties) and gives
    back the weights' sum. With ``least_request`` only the least loaded candidates, by
    requests in flight per unit of weight, take part (all of them still gain their weight)."""
    total = 0
    for c in candidates:
        c.rr_current += c.weight
        total += c.weight
    if least_request:
        chosen = least_loaded(candidates, lambda c: (c.inflight / c.weight, -c.rr_current))
    else:
        chosen = least_loaded(candidates, lambda c: (0.0, -c.rr_current))
    assert chosen is not None, "weighted_pick needs a candidate"
    chosen.rr_current -= total
    return chosen
