"""The golden check's comparisons: the documented tolerance, and a model whose answers move
with padding fails the batched-vs-one-row check (the worker then exits 78)."""

from __future__ import annotations

import numpy
import pytest

from vllm_sr.errors import EXIT_DO_NOT_RESTART, GoldenCheckFailed
from vllm_sr.worker import goldens


def unit_rows(n: int, dims: int = 8, seed: int = 0) -> numpy.ndarray:
    rng = numpy.random.default_rng(seed)
    x = rng.normal(size=(n, dims)).astype(numpy.float32)
    out: numpy.ndarray = x / numpy.linalg.norm(x, axis=1, keepdims=True)
    return out


def test_rows_within_tolerance_pass() -> None:
    want = unit_rows(4)
    goldens.compare(want + goldens.MAX_ABS_DIFF / 10, want, "t")


def test_a_row_past_the_abs_tolerance_fails_naming_it() -> None:
    want = unit_rows(4)
    got = want.copy()
    got[2, 0] += goldens.MAX_ABS_DIFF * 5
    with pytest.raises(GoldenCheckFailed, match="row 2") as info:
        goldens.compare(got, want, "t")
    assert info.value.exit_code == EXIT_DO_NOT_RESTART


def test_a_different_direction_fails_on_cosine() -> None:
    want = unit_rows(3)
    got = want.copy()
    got[1] = unit_rows(1, seed=9)[0]
    with pytest.raises(GoldenCheckFailed, match="row 1"):
        goldens.compare(got, want, "t")


def test_shape_mismatch_fails() -> None:
    with pytest.raises(GoldenCheckFailed, match="shape"):
        goldens.compare(unit_rows(2, dims=8), unit_rows(2, dims=4), "t")


def padding_sensitive(rows: list[list[int]]) -> numpy.ndarray:
    """A broken model: each answer depends on how wide the batch was padded."""
    width = max(map(len, rows))
    out = numpy.zeros((len(rows), 3), dtype=numpy.float32)
    for i, r in enumerate(rows):
        out[i] = [len(r), width, 1.0]
    return out


def padding_blind(rows: list[list[int]]) -> numpy.ndarray:
    out = numpy.zeros((len(rows), 3), dtype=numpy.float32)
    for i, r in enumerate(rows):
        out[i] = [len(r), sum(r) % 7, 1.0]
    return out


def test_consistency_check_catches_a_model_that_moves_with_padding() -> None:
    rows = [[1, 2], [3, 4, 5, 6, 7], [8]]
    goldens.check_consistency(rows, padding_blind)
    with pytest.raises(GoldenCheckFailed, match="batched and one-row"):
        goldens.check_consistency(rows, padding_sensitive)


def test_the_shipped_d3_edge_reference_matches_its_inputs() -> None:
    ref = goldens.load_reference("vllm-sr/d3-edge")
    assert ref is not None
    assert ref["inputs"] == goldens.GOLDEN_INPUTS
    emb = numpy.asarray(ref["embeddings"])
    assert emb.shape == (len(goldens.GOLDEN_INPUTS), 384)
    numpy.testing.assert_allclose(numpy.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    assert goldens.load_reference("vllm-sr/unknown") is None
