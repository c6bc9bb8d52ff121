"""The startup golden check.

d3-edge: fixed inputs whose embeddings must match references shipped in
``vllm_sr/worker/golden/d3-edge.json`` (made by a plain one-text-at-a-time transformers
forward, see ``main``) within ``COSINE_MIN`` and ``MAX_ABS_DIFF`` per element. A local
artifact has no references, so its batched forward must agree with one-row forwards within the
same tolerance (padding must not change an answer). Any failure: GoldenCheckFailed (exit 78).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy

from vllm_sr.errors import GoldenCheckFailed

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
COSINE_MIN = 0.9999
MAX_ABS_DIFF = 2e-3  # per element; GPU kernels (TF32, fused attention) move ~1e-4..1e-3

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


def compare(got: numpy.ndarray, want: numpy.ndarray, what: str) -> None:
    """Raise GoldenCheckFailed naming the first row outside the tolerance."""
    if got.shape != want.shape:
        raise GoldenCheckFailed(f"{what}: shape {got.shape} differs from {want.shape}")
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        diff = float(numpy.abs(g - w).max()) if g.size else 0.0
        denom = float(numpy.linalg.norm(g) * numpy.linalg.norm(w)) or 1.0
        cosine = float(numpy.dot(g, w)) / denom
        if cosine < COSINE_MIN or diff > MAX_ABS_DIFF:
            raise GoldenCheckFailed(
                f"{what}: row {i} differs (cosine {cosine:.6f} < {COSINE_MIN} or "
                f"max abs diff {diff:.2e} > {MAX_ABS_DIFF:.0e})"
            )


def check_reference(
    rows: list[list[int]], forward: Forward, reference: dict[str, Any], dimensions: int
) -> None:
    want = numpy.asarray(reference["embeddings"], dtype=numpy.float32)
    got = forward(rows)[:, :dimensions]
    compare(got, want, "golden check against the shipped references")
    # One-row forwards too: the reference must hold with and without padding.
    single = numpy.concatenate([forward([r])[:, :dimensions] for r in rows[:2]])
    compare(single, want[:2], "golden check (one-row forwards)")


def check_consistency(rows: list[list[int]], forward: Forward) -> None:
    batched = forward(rows)
    single = numpy.concatenate([forward([r]) for r in rows])
    compare(batched, single, "golden check: batched and one-row forwards")


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
