"""Session fixtures shared by every test package (helpers live in tests/support/)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.models import build_tiny_bert, d3_edge_dir
from tests.support.workers import WorkerHandle, short_socket_dir, start_worker, stop_worker

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer BERT (embeddings only) saved with transformers."""
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert") / "model")


@pytest.fixture(scope="session")
def tiny_classifier_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random BertForSequenceClassification with id2label negative/neutral/positive."""
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-clf") / "model", classifier=True)


@pytest.fixture(scope="session")
def d3_edge_model_dir() -> Path:
    return d3_edge_dir()


@pytest.fixture
def socket_dir() -> Path:
    """A short directory for Unix sockets (the tmp_path of a test can be too long)."""
    return short_socket_dir()


@pytest.fixture(scope="session")
def d3_edge_worker() -> Iterator[WorkerHandle]:
    """One real d3-edge worker process shared by a session (start it only from slow tests)."""
    handle = start_worker("vllm-sr/d3-edge", short_socket_dir() / "d3.sock")
    try:
        yield handle
    finally:
        stop_worker(handle)


@pytest.fixture(scope="session")
def tiny_bert_worker(tiny_bert_dir: Path) -> Iterator[WorkerHandle]:
    """One real worker serving the tiny random BERT, shared by a session."""
    handle = start_worker(str(tiny_bert_dir), short_socket_dir() / "tiny.sock")
    try:
        yield handle
    finally:
        stop_worker(handle)
