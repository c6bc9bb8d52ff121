"""The worker's HTTP API in-process (its real server on a real TCP socket) over the real engine
with a fake model: every surface, every bad input, Server-Timing, metrics, overload."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy
import pytest

from tests.support.fakes import FakeRunner, RecordingPolicy, expected_output, word_ids
from tests.support.local_http import LocalClient
from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.httpserver import HttpServer
from vllm_sr.worker.api import WorkerState, build_server, deliver_to_loop
from vllm_sr.worker.engine import Engine, Faults, Limits
from vllm_sr.worker.surfaces import MAX_ROWS_PER_REQUEST, ModelView

DIMS = 4
TIMING_PARTS = ("parse", "tokenize", "queue", "forward", "post", "total")


@dataclass
class Served:
    client: LocalClient
    state: WorkerState
    runner: FakeRunner
    engine: Engine
    server: HttpServer


def truncate(ids: list[int], n: int) -> list[int]:
    return ids if len(ids) <= n else [*ids[: n - 1], ids[-1]]


async def serve(
    *,
    head_labels: list[str] | None = None,
    max_length: int = 16,
    max_queue_rows: int | None = None,
    faults: Faults | None = None,
    ready: bool = True,
    clock: Clock = SYSTEM_CLOCK,
    vocab_size: int | None = None,
    **state_kw: object,
) -> Served:
    runner = FakeRunner(dims=DIMS)
    dims = 2 if head_labels else DIMS
    state = WorkerState(
        artifact="test/fake",
        device="cpu",
        threads=1,
        policy=RecordingPolicy(1),
        faults=faults or Faults(),
        served_names=frozenset({"test/fake", "fake"}),
        **state_kw,  # type: ignore[arg-type]
    )
    engine = Engine(
        runner,
        Limits(64, 4096),
        clock=clock,
        metrics=state.metrics,
        max_queue_rows=max_queue_rows,
        faults=state.faults,
        deliver=deliver_to_loop(asyncio.get_running_loop()),
    )
    engine.start()
    state.engine = engine
    state.limits = engine.limits
    state.view = ModelView(
        name="test/fake",
        names=state.served_names,
        dimensions=dims,
        max_length=max_length,
        head_labels=head_labels,
        encode=word_ids,
        truncate=truncate,
        vocab_size=vocab_size,
    )
    if ready:
        state.set_status("ready", None)
    else:
        state.set_status("loading", "loading test/fake")
    server = build_server(state)
    client = LocalClient(*await server.listen_tcp("127.0.0.1", 0))
    return Served(client, state, runner, engine, server)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    s = await serve()
    yield s
    await stop(s)


async def stop(s: Served) -> None:
    if s.runner.gate is not None:
        s.runner.gate.set()
    await asyncio.get_running_loop().run_in_executor(None, s.engine.stop, 1.0)
    await s.client.close()
    await s.server.close(1.0)


def timing_parts(header: str) -> dict[str, float]:
    parts = {}
    for item in header.split(","):
        name, _, dur = item.strip().partition(";dur=")
        parts[name] = float(dur)
    return parts


# -- health and models ---------------------------------------------------------------------


async def test_health_is_503_until_ready_then_200() -> None:
    s = await serve(ready=False)
    try:
        resp = await s.client.get("/health")
        body = await resp.json()
        assert resp.status == 503
        assert body["status"] == "loading"
        assert set(body) >= {"status", "reason", "api_version", "model", "limits", "threads"}
        assert body["limits"] == {"max_num_seqs": 64, "max_num_batched_tokens": 4096}
        resp = await s.client.post("/v1/embeddings", json={"input": "hi"})
        assert resp.status == 503
        assert (await resp.json())["error"]["code"] == "not_ready"
        s.state.set_status("ready", None)
        resp = await s.client.get("/health")
        assert resp.status == 200
        assert (await resp.json())["status"] == "ready"
    finally:
        await stop(s)


async def test_models_card_reports_limits_threads_and_adaptive_threads(served: Served) -> None:
    resp = await served.client.get("/v1/models")
    card = (await resp.json())["data"][0]
    assert card["id"] == "test/fake"
    assert card["limits"]["max_num_seqs"] == 64
    assert card["threads"] == 1
    assert card["adaptive_threads"] == {"mode": "recording", "threads": 1}


async def test_health_answers_while_a_forward_is_held(served: Served) -> None:
    served.runner.gate = threading.Event()
    pending = asyncio.ensure_future(served.client.post("/v1/embeddings", json={"input": "a b"}))
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(None, served.runner.entered.wait, 5)
    resp = await served.client.get("/health")
    assert resp.status == 200
    live = await served.client.get("/health/live")
    assert live.status == 200
    assert not pending.done()
    served.runner.gate.set()
    assert (await pending).status == 200


# -- embeddings ----------------------------------------------------------------------------


async def test_embeddings_answer_each_input_in_order(served: Served) -> None:
    texts = ["one", "two words", "now three words", "x"]
    resp = await served.client.post("/v1/embeddings", json={"input": texts, "model": "fake"})
    assert resp.status == 200
    body = await resp.json()
    rows = word_ids(texts)
    assert [d["index"] for d in body["data"]] == [0, 1, 2, 3]
    assert [d["embedding"] for d in body["data"]] == [expected_output(r) for r in rows]
    assert body["usage"]["prompt_tokens"] == sum(map(len, rows))
    assert body["model"] == "test/fake"
    parts = timing_parts(resp.headers["Server-Timing"])
    assert set(TIMING_PARTS) <= set(parts)


async def test_embeddings_base64_is_little_endian_float32(served: Served) -> None:
    resp = await served.client.post(
        "/v1/embeddings", json={"input": "a bb", "encoding_format": "base64"}
    )
    raw = base64.b64decode((await resp.json())["data"][0]["embedding"])
    got = numpy.frombuffer(raw, dtype="<f4").tolist()
    assert got == expected_output(word_ids(["a bb"])[0])


async def test_dimensions_equal_to_the_model_are_accepted_others_refused(served: Served) -> None:
    ok = await served.client.post("/v1/embeddings", json={"input": "a", "dimensions": DIMS})
    assert ok.status == 200
    bad = await served.client.post("/v1/embeddings", json={"input": "a", "dimensions": 2})
    assert bad.status == 400
    assert "dimensions" in (await bad.json())["error"]["message"]


async def test_too_long_input_is_its_own_error_unless_truncation_is_asked(served: Served) -> None:
    long_text = " ".join(["w"] * 40)  # 42 ids > max_length 16
    resp = await served.client.post("/v1/embeddings", json={"input": ["ok", long_text]})
    err = (await resp.json())["error"]
    assert resp.status == 400
    assert err["code"] == "max_length_exceeded"
    assert "input[1]" in err["message"] and "16" in err["message"]
    resp = await served.client.post(
        "/v1/embeddings", json={"input": ["ok", long_text], "truncate": True}
    )
    assert resp.status == 200
    assert (await resp.json())["data"][1]["embedding"][0] == 16.0


# -- bad input: each a clear 4xx, and the worker goes on serving ---------------------------

BAD_BODIES = [
    (b"{not json", 400, "not valid JSON"),
    (b'{"input": "caf\xe9"}', 400, "not UTF-8"),
    (b"[1, 2]", 400, "expected a JSON object"),
    (b'{"input": 5}', 400, "input: expected a string or a list of strings, got number"),
    (b'{"input": []}', 400, "input: the list is empty"),
    (b'{"input": ["a", 7]}', 400, "input[1]: expected a string, got number"),
    (b'{"inputs": "a"}', 400, "input: required"),
    (b'{"input": "a", "encoding_format": "hex"}', 400, "encoding_format"),
    (b'{"input": "a", "truncate": "yes"}', 400, "truncate"),
    (b'{"input": "a", "model": "other"}', 404, "'other' is not served here"),
    (b'{"input": "a", "model": 3}', 400, "model: expected a string"),
]


@pytest.mark.parametrize(("raw", "status", "words"), BAD_BODIES)
async def test_bad_bodies_are_clear_4xx(
    served: Served, raw: bytes, status: int, words: str
) -> None:
    resp = await served.client.post(
        "/v1/embeddings", data=raw, headers={"Content-Type": "application/json"}
    )
    assert resp.status == status
    body = await resp.json()
    assert words in body["error"]["message"]
    assert "Server-Timing" in resp.headers
    ok = await served.client.post("/v1/embeddings", json={"input": "still serving"})
    assert ok.status == 200


async def test_too_many_rows_is_413(served: Served) -> None:
    resp = await served.client.post("/v1/embeddings", json={"input": ["a"] * 100_000})
    assert resp.status == 413
    assert str(MAX_ROWS_PER_REQUEST) in (await resp.json())["error"]["message"]
    assert served.runner.forwards == []


async def test_body_over_the_cap_is_413() -> None:
    s = await serve(max_body=1000)
    try:
        resp = await s.client.post("/v1/embeddings", json={"input": "x" * 2000})
        assert resp.status == 413
        assert (await resp.json())["error"]["code"] == "request_too_large"
    finally:
        await stop(s)


async def test_a_stalled_body_gets_408_and_others_are_served() -> None:
    s = await serve(read_timeout_s=0.3)
    try:
        reader, writer = await asyncio.open_connection(s.client.host, s.client.port)
        writer.write(
            b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"input": "half'
        )
        await writer.drain()
        ok = await s.client.post("/v1/embeddings", json={"input": "meanwhile"})
        assert ok.status == 200
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 408")
        writer.close()
    finally:
        await stop(s)


async def test_unknown_path_and_method_are_json_errors(served: Served) -> None:
    resp = await served.client.get("/v1/nothing")
    assert resp.status == 404
    assert (await resp.json())["error"]["code"] == "not_found"
    resp = await served.client.get("/v1/embeddings")
    assert resp.status == 405 and resp.headers["Allow"] == "POST"
    error = (await resp.json())["error"]
    assert error["code"] == "method_not_allowed" and "GET /v1/embeddings" in error["message"]
    assert "Server-Timing" in resp.headers


async def test_head_answers_like_get_without_a_body(served: Served) -> None:
    get = await served.client.get("/health")
    head = await served.client.request("HEAD", "/health")
    assert head.status == get.status == 200
    assert head.headers["Content-Length"] == get.headers["Content-Length"]
    assert await head.read() == b""


async def test_overloaded_when_the_queue_is_full() -> None:
    s = await serve(max_queue_rows=4)
    s.runner.gate = threading.Event()
    try:
        first = asyncio.ensure_future(s.client.post("/v1/embeddings", json={"input": "a"}))
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, s.runner.entered.wait, 5)
        queued = asyncio.ensure_future(
            s.client.post("/v1/embeddings", json={"input": ["b", "c", "d"]})
        )
        while s.engine.queue_depth < 3:
            await asyncio.sleep(0.01)
        resp = await s.client.post("/v1/embeddings", json={"input": ["e", "f"]})
        assert resp.status == 429
        assert resp.headers["Retry-After"] == "1"
        assert (await resp.json())["error"]["retryable"] is True
        s.runner.gate.set()
        assert (await first).status == 200
        assert (await queued).status == 200
    finally:
        await stop(s)


# -- classify and bundle -------------------------------------------------------------------

LABELS = {"short": ["a", "b c"], "long": ["one two three four five six"]}


async def test_classify_by_label_examples(served: Served) -> None:
    resp = await served.client.post(
        "/v1/classify", json={"input": ["x", "a b c d e f g"], "labels": LABELS}
    )
    assert resp.status == 200
    data = (await resp.json())["data"]
    assert len(data) == 2
    for item in data:
        assert set(item["probabilities"]) == {"short", "long"}
        assert sum(item["probabilities"].values()) == pytest.approx(1.0)
        assert item["label"] == max(item["probabilities"], key=item["probabilities"].get)
    # The label set's centroids are cached: a second call runs only its input rows.
    before = sum(len(f) for f in served.runner.forwards)
    await served.client.post("/v1/classify", json={"input": "x", "labels": LABELS})
    assert sum(len(f) for f in served.runner.forwards) == before + 1


async def test_classify_needs_labels_without_a_head(served: Served) -> None:
    resp = await served.client.post("/v1/classify", json={"input": "x"})
    assert resp.status == 400
    assert "labels" in (await resp.json())["error"]["message"]
    resp = await served.client.post("/v1/classify", json={"input": "x", "labels": {"a": []}})
    assert resp.status == 400
    assert "labels.a" in (await resp.json())["error"]["message"]


async def test_classify_with_the_models_head() -> None:
    s = await serve(head_labels=["neg", "pos"])
    try:
        resp = await s.client.post("/v1/classify", json={"input": ["a b", "c"]})
        data = (await resp.json())["data"]
        # Fake logits are [sum of ids, 1.0]: the first is larger, so "neg" wins.
        assert [d["label"] for d in data] == ["neg", "neg"]
        assert set(data[0]["probabilities"]) == {"neg", "pos"}
    finally:
        await stop(s)


async def test_bundle_answers_each_task_with_its_own_status_in_one_job(served: Served) -> None:
    body = {
        "tasks": [
            {"id": "e", "embeddings": {"input": ["a", "b c"]}},
            {"id": "bad", "embeddings": {"input": []}},
            {"id": "c", "classify": {"input": "d e f"}},
            {"id": "e2", "embeddings": {"input": "g"}},
        ]
    }
    resp = await served.client.post("/v1/bundle", json=body)
    assert resp.status == 200
    results = (await resp.json())["results"]
    assert [r["id"] for r in results] == ["e", "bad", "c", "e2"]
    assert [r["status"] for r in results] == [200, 400, 400, 200]
    assert results[0]["body"]["data"][1]["embedding"] == expected_output(word_ids(["b c"])[0])
    assert results[3]["body"]["data"][0]["embedding"] == expected_output(word_ids(["g"])[0])
    assert results[1]["body"]["error"]["code"] == "invalid_request"
    # All good rows went into one forward together.
    assert [len(f) for f in served.runner.forwards] == [3]


async def test_bundle_shape_errors(served: Served) -> None:
    for tasks, words in [
        ([], "empty"),
        ("x", "expected a list"),
        ([{"id": 1}], "one of 'embeddings' or 'classify'"),
    ]:
        resp = await served.client.post("/v1/bundle", json={"tasks": tasks})
        assert resp.status == 400
        assert words in (await resp.json())["error"]["message"]


# -- metrics and faults --------------------------------------------------------------------


async def test_metrics_count_requests_rows_and_forwards(served: Served) -> None:
    await served.client.post("/v1/embeddings", json={"input": ["a", "b", "c"]})
    await served.client.post("/v1/embeddings", json={"input": []})
    text = await (await served.client.get("/metrics")).text()
    assert 'vllm_sr_worker_requests_total{status="200",surface="embeddings"} 1.0' in text
    assert 'vllm_sr_worker_requests_total{status="400",surface="embeddings"} 1.0' in text
    assert 'vllm_sr_worker_rows_total{surface="embeddings"} 3.0' in text
    assert "vllm_sr_worker_forward_rows_count 1.0" in text
    assert "vllm_sr_worker_forward_padded_tokens_sum 9.0" in text
    assert "vllm_sr_worker_queue_depth" in text


async def test_fault_endpoint_is_404_when_faults_are_off(served: Served) -> None:
    resp = await served.client.post("/debug/faults", json={"forward_delay_ms": 10})
    assert resp.status == 404


async def test_fault_endpoint_sets_this_workers_forward_delay() -> None:
    s = await serve(faults=Faults(enabled=True))
    try:
        resp = await s.client.post("/debug/faults", json={"forward_delay_ms": 250})
        assert resp.status == 200
        assert s.state.faults.forward_delay_s == pytest.approx(0.25)
        resp = await s.client.post("/v1/embeddings", json={"input": "a"})
        parts = timing_parts(resp.headers["Server-Timing"])
        assert parts["forward"] >= 250.0
        bad = await s.client.post("/debug/faults", json={"forward_delay_ms": -1})
        assert bad.status == 400
    finally:
        await stop(s)


def test_bad_bodies_cover_the_issue_list() -> None:
    # Guard against the table losing a case: the issue names these kinds of bad input.
    words = json.dumps([w for _, _, w in BAD_BODIES])
    for kind in ("JSON", "UTF-8", "empty", "expected a string"):
        assert kind in words


async def test_a_chunked_body_over_the_cap_is_413() -> None:
    s = await serve(max_body=1000)

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"input": "'
        for _ in range(10):
            yield b"x" * 500
        yield b'"}'

    try:
        resp = await s.client.post("/v1/embeddings", data=chunks())
        assert resp.status == 413
        ok = await s.client.post("/v1/embeddings", json={"input": "small"})
        assert ok.status == 200
    finally:
        await stop(s)


async def test_health_reports_revision_and_capabilities() -> None:
    caps = {"surfaces": ["embeddings", "classify"], "dimensions": 4, "max_length": 16}
    s = await serve(revision="sha256:0123456789abcdef", capabilities={**caps, "labels": None})
    try:
        body = await (await s.client.get("/health")).json()
        assert body["revision"] == "sha256:0123456789abcdef"
        assert body["capabilities"] == {**caps, "labels": None}
    finally:
        await stop(s)
