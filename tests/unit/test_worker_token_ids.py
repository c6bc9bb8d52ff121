"""/v1/embeddings takes token-id arrays as the OpenAI API does: one row ``[ids]`` or several
``[[ids], ...]``, each validated (integers in the vocabulary, not empty, within the maximum
length unless ``truncate``) with an error naming the element."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.fakes import expected_output
from tests.unit.test_worker_api import Served, serve, stop

VOCAB = 1000


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    s = await serve(vocab_size=VOCAB, max_length=8)
    yield s
    await stop(s)


async def test_one_row_of_token_ids(served: Served) -> None:
    resp = await served.client.post("/v1/embeddings", json={"input": [101, 7, 8, 102]})
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert [d["embedding"] for d in body["data"]] == [expected_output([101, 7, 8, 102])]
    assert body["usage"]["prompt_tokens"] == 4
    assert served.runner.forwards == [[[101, 7, 8, 102]]]  # the ids as given


async def test_several_rows_of_token_ids_in_order(served: Served) -> None:
    rows = [[101, 5, 102], [0], [999, 1, 2, 3]]
    resp = await served.client.post("/v1/embeddings", json={"input": rows})
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert [d["embedding"] for d in body["data"]] == [expected_output(r) for r in rows]
    assert body["usage"]["total_tokens"] == 8


async def test_token_ids_in_a_bundle_task(served: Served) -> None:
    ids = list(range(1, 9))
    bundle = {"tasks": [{"id": "t", "embeddings": {"input": ids}}]}
    body = await (await served.client.post("/v1/bundle", json=bundle)).json()
    assert body["results"][0]["status"] == 200
    assert body["results"][0]["body"]["data"][0]["embedding"] == expected_output(ids)


@pytest.mark.parametrize(
    ("value", "names"),
    [
        ([101, VOCAB], ["input[1]", f"token id {VOCAB}", f"0 to {VOCAB - 1}"]),
        ([[1, 2], [3, -4]], ["input[1][1]", "token id -4", "vocabulary"]),
        ([[1, 2], []], ["input[1]", "empty"]),
        ([[1, 2], "text"], ["input[1]", "list of token ids", "string"]),
        ([1, 2.5], ["input[1]", "integer", "number"]),
        ([1, True], ["input[1]", "integer", "boolean"]),
        ([[1, "2"]], ["input[0][1]", "integer", "string"]),
    ],
)
async def test_bad_token_ids_are_400_naming_the_element(
    served: Served, value: object, names: list[str]
) -> None:
    resp = await served.client.post("/v1/embeddings", json={"input": value})
    assert resp.status == 400
    message = (await resp.json())["error"]["message"]
    for name in names:
        assert name in message, message


async def test_token_rows_over_the_maximum_length(served: Served) -> None:
    long = list(range(1, 12))  # 11 ids, the maximum is 8
    resp = await served.client.post("/v1/embeddings", json={"input": [[1], long]})
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["code"] == "max_length_exceeded" and "input[1]: 11 tokens" in error["message"]
    resp = await served.client.post("/v1/embeddings", json={"input": long, "truncate": True})
    assert resp.status == 200
    assert served.runner.forwards[-1] == [[*long[:7], long[-1]]]


async def test_too_many_token_rows_is_413(served: Served) -> None:
    resp = await served.client.post("/v1/embeddings", json={"input": [[1]] * 2049})
    assert resp.status == 413


async def test_classify_still_takes_text_only(served: Served) -> None:
    resp = await served.client.post(
        "/v1/classify", json={"input": [101, 102], "labels": {"a": ["x"]}}
    )
    assert resp.status == 400
    assert "input[0]: expected a string" in (await resp.json())["error"]["message"]
