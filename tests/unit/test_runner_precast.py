"""Linear weights cast once at load (``TorchRunner.precast_linears``): a runner below float32
keeps its linear layers at the autocast dtype and answers the same bits as autocast casting them
at every forward; a model whose answers would change gets its float32 weights back; float32
runners are left alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy
import pytest

from tests.support.models import build_tiny_bert
from tests.support.texts import varied_texts
from vllm_sr.worker.artifacts import D3_EDGE, load, resolve
from vllm_sr.worker.runner import TorchRunner, probe_rows


def autocast_only(loaded_float32: Any, dtype: str) -> TorchRunner:
    """A runner at ``dtype`` over a float32 model, never precast: autocast casts the weights
    in every forward (what every runner did before)."""
    r = loaded_float32.runner
    return TorchRunner(r.model, r.device, r.pad_id, r.classifier, dtype=dtype, token=r.token)


def linear_dtypes(model: Any) -> set[Any]:
    import torch

    return {m.weight.dtype for m in model.modules() if isinstance(m, torch.nn.Linear)}


def batches(loaded: Any, n: int, size: int) -> list[list[list[int]]]:
    tok = loaded.tokenizer
    rows = [tok.truncate(r, loaded.max_length) for r in tok.encode(varied_texts(n))]
    return [rows[i : i + size] for i in range(0, len(rows), size)]


@pytest.mark.parametrize("kind", ["encoder", "classifier", "token classifier"])
def test_a_bfloat16_runner_keeps_linear_weights_cast_and_answers_the_same_bits(
    kind: str, tiny_bert_dir: Path, tiny_classifier_dir: Path, tmp_path: Path
) -> None:
    import torch

    dirs = {"encoder": tiny_bert_dir, "classifier": tiny_classifier_dir}
    where = dirs.get(kind) or build_tiny_bert(tmp_path / "tok", classifier=True, token=True)
    spec = resolve(str(where))
    cast = load(spec, "cpu", dtype="bfloat16")
    plain = autocast_only(load(spec, "cpu", dtype="float32"), "bfloat16")
    assert cast.runner.precast and not plain.precast
    assert linear_dtypes(cast.runner.model) == {torch.bfloat16}
    assert linear_dtypes(plain.model) == {torch.float32}
    for rows in batches(cast, 40, 7):  # rows of many lengths, padded together
        got, want = cast.runner.forward(rows), plain.forward(rows)
        assert got.dtype == numpy.float32
        assert got.tobytes() == want.tobytes()


def test_d3_edge_at_bfloat16_answers_the_same_bits_with_weights_cast_once() -> None:
    import torch

    torch.set_num_threads(1)
    spec = resolve(D3_EDGE)
    cast = load(spec, "cpu", dtype="bfloat16")
    plain = autocast_only(load(spec, "cpu", dtype="float32"), "bfloat16")
    assert cast.runner.precast
    for rows in batches(cast, 96, 16) + [[r] for r in batches(cast, 8, 1)[0]]:
        assert cast.runner.forward(rows).tobytes() == plain.forward(rows).tobytes()


def test_a_float32_runner_is_not_cast(tiny_bert_dir: Path) -> None:
    import torch

    loaded = load(resolve(str(tiny_bert_dir)), "cpu", dtype="float32")
    assert not loaded.runner.precast
    assert not loaded.runner.precast_linears(probe_rows(100))
    assert linear_dtypes(loaded.runner.model) == {torch.float32}


class _Output:
    def __init__(self, hidden: Any) -> None:
        self.last_hidden_state = hidden


def _weight_reader() -> Any:
    """A model that reads a linear layer's weight outside a linear op (its sum, in float32):
    casting that weight would change its answers."""
    import torch

    class WeightReader(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.embed = torch.nn.Embedding(50, 8)
            self.dense = torch.nn.Linear(8, 8)

        def forward(self, input_ids: Any, attention_mask: Any, **_: Any) -> _Output:
            hidden = self.dense(self.embed(input_ids))
            with torch.autocast("cpu", enabled=False):
                scale = self.dense.weight.float().sum()
            return _Output(hidden.float() * scale)

    return WeightReader().eval()


def test_weights_go_back_to_float32_when_casting_would_change_the_answers() -> None:
    import torch

    model = _weight_reader()
    runner = TorchRunner(model, torch.device("cpu"), 0, classifier=False, dtype="bfloat16")
    rows = probe_rows(50)
    before = runner.forward(rows)
    assert not runner.precast_linears(rows)
    assert not runner.precast
    assert model.dense.weight.dtype == torch.float32 and model.dense.bias.dtype == torch.float32
    assert runner.forward(rows).tobytes() == before.tobytes()
