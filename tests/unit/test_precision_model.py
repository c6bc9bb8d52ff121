"""The served precision on the real d3-edge encoder, in process: bfloat16 answers stay within
the documented tolerance of float32 ones on a few hundred varied texts, the golden check passes
a bfloat16 worker against the float32 references and refuses one whose weights drifted, and a
bfloat16 forward rerun gives the same bytes (what adaptive threads' shadow passes compare)."""

from __future__ import annotations

from typing import Any

import numpy
import pytest

from tests.support.texts import varied_texts
from vllm_sr.errors import GoldenCheckFailed
from vllm_sr.worker import goldens
from vllm_sr.worker.artifacts import D3_EDGE, load, resolve

BATCH = 32


@pytest.fixture(scope="module")
def d3() -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)  # the answers compared do not depend on it; the run time does
    spec = resolve(D3_EDGE)
    return {dtype: load(spec, "cpu", dtype=dtype) for dtype in ("float32", "bfloat16")}


def forward_all(loaded: Any, rows: list[list[int]]) -> numpy.ndarray:
    return numpy.concatenate(
        [loaded.runner.forward(rows[i : i + BATCH]) for i in range(0, len(rows), BATCH)]
    )


def test_bfloat16_embeddings_stay_within_the_documented_tolerance_of_float32(
    d3: dict[str, Any],
) -> None:
    texts = varied_texts(300)
    tok = d3["float32"].tokenizer
    rows = [tok.truncate(r, d3["float32"].max_length) for r in tok.encode(texts)]
    want = forward_all(d3["float32"], rows)
    got = forward_all(d3["bfloat16"], rows)
    assert got.dtype == numpy.float32  # answers come back float32 at every precision
    assert not numpy.array_equal(got, want)  # the forward really ran in bfloat16
    tol = goldens.TOLERANCES["bfloat16"]
    cosines = numpy.sum(got * want, axis=1)  # unit rows: the dot product is the cosine
    assert cosines.min() >= tol.cosine_min
    assert float(numpy.abs(got - want).max()) <= tol.max_abs_diff
    goldens.compare(got, want, "300 texts", "bfloat16")  # the check the worker runs, too


def _golden_rows(loaded: Any) -> list[list[int]]:
    tok = loaded.tokenizer
    return [tok.truncate(r, loaded.max_length) for r in tok.encode(goldens.GOLDEN_INPUTS)]


def test_the_golden_check_passes_bfloat16_and_refuses_drifted_weights(
    d3: dict[str, Any],
) -> None:
    import torch

    loaded = d3["bfloat16"]
    reference = goldens.load_reference(D3_EDGE)
    assert reference is not None
    rows = _golden_rows(loaded)
    goldens.check_reference(rows, loaded.runner.forward, reference, 384, "bfloat16")
    weight = loaded.runner.model.encoder.layer[-1].output.dense.weight
    original = weight.detach().clone()
    noise = torch.randn(original.shape, generator=torch.Generator().manual_seed(0))
    try:
        with torch.no_grad():
            weight.mul_(1 + 0.05 * noise)  # one layer's weights moved by ~5%
        with pytest.raises(GoldenCheckFailed, match="the bfloat16 tolerance"):
            goldens.check_reference(rows, loaded.runner.forward, reference, 384, "bfloat16")
    finally:
        with torch.no_grad():
            weight.copy_(original)


def test_a_bfloat16_forward_rerun_gives_the_same_bytes(d3: dict[str, Any]) -> None:
    """Shadow passes rerun the served forward: at the served dtype, so the same rows at the
    same thread count must give bit-identical answers."""
    loaded = d3["bfloat16"]
    rows = _golden_rows(loaded)
    first = loaded.runner.forward(rows)
    assert first.tobytes() == loaded.runner.forward(rows).tobytes()
    assert first.tobytes() != d3["float32"].runner.forward(rows).tobytes()
