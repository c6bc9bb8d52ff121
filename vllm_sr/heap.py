"""A Router-mode process's heap once its long-lived objects are in: collected once, then
frozen (the frontend once a generation's router is warm; a signal process once its models are
loaded).

A Router-mode frontend holds hundreds of thousands of long-lived objects (the config models,
presidio's and lingua's models, the signals' banks) and allocates a few hundred short-lived
ones per chat. CPython's collector now and then runs a full collection that walks every one
of them: measured with bench/router_signals.py, one every few thousand chats, each holding
the event loop for about 0.2 s (about 0.1 ms per chat on average, and a p99 spike for every
chat in flight). :func:`settle` runs that full collection once, when the process would
otherwise be idle (a new generation is warm), then moves every surviving object to the
collector's permanent generation (``gc.freeze``), which later collections skip; the young
objects of chats are collected as before.

The previous generation's router is still alive at that moment (its chats finish on it), so
it is frozen too; the next :func:`settle` first unfreezes everything, so a retired
generation's reference cycles are freed one reload later (at most one generation's garbage is
held). Objects freed by reference counting (most of them) are freed at once either way.

:func:`settle` also raises the youngest generation's threshold from CPython's 700 allocations
to :data:`YOUNG_THRESHOLD`. A young collection walks every container object allocated since
the last one that is still alive, and at c=64 that is mostly the 64 chats in flight (their
parsed bodies, views, results): with 700, bench/router_signals.py's spread router ran one
every 6 chats, each 0.4 ms, and a middle collection every 60 chats (about 0.1 ms of the loop
per chat in all, a tenth of its CPU); with 20 000 the same chats spent under 0.01 ms per chat
collecting. The memory held meanwhile is at most that many short-lived objects (a few MB);
reference counting still frees all but cycles at once.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

YOUNG_THRESHOLD = 20_000  # allocations between young collections (CPython's default: 700)


@dataclass(frozen=True)
class Settled:
    collected: int  # unreachable objects the full collection found
    frozen: int  # objects moved to the permanent generation
    ms: float  # the whole step (the collection dominates)


def settle() -> Settled:
    """Unfreeze, collect every generation, freeze what survived; young collections every
    :data:`YOUNG_THRESHOLD` allocations."""
    started = time.perf_counter()
    gc.unfreeze()
    collected = gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    return Settled(collected, gc.get_freeze_count(), (time.perf_counter() - started) * 1000.0)
