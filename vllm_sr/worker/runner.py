"""What a loaded artifact runs: the torch forward (padded rows in, mean-pooled L2-normalised
embeddings and any head's logits out, at the served precision), the tokenizer adapter that
turns texts into token ids without padding or truncation, and the torch device a device name
maps to. ``artifacts.load`` builds them; the engine calls the runner on its forward thread.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy

from vllm_sr.errors import ArtifactError
from vllm_sr.worker import precision


class TokenizerAdapter:
    """Token ids for texts, with no padding and no truncation (the engine pads; the API
    decides between ``max_length_exceeded`` and truncation)."""

    def __init__(self, tokenizer: Any) -> None:
        self._hf = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:
            # A copy, so the HF wrapper keeps its own padding/truncation settings.
            from tokenizers import Tokenizer

            backend = Tokenizer.from_str(backend.to_str())
            backend.no_padding()
            backend.no_truncation()
        self._backend = backend
        # encode_batch_fast (tokenizers >= 0.21) skips the character offsets, which nothing
        # here reads: about a fifth less time for a ~100-token text.
        self._encode_batch = (
            None if backend is None else getattr(backend, "encode_batch_fast", backend.encode_batch)
        )
        self.special_ids = frozenset(int(i) for i in getattr(tokenizer, "all_special_ids", []))

    def encode(self, texts: list[str]) -> list[list[int]]:
        if self._encode_batch is not None:
            return [e.ids for e in self._encode_batch(texts, add_special_tokens=True)]
        out = self._hf(texts, add_special_tokens=True, truncation=False, padding=False)
        return [list(ids) for ids in out["input_ids"]]

    def truncate(self, ids: list[int], max_length: int) -> list[int]:
        """Cut to ``max_length`` keeping a closing special token ([SEP]) when there is one."""
        if len(ids) <= max_length:
            return ids
        if ids and ids[-1] in self.special_ids and max_length >= 2:
            return [*ids[: max_length - 1], ids[-1]]
        return ids[:max_length]


class TorchRunner:
    """Runs padded forwards; each output row is the mean-pooled, L2-normalised embedding,
    followed by the classification logits when the model has a head (a token head: each
    label's highest probability over the row's tokens)."""

    def __init__(
        self,
        model: Any,
        device: Any,
        pad_id: int,
        classifier: bool,
        dtype: str = "float32",
        token: bool = False,
    ) -> None:
        self.model = model
        self.device = device
        self.pad_id = pad_id
        self.classifier = classifier
        self.dtype = dtype  # the served precision: below float32 the forward runs in autocast
        self._autocast = None if dtype == "float32" else precision.torch_dtype(dtype)
        self.token = token
        self.precast = False  # the linear layers hold their weights at the autocast dtype

    def precast_linears(self, probe: list[list[int]]) -> bool:
        """Keep the linear layers' weights at the autocast dtype, cast once here instead of
        at every forward (autocast casts float32 weights again in each forward: about 1.3 ms
        of a 9 ms one-row forward of d3-edge at bfloat16 on a 1-thread CPU). Autocast runs
        linear layers at its dtype anyway, casting weights the same way, so answers are the
        same bits: checked on ``probe`` rows, and the float32 weights put back when they
        are not. Returns whether the weights stay cast."""
        if self._autocast is None or self.precast:
            return False
        before = self.forward(probe)
        saved = _cast_linears(self.model, self._autocast)
        if saved and numpy.array_equal(before, self.forward(probe)):
            self.precast = True
            return True
        for module, name, param in saved:
            setattr(module, name, param)
        return False

    def forward(self, rows: list[list[int]]) -> numpy.ndarray:
        import torch

        width = max(len(r) for r in rows)
        ids = numpy.full((len(rows), width), self.pad_id, dtype=numpy.int64)
        mask = numpy.zeros((len(rows), width), dtype=numpy.int64)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
            mask[i, : len(r)] = 1
        input_ids = torch.from_numpy(ids).to(self.device)
        attention = torch.from_numpy(mask).to(self.device)
        with torch.inference_mode(), self._precision(torch):
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention,
                output_hidden_states=self.classifier,
            )
            hidden = out.hidden_states[-1] if self.classifier else out.last_hidden_state
            weights = attention.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
            pooled = torch.nn.functional.normalize(pooled.float(), p=2.0, dim=1)
            if self.classifier and self.token:
                probs = torch.softmax(out.logits.float(), dim=-1) * weights.float()
                pooled = torch.cat([pooled, probs.max(dim=1).values], dim=1)
            elif self.classifier:
                pooled = torch.cat([pooled, out.logits.float()], dim=1)
        result: numpy.ndarray = pooled.cpu().numpy()
        return result

    def _precision(self, torch: Any) -> Any:
        """Autocast at the served dtype (answers come back float32)."""
        if self._autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self._autocast)


def _cast_linears(model: Any, dtype: Any) -> list[tuple[Any, str, Any]]:
    """Cast every ``torch.nn.Linear``'s float32 weight and bias to ``dtype`` in place; ->
    (module, name, the float32 parameter) of each, to put back. A parameter another kind of
    module shares (an embedding tied to an output layer) stays float32: that module does not
    run under autocast's cast."""
    import torch

    linear = torch.nn.Linear
    shared = {
        id(p)
        for m in model.modules()
        if not isinstance(m, linear)
        for p in m.parameters(recurse=False)
    }
    saved = []
    for module in model.modules():
        if not isinstance(module, linear):
            continue
        for name in ("weight", "bias"):
            param = getattr(module, name)
            if param is None or param.dtype != torch.float32 or id(param) in shared:
                continue
            saved.append((module, name, param))
            cast = torch.nn.Parameter(param.detach().to(dtype), requires_grad=False)
            setattr(module, name, cast)
    return saved


def probe_rows(vocab_size: int) -> list[list[int]]:
    """Two rows of different lengths (padding exercised) of ids inside the vocabulary, for
    ``TorchRunner.precast_linears``'s check."""
    top = max(2, vocab_size)
    return [[(7 + 31 * i) % top for i in range(12)], [(11 + 17 * i) % top for i in range(5)]]


def torch_device(device: str) -> Any:
    """``cpu``, ``cuda:N`` or ``rocm:N`` (both map to torch's ``cuda``)."""
    import torch

    if device == "cpu":
        return torch.device("cpu")
    kind, _, index = device.partition(":")
    if kind not in ("cuda", "rocm") or not index.isdigit():
        raise ArtifactError(f"device {device!r} is not accepted: use cpu, cuda:N or rocm:N")
    if not torch.cuda.is_available() or int(index) >= torch.cuda.device_count():
        raise ArtifactError(
            f"device {device!r} is not available here "
            f"({torch.cuda.device_count()} GPU(s) visible to torch)"
        )
    return torch.device("cuda", int(index))
