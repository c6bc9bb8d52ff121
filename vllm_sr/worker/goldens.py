"""The startup golden check.

d3-edge: fixed inputs whose embeddings must match references shipped in
``vllm_sr/worker/golden/d3-edge.json`` (made by a plain one-text-at-a-time transformers
forward in float32, see ``main``) within the tolerance of the served dtype (``TOLERANCES``:
a bfloat16 worker is still compared with the float32 references, within a wider margin). A local
artifact has no references, so its batched forward must agree with one-row forwards within the
same tolerance (padding must not change an answer). Any failure: GoldenCheckFailed (exit 78).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy

from vllm_sr.errors import GoldenCheckFailed

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
COSINE_MIN = 0.9999
MAX_ABS_DIFF = 2e-3  # per element; GPU kernels (TF32, fused attention) move ~1e-4..1e-3


@dataclass(frozen=True)
class Tolerance:
    cosine_min: float
    max_abs_diff: float  # per element


# Per served dtype, against float32 answers. Measured on d3-edge, 300 varied texts, CPU
# autocast (docs/worker.md): bfloat16 worst cosine 0.999935, worst element 1.7e-3; float16
# 0.999999 and 2.3e-4. The margins leave room for other kernels (GPUs) while a model whose
# answers really moved (other weights, a broken kernel) lands far outside.
TOLERANCES: dict[str, Tolerance] = {
    "float32": Tolerance(COSINE_MIN, MAX_ABS_DIFF),
    "float16": Tolerance(COSINE_MIN, MAX_ABS_DIFF),
    "bfloat16": Tolerance(0.9995, 5e-3),
}

GOLDEN_INPUTS = [
    "hello",
    "The quick brown fox jumps over the lazy dog.",
    "How do I reset my password if I no longer have access to my email account?",
    "Quarterly revenue grew 12% while operating costs fell, beating analyst expectations.",
    "def add(a, b):\n    return a + b",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    (
        "Routing a request to the right model depends on what the user asks, how long the "
        "context is, and which deployments are healthy; a semantic router embeds the question, "
        "compares it with the examples of each route, and picks the closest one, falling back "
        "to a default model when no route is near enough to trust the decision."
    ),
    "",
]

# Rows the engine runs: the texts' token ids. ``Forward`` runs a list of them as one job.
Forward = Callable[[list[list[int]]], numpy.ndarray]


def reference_path(artifact: str) -> Path:
    return GOLDEN_DIR / (artifact.rsplit("/", 1)[-1] + ".json")


def load_reference(artifact: str) -> dict[str, Any] | None:
    path = reference_path(artifact)
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def compare(got: numpy.ndarray, want: numpy.ndarray, what: str, dtype: str = "float32") -> None:
    """Raise GoldenCheckFailed naming the first row outside the tolerance of ``dtype``."""
    tol = TOLERANCES[dtype]
    if got.shape != want.shape:
        raise GoldenCheckFailed(f"{what}: shape {got.shape} differs from {want.shape}")
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        diff = float(numpy.abs(g - w).max()) if g.size else 0.0
        denom = float(numpy.linalg.norm(g) * numpy.linalg.norm(w)) or 1.0
        cosine = float(numpy.dot(g, w)) / denom
        if cosine < tol.cosine_min or diff > tol.max_abs_diff:
            raise GoldenCheckFailed(
                f"{what}: row {i} differs (cosine {cosine:.6f} < {tol.cosine_min} or "
                f"max abs diff {diff:.2e} > {tol.max_abs_diff:.0e}, the {dtype} tolerance)"
            )


def check_reference(
    rows: list[list[int]],
    forward: Forward,
    reference: dict[str, Any],
    dimensions: int,
    dtype: str = "float32",
) -> None:
    want = numpy.asarray(reference["embeddings"], dtype=numpy.float32)
    got = forward(rows)[:, :dimensions]
    compare(got, want, "golden check against the shipped references", dtype)
    # One-row forwards too: the reference must hold with and without padding.
    single = numpy.concatenate([forward([r])[:, :dimensions] for r in rows[:2]])
    compare(single, want[:2], "golden check (one-row forwards)", dtype)


def check_consistency(rows: list[list[int]], forward: Forward, dtype: str = "float32") -> None:
    batched = forward(rows)
    single = numpy.concatenate([forward([r]) for r in rows])
    compare(batched, single, "golden check: batched and one-row forwards", dtype)


def main() -> None:  # pragma: no cover - regenerates the shipped reference by hand
    """``python -m vllm_sr.worker.goldens``: rewrite golden/d3-edge.json from a plain
    transformers forward of each input alone (no padding, no engine)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from vllm_sr.worker.artifacts import D3_EDGE, resolve, weights_sha256

    spec = resolve(D3_EDGE)
    tokenizer = AutoTokenizer.from_pretrained(spec.path, local_files_only=True)
    model = AutoModel.from_pretrained(spec.path, local_files_only=True).eval()
    vectors = []
    with torch.inference_mode():
        for text in GOLDEN_INPUTS:
            enc = tokenizer(text, return_tensors="pt")
            pooled = model(**enc).last_hidden_state[0].mean(dim=0)
            vectors.append((pooled / pooled.norm()).tolist())
    doc = {
        "artifact": D3_EDGE,
        "weights_sha256": weights_sha256(spec.path),
        "inputs": GOLDEN_INPUTS,
        "tolerance": {"cosine_min": COSINE_MIN, "max_abs_diff": MAX_ABS_DIFF},
        "embeddings": [[round(v, 7) for v in vec] for vec in vectors],
    }
    GOLDEN_DIR.mkdir(exist_ok=True)
    reference_path(D3_EDGE).write_text(json.dumps(doc, indent=0) + "\n")


if __name__ == "__main__":  # pragma: no cover
    main()
