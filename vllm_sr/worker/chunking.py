"""transformers' feed-forward helper without its check repeated at every call.

Each BERT-style layer of every forward calls ``transformers.pytorch_utils.
apply_chunking_to_forward``, which first counts the parameters of the function it was given with
``inspect.signature``: six times per d3-edge forward, about 0.3 ms of a 7 ms one-row forward
on a 1-thread CPU (bench/worker_overhead.py). The count cannot change for a given function, so
``install`` swaps, in the modeling modules of a loaded model, a helper that counts once per
function and, when nothing is chunked (``chunk_size`` 0, the models' default), calls the
function directly, as the original does after its check. A count that does not match, or any
chunking, still goes through the original (same errors, same results)."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

NAME = "apply_chunking_to_forward"


def counted_once(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` with its parameter count checked once per function."""
    counts: dict[Any, int] = {}

    def apply_chunking_to_forward(
        forward_fn: Callable[..., Any], chunk_size: int, chunk_dim: int, *inputs: Any
    ) -> Any:
        key = getattr(forward_fn, "__func__", forward_fn)  # one entry per method, not per call
        count = counts.get(key)
        if count is None:
            count = counts[key] = len(inspect.signature(forward_fn).parameters)
        if chunk_size == 0 and inputs and count == len(inputs):
            return forward_fn(*inputs)
        return original(forward_fn, chunk_size, chunk_dim, *inputs)

    apply_chunking_to_forward.__wrapped__ = original  # type: ignore[attr-defined]
    return apply_chunking_to_forward


def install(model: Any) -> list[str]:
    """Swap the helper in every module that defines one of ``model``'s layers and calls
    transformers' own; -> the modules changed (none when transformers has no such helper)."""
    try:
        from transformers import pytorch_utils
    except ImportError:  # pragma: no cover - transformers is how models load
        return []
    original = getattr(pytorch_utils, NAME, None)
    if original is None:
        return []
    swapped = counted_once(original)
    changed = []
    for name in sorted({type(m).__module__ for m in model.modules()}):
        module = sys.modules.get(name)
        if module is not None and getattr(module, NAME, None) is original:
            setattr(module, NAME, swapped)
            changed.append(name)
    return changed
