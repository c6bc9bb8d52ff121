"""vllm_sr/heap.py: a process's heap, collected once and frozen; the next settle
frees what an earlier one froze and has since become garbage."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from vllm_sr import heap


class Node:
    def __init__(self) -> None:
        self.me: Node | None = self  # a reference cycle: only the collector frees it


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()  # the rest of the test session collects as usual
    gc.set_threshold(*threshold)


def test_settle_collects_garbage_then_freezes_what_survives() -> None:
    garbage = Node()
    gone = weakref.ref(garbage)
    del garbage
    kept = Node()
    settled = heap.settle()
    assert gone() is None and settled.collected >= 1
    assert settled.frozen == gc.get_freeze_count() > 0
    assert not any(o is kept for o in gc.get_objects())  # frozen: no generation holds it
    assert settled.ms >= 0.0
    assert gc.get_threshold()[0] == heap.YOUNG_THRESHOLD  # young collections are rarer


def test_a_frozen_cycle_is_freed_by_the_next_settle() -> None:
    retired = Node()  # a generation alive at one settle, retired afterwards
    ref = weakref.ref(retired)
    heap.settle()
    del retired
    gc.collect()
    assert ref() is not None  # frozen: the collector skips it
    heap.settle()
    assert ref() is None
