"""A deployment's input{max_tokens, overflow} (upstream v0.4) on real worker processes serving
a tiny BERT built in a temp dir: reject answers 400 naming the limit, truncate cuts to it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy
import pytest

from tests.support.workers import WorkerHandle, short_socket_dir, start_worker, stop_worker

pytestmark = pytest.mark.slow

LIMIT = 8
LONG = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi"


@pytest.fixture(scope="module")
def workers(tiny_bert_dir: Path) -> Iterator[tuple[WorkerHandle, WorkerHandle]]:
    sockets = short_socket_dir()
    limit = ["--max-input-tokens", str(LIMIT)]
    reject = start_worker(str(tiny_bert_dir), sockets / "reject.sock", extra_args=limit)
    try:
        truncate = start_worker(
            str(tiny_bert_dir),
            sockets / "truncate.sock",
            extra_args=[*limit, "--overflow", "truncate"],
        )
    except BaseException:
        stop_worker(reject)
        raise
    yield reject, truncate
    stop_worker(truncate)
    stop_worker(reject)


def _embedding(handle: WorkerHandle, body: dict[str, object]) -> numpy.ndarray:
    resp = handle.post("/v1/embeddings", body)
    assert resp.status == 200, resp.body
    return numpy.array(resp.json()["data"][0]["embedding"], dtype=numpy.float32)


def test_reject_is_a_400_naming_the_deployments_limit(
    workers: tuple[WorkerHandle, WorkerHandle],
) -> None:
    reject, _ = workers
    resp = reject.post("/v1/embeddings", {"input": LONG})
    assert resp.status == 400
    err = resp.json()["error"]
    assert err["code"] == "max_length_exceeded"
    assert f"the deployment's input.max_tokens of {LIMIT}" in err["message"]
    assert reject.post("/v1/embeddings", {"input": "short"}).status == 200
    (card,) = reject.get("/v1/models").json()["data"]
    assert card["input"] == {"max_tokens": LIMIT, "overflow": "reject"}


def test_truncate_cuts_to_the_limit_without_the_request_asking(
    workers: tuple[WorkerHandle, WorkerHandle],
) -> None:
    reject, truncate = workers
    cut = _embedding(truncate, {"input": LONG})
    # the same weights cutting at the same limit because the request asked
    asked = _embedding(reject, {"input": LONG, "truncate": True})
    numpy.testing.assert_allclose(cut, asked, rtol=1e-5, atol=1e-6)
    whole_prefix = _embedding(truncate, {"input": " ".join(LONG.split()[:2])})
    assert not numpy.allclose(cut, whole_prefix)
