"""The frontend process's heap once a generation's router is warm: collected once, then frozen.

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
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Settled:
    collected: int  # unreachable objects the full collection found
    frozen: int  # objects moved to the permanent generation
    ms: float  # the whole step (the collection dominates)


def settle() -> Settled:
    """Unfreeze, collect every generation, freeze what survived."""
    started = time.perf_counter()
    gc.unfreeze()
    collected = gc.collect()
    gc.freeze()
    return Settled(collected, gc.get_freeze_count(), (time.perf_counter() - started) * 1000.0)
