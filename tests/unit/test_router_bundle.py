"""The worker bundle as Router mode speaks it (vllm_sr/router/bundle.py): one builder of the
request, one decoder of the answer, for routing, the cache's query embedding and
tool_selection."""

from __future__ import annotations

import base64
import json

import numpy
import pytest

from vllm_sr.router import bundle


def b64(row: list[float]) -> str:
    return base64.b64encode(numpy.asarray(row, dtype=numpy.float32).tobytes()).decode()


def answer(*results: dict[str, object]) -> bytes:
    return json.dumps({"object": "bundle", "results": list(results)}).encode()


def test_the_request_asks_base64_truncated_embeddings_and_keeps_non_ascii() -> None:
    body = bundle.request([bundle.embed_task("query", ["café"]), {"id": "h", "classify": {}}])
    assert "café" in body.decode()  # not escaped: the same bytes every caller sends
    doc = json.loads(body)
    assert doc["tasks"][0] == {
        "id": "query",
        "embeddings": {"input": ["café"], "encoding_format": "base64", "truncate": True},
    }
    assert doc["tasks"][1]["id"] == "h"


def test_decode_reads_results_by_id_and_refusals() -> None:
    got = bundle.decode(
        answer(
            {"id": "q", "status": 200, "body": {"data": []}},
            {"id": "c", "status": 429, "body": {"error": {"code": "busy", "message": "m"}}},
            {"id": "x", "status": 500, "body": None},
        )
    )
    assert got["q"].ok and not got["c"].ok
    assert dict(got["c"].error()) == {"code": "busy", "message": "m"}
    assert dict(got["x"].error()) == {}


@pytest.mark.parametrize("bad", [b"not json", b"{}", b'{"results": [1]}', b'{"results": [[]]}'])
def test_an_unreadable_answer_raises(bad: bytes) -> None:
    with pytest.raises(bundle.BundleAnswerError, match="no results"):
        bundle.decode(bad)


def test_embeddings_read_base64_and_number_rows() -> None:
    rows = bundle.embeddings({"data": [{"embedding": b64([1, 2])}, {"embedding": [3, 4]}]})
    assert rows.dtype == numpy.float32 and rows.tolist() == [[1, 2], [3, 4]]
    assert bundle.embeddings({"data": []}).shape == (0,)
    with pytest.raises(bundle.BundleAnswerError, match="bad embeddings"):
        bundle.embeddings({"data": [{"embedding": "abcd"}]})  # 3 bytes: no float32 row
    with pytest.raises(bundle.BundleAnswerError):
        bundle.embeddings({"nodata": 1})


def test_task_embeddings_is_none_unless_the_task_answered() -> None:
    ok = answer({"id": "q", "status": 200, "body": {"data": [{"embedding": b64([5, 6])}]}})
    got = bundle.task_embeddings(ok, "q")
    assert got is not None and [r.tolist() for r in got] == [[5, 6]]
    assert bundle.task_embeddings(ok, "other") is None
    refused = answer({"id": "q", "status": 503, "body": {}})
    assert bundle.task_embeddings(refused, "q") is None
    assert bundle.task_embeddings(b"garbage", "q") is None
