"""transformers' feed-forward helper with its signature check done once per function
(``vllm_sr.worker.chunking``): loading a model swaps it in the model's modeling module, answers
keep every bit, and a wrong argument count or real chunking still go through the original."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.texts import varied_texts
from vllm_sr.worker import chunking
from vllm_sr.worker.artifacts import load, resolve

MODELING = "transformers.models.bert.modeling_bert"


def original() -> Any:
    from transformers import pytorch_utils

    return pytorch_utils.apply_chunking_to_forward


def test_loading_swaps_the_helper_and_the_answers_keep_every_bit(tiny_bert_dir: Path) -> None:
    loaded = load(resolve(str(tiny_bert_dir)), "cpu", dtype="bfloat16")
    module = sys.modules[MODELING]
    swapped = module.apply_chunking_to_forward
    assert swapped is not original() and swapped.__wrapped__ is original()
    assert chunking.install(loaded.runner.model) == []  # once is enough: nothing left to swap
    tok = loaded.tokenizer
    rows = [tok.truncate(r, loaded.max_length) for r in tok.encode(varied_texts(24))]
    batches = [rows[i : i + 6] for i in range(0, len(rows), 6)]
    fast = [loaded.runner.forward(b) for b in batches]
    module.apply_chunking_to_forward = original()
    try:
        for b, got in zip(batches, fast, strict=True):
            assert loaded.runner.forward(b).tobytes() == got.tobytes()
    finally:
        module.apply_chunking_to_forward = swapped


def test_a_wrong_argument_count_still_raises_every_time() -> None:
    apply = chunking.counted_once(original())
    calls = []

    def two(a: int, b: int) -> int:
        calls.append((a, b))
        return a + b

    assert apply(two, 0, 1, 1, 2) == 3
    for _ in range(2):
        with pytest.raises(ValueError, match="expects 2 arguments"):
            apply(two, 0, 1, 1)
    assert calls == [(1, 2)]


def test_chunking_goes_through_the_original() -> None:
    import torch

    apply = chunking.counted_once(original())
    x = torch.arange(12.0).reshape(4, 3)
    seen = []

    def double(t: Any) -> Any:
        seen.append(tuple(t.shape))
        return t * 2

    assert torch.equal(apply(double, 2, 0, x), x * 2)
    assert seen == [(2, 3), (2, 3)]  # two chunks of two rows, as the original cuts them
    with pytest.raises(ValueError, match="multiple of the chunk size"):
        apply(double, 3, 0, x)
