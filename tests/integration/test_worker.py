"""Real worker processes over real Unix sockets: d3-edge and a tiny random BERT."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy
import pytest

from tests.support.models import CLASSIFIER_LABELS, TINY_MAX_POSITIONS, reference_embeddings
from tests.support.workers import (
    WorkerHandle,
    free_tcp_port,
    short_socket_dir,
    spawn_worker,
    start_worker,
    stop_worker,
    wait_health,
    worker_argv,
    worker_env,
)
from vllm_sr.worker.forming import (
    CPU_FORWARD_TOKENS_PER_THREAD,
    CPU_FORWARD_TOKENS_PER_THREAD_HALF,
)
from vllm_sr.worker.startup import forward_tokens

pytestmark = pytest.mark.slow

FAULTS = {"VLLM_SR_ENABLE_FAULTS": "1", "VLLM_SR_WORKER_READ_TIMEOUT_S": "1"}
TEXTS = [
    "hello",
    "The quick brown fox jumps over the lazy dog.",
    "How do I get a refund for an order that arrived broken?",
    "Semantic routers send each question to the model that suits it best, " * 4,
]


@pytest.fixture(scope="module")
def d3() -> Iterator[WorkerHandle]:
    handle = start_worker("vllm-sr/d3-edge", short_socket_dir() / "d3.sock", env=FAULTS)
    yield handle
    stop_worker(handle)


@pytest.fixture(scope="module")
def tiny(tiny_bert_dir: Path) -> Iterator[WorkerHandle]:
    handle = start_worker(str(tiny_bert_dir), short_socket_dir() / "tiny.sock", env=FAULTS)
    yield handle
    stop_worker(handle)


def cosines(a: numpy.ndarray, b: numpy.ndarray) -> numpy.ndarray:
    return (a * b).sum(axis=1) / (numpy.linalg.norm(a, axis=1) * numpy.linalg.norm(b, axis=1))


def embed(handle: WorkerHandle, texts: list[str]) -> numpy.ndarray:
    resp = handle.post("/v1/embeddings", {"input": texts})
    assert resp.status == 200, resp.body
    return numpy.array([d["embedding"] for d in resp.json()["data"]], dtype=numpy.float32)


def served_tolerance(handle: WorkerHandle) -> float:
    """The golden cosine bound of the dtype the worker resolved (auto: bfloat16 on a CPU with
    native bf16), against float32 answers."""
    from vllm_sr.worker.goldens import TOLERANCES

    return TOLERANCES[handle.get("/health").json()["capabilities"]["dtype"]].cosine_min


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


# -- answers equal an in-process forward ---------------------------------------------------


def test_d3_edge_embeddings_equal_an_in_process_forward(
    d3: WorkerHandle, d3_edge_model_dir: Path
) -> None:
    got = embed(d3, TEXTS)
    want = reference_embeddings(d3_edge_model_dir, TEXTS)
    assert got.shape == (len(TEXTS), 384)
    assert cosines(got, want).min() >= served_tolerance(d3)


def test_tiny_bert_embeddings_equal_an_in_process_forward(
    tiny: WorkerHandle, tiny_bert_dir: Path
) -> None:
    got = embed(tiny, TEXTS)
    want = reference_embeddings(tiny_bert_dir, TEXTS)
    assert got.shape == (len(TEXTS), 32)
    assert cosines(got, want).min() >= served_tolerance(tiny)


def test_d3_edge_model_card_and_health(d3: WorkerHandle) -> None:
    health = d3.get("/health")
    assert health.status == 200
    body = health.json()
    assert body["status"] == "ready"
    assert body["limits"]["max_num_seqs"] >= 1
    assert body["threads"] >= 1
    card = d3.get("/v1/models").json()["data"][0]
    # CPU forwards are formed to the CPU target per thread at the served dtype (512 at
    # float32, 1024 below it), within the limits.
    target = forward_tokens("cpu", body["threads"], card["dtype"])
    assert target == body["threads"] * (
        CPU_FORWARD_TOKENS_PER_THREAD
        if card["dtype"] == "float32"
        else CPU_FORWARD_TOKENS_PER_THREAD_HALF
    )
    assert body["forward_tokens"] == min(target, body["limits"]["max_num_batched_tokens"])
    assert card["artifact"] == "vllm-sr/d3-edge"
    assert card["dimensions"] == 384
    assert len(card["sha256"]) == 64
    assert card["limits"] == body["limits"]
    assert "adaptive_threads" in card


def test_health_reports_revision_and_capabilities(
    d3: WorkerHandle, d3_edge_model_dir: Path
) -> None:
    from vllm_sr.worker import precision
    from vllm_sr.worker.artifacts import content_hashes, revision_of

    body = d3.get("/health").json()
    assert body["revision"] == revision_of(content_hashes(d3_edge_model_dir)[0])
    assert body["capabilities"] == {
        "surfaces": ["embeddings", "classify"],
        "dimensions": 384,
        "max_length": 512,
        "labels": None,  # classifies against the labels a caller gives
        "dtype": precision.resolve("auto", precision.facts_for("cpu")).dtype,
    }
    card = d3.get("/v1/models").json()["data"][0]
    assert card["revision"] == body["revision"] and card["revision_requested"] is None


def test_a_revision_asked_for_a_local_directory_is_reported_not_fetched(
    tiny_bert_dir: Path, tiny_classifier_dir: Path
) -> None:
    from vllm_sr.worker import artifacts
    from vllm_sr.worker.startup import capabilities

    loaded = artifacts.load(artifacts.resolve(str(tiny_bert_dir)), "cpu", "v1.0")
    whole, _ = artifacts.content_hashes(tiny_bert_dir)
    assert loaded.revision == artifacts.revision_of(whole)
    assert loaded.revision_note is not None and "'v1.0'" in loaded.revision_note
    same = artifacts.load(artifacts.resolve(str(tiny_bert_dir)), "cpu", loaded.revision)
    assert same.revision_note is None
    head = artifacts.load(artifacts.resolve(str(tiny_classifier_dir)), "cpu")
    caps = capabilities(head, 100)
    assert caps == {
        "surfaces": ["embeddings", "classify"],
        "dimensions": 32,
        "max_length": 100,
        "labels": list(CLASSIFIER_LABELS),
        "dtype": "float32",  # load's default: a worker passes the dtype it resolved
    }


def test_token_id_input_equals_the_text_it_encodes(
    d3: WorkerHandle, d3_edge_model_dir: Path
) -> None:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(d3_edge_model_dir)(TEXTS[:2])["input_ids"]
    by_text = embed(d3, TEXTS[:2])
    resp = d3.post("/v1/embeddings", {"input": ids})
    assert resp.status == 200, resp.body
    by_ids = numpy.array([d["embedding"] for d in resp.json()["data"]], dtype=numpy.float32)
    numpy.testing.assert_allclose(by_ids, by_text, atol=1e-5)
    one = d3.post("/v1/embeddings", {"input": ids[1]}).json()["data"]
    # Alone against alone: below float32 padding moves an answer by more than 1e-5.
    numpy.testing.assert_allclose(one[0]["embedding"], embed(d3, TEXTS[1:2])[0], atol=1e-5)
    bad = d3.post("/v1/embeddings", {"input": [101, 30522]})
    assert bad.status == 400 and "0 to 30521" in bad.json()["error"]["message"]


def test_d3_edge_classifies_by_label_examples(d3: WorkerHandle) -> None:
    labels = {
        "billing": ["I was charged twice", "refund my payment", "update my credit card"],
        "weather": ["will it rain tomorrow", "forecast for the weekend", "how hot is it"],
    }
    resp = d3.post(
        "/v1/classify",
        {"input": ["my card got billed two times", "is it sunny on Saturday"], "labels": labels},
    )
    assert resp.status == 200
    data = resp.json()["data"]
    assert [d["label"] for d in data] == ["billing", "weather"]
    assert all(abs(sum(d["probabilities"].values()) - 1) < 1e-6 for d in data)


def test_classifier_directory_serves_its_head_over_tcp(tiny_classifier_dir: Path) -> None:
    with_handle = start_worker(
        str(tiny_classifier_dir), short_socket_dir() / "clf.sock", port=free_tcp_port()
    )
    try:
        card = with_handle.get("/v1/models").json()["data"][0]
        assert card["labels"] == list(CLASSIFIER_LABELS)
        resp = with_handle.post("/v1/classify", {"input": ["good", "bad"]})
        assert resp.status == 200
        for item in resp.json()["data"]:
            assert item["label"] in CLASSIFIER_LABELS
            assert set(item["probabilities"]) == set(CLASSIFIER_LABELS)
    finally:
        assert stop_worker(with_handle) == 0


# -- batching, timing and health while busy ------------------------------------------------


def test_concurrent_requests_share_forwards(d3: WorkerHandle) -> None:
    before = d3.get("/metrics").body.decode()
    # Hold each forward a little so that requests arriving meanwhile queue up together.
    assert d3.post("/debug/faults", {"forward_delay_ms": 300}).status == 200
    try:
        n = 16
        with ThreadPoolExecutor(n) as pool:
            statuses = list(
                pool.map(
                    lambda i: d3.post("/v1/embeddings", {"input": f"row {i}"}).status, range(n)
                )
            )
    finally:
        d3.post("/debug/faults", {"forward_delay_ms": 0})
    assert statuses == [200] * n
    after = d3.get("/metrics").body.decode()
    forwards = metric(after, "vllm_sr_worker_forward_rows_count") - metric(
        before, "vllm_sr_worker_forward_rows_count"
    )
    rows = metric(after, "vllm_sr_worker_forward_rows_sum") - metric(
        before, "vllm_sr_worker_forward_rows_sum"
    )
    assert rows == n
    assert forwards <= n / 2  # rows shared forwards


def test_server_timing_on_every_response(tiny: WorkerHandle) -> None:
    ok = tiny.post("/v1/embeddings", {"input": "timing"})
    names = [p.split(";")[0].strip() for p in ok.headers["server-timing"].split(",")]
    assert names == ["parse", "tokenize", "queue", "forward", "post", "total"]
    for resp in (tiny.get("/health"), tiny.post("/v1/embeddings", {"input": []})):
        assert "total;dur=" in resp.headers["server-timing"]


def test_health_answers_while_a_forward_hangs(tiny: WorkerHandle) -> None:
    assert tiny.post("/debug/faults", {"forward_delay_ms": 3000}).status == 200
    try:
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(tiny.post, "/v1/embeddings", {"input": "held"})
            deadline = time.monotonic() + 20
            while not tiny.get("/health").json()["forward_running"]:
                assert time.monotonic() < deadline and not slow.done()
            health = tiny.get("/health", timeout=2)
            assert health.status == 200
            assert tiny.get("/health/live", timeout=2).status == 200
            assert not slow.done()
            assert slow.result(timeout=30).status == 200
    finally:
        tiny.post("/debug/faults", {"forward_delay_ms": 0})


def test_a_queued_request_past_its_deadline_answers_504_and_is_counted(
    tiny: WorkerHandle,
) -> None:
    dropped = "vllm_sr_worker_deadline_dropped_rows_total"
    before = metric(tiny.get("/metrics").body.decode(), dropped)
    assert tiny.post("/debug/faults", {"forward_delay_ms": 1500}).status == 200
    try:
        with ThreadPoolExecutor(2) as pool:
            held = pool.submit(tiny.post, "/v1/embeddings", {"input": "held"})
            deadline = time.monotonic() + 20
            while not tiny.get("/health").json()["forward_running"]:
                assert time.monotonic() < deadline and not held.done()
            running_s = tiny.get("/health").json()["forward_running_s"]
            assert isinstance(running_s, float) and 0.0 <= running_s < 20
            late = pool.submit(
                tiny.post,
                "/v1/embeddings",
                {"input": ["late one", "late two"]},
                headers={"X-Request-Timeout-Ms": "300"},
            )
            resp = late.result(timeout=30)
            assert resp.status == 504, resp.body
            assert resp.json()["error"]["code"] == "deadline_exceeded"
            assert held.result(timeout=30).status == 200  # the running forward finished
    finally:
        tiny.post("/debug/faults", {"forward_delay_ms": 0})
    assert metric(tiny.get("/metrics").body.decode(), dropped) == before + 2
    bad = tiny.post("/v1/embeddings", {"input": "x"}, headers={"X-Request-Timeout-Ms": "-1"})
    assert bad.status == 400 and "X-Request-Timeout-Ms" in bad.json()["error"]["message"]
    assert tiny.get("/health").json()["forward_running_s"] == 0.0


# -- bad input: a clear 4xx each, and the worker keeps serving -----------------------------


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"{oops", 400),
        (b'{"input": {"a": 1}}', 400),
        (b'{"input": []}', 400),
        (b'{"input": "\xff\xfe"}', 400),
        (json.dumps({"input": ["x"] * 100_000}).encode(), 413),
    ],
    ids=["malformed", "wrong-type", "empty-list", "non-utf8", "100k-rows"],
)
def test_bad_input_is_4xx_and_the_worker_keeps_serving(
    tiny: WorkerHandle, raw: bytes, status: int
) -> None:
    resp = tiny.request("POST", "/v1/embeddings", raw=raw)
    assert resp.status == status
    assert resp.json()["error"]["message"]
    assert tiny.post("/v1/embeddings", {"input": "still here"}).status == 200


def test_too_long_input_and_truncation(tiny: WorkerHandle) -> None:
    text = "word " * (TINY_MAX_POSITIONS + 10)
    resp = tiny.post("/v1/embeddings", {"input": text})
    assert resp.status == 400
    assert resp.json()["error"]["code"] == "max_length_exceeded"
    assert tiny.post("/v1/embeddings", {"input": text, "truncate": True}).status == 200


def raw_exchange(uds: Path, payload: bytes, timeout: float = 15.0) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(uds))
        # The worker may answer and close before reading everything.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(payload)
        return sock.recv(65536)


def test_body_over_the_cap_is_413(tiny: WorkerHandle) -> None:
    size = 9 * 1024 * 1024
    head = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(size).encode() + b"\r\n\r\n"
    )
    answer = raw_exchange(tiny.uds, head + b'{"input": "' + b"x" * 1000)
    assert answer.startswith(b"HTTP/1.1 413")
    assert tiny.post("/v1/embeddings", {"input": "still here"}).status == 200


def test_half_a_request_then_a_stall_gets_408(tiny: WorkerHandle) -> None:
    head = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\n"
        b'Content-Length: 200\r\n\r\n{"input": "half'
    )
    with ThreadPoolExecutor(1) as pool:
        stalled = pool.submit(raw_exchange, tiny.uds, head)
        assert tiny.post("/v1/embeddings", {"input": "meanwhile"}).status == 200
        assert stalled.result(timeout=30).startswith(b"HTTP/1.1 408")
    # Half the headers, then silence: other connections are still served.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(tiny.uds))
        sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: w\r\nContent-")
        assert tiny.post("/v1/embeddings", {"input": "still here"}).status == 200


# -- lifecycle: readiness, exit codes, signals, parent death -------------------------------


def test_health_is_503_before_ready_then_200_and_sigterm_exits_0(tiny_bert_dir: Path) -> None:
    handle = spawn_worker(str(tiny_bert_dir), short_socket_dir() / "life.sock")
    try:
        early = wait_health(handle, want=503, timeout=60)
        assert early.json()["status"] in ("starting", "loading", "warming")
        ready = wait_health(handle, want=200, timeout=120)
        assert ready.json()["status"] == "ready"
    finally:
        code = stop_worker(handle)
    assert code == 0
    assert not handle.uds.exists()


def test_sigterm_is_prompt_even_with_a_forward_held_by_a_fault(tiny_bert_dir: Path) -> None:
    env = {"VLLM_SR_ENABLE_FAULTS": "1", "VLLM_SR_FAULT_FORWARD_DELAY_MS": "600000"}
    handle = spawn_worker(str(tiny_bert_dir), short_socket_dir() / "held.sock", env=env)
    try:
        # The golden check itself waits on the delay: the worker stays "warming".
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if handle.get("/health", timeout=2).json()["status"] == "warming":
                    break
            except OSError:
                pass
        else:
            pytest.fail("the worker never reached warming")
        started = time.monotonic()
        code = stop_worker(handle, timeout=20)
        assert code == 0
        assert time.monotonic() - started < 10
    finally:
        stop_worker(handle)


def test_sigterm_lets_a_running_forward_finish(tiny_bert_dir: Path) -> None:
    env = {"VLLM_SR_ENABLE_FAULTS": "1"}
    handle = start_worker(str(tiny_bert_dir), short_socket_dir() / "drain.sock", env=env)
    try:
        assert handle.post("/debug/faults", {"forward_delay_ms": 1000}).status == 200
        with ThreadPoolExecutor(1) as pool:
            inflight = pool.submit(handle.post, "/v1/embeddings", {"input": "finish me"})
            deadline = time.monotonic() + 20
            while not handle.get("/health").json()["forward_running"]:
                assert time.monotonic() < deadline
            handle.proc.send_signal(signal.SIGTERM)
            assert inflight.result(timeout=30).status == 200
        assert handle.proc.wait(20) == 0
    finally:
        stop_worker(handle)


def test_bad_artifact_exits_78_naming_it() -> None:
    uds = short_socket_dir() / "bad.sock"
    proc = subprocess.run(
        worker_argv("vllm-sr/no-such-model", uds),
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 78
    assert "vllm-sr/no-such-model" in proc.stderr
    assert "vllm-sr/d3-edge" in proc.stderr
    assert not uds.exists()


def test_bad_adaptive_threads_value_exits_78(tiny_bert_dir: Path) -> None:
    proc = subprocess.run(
        worker_argv(str(tiny_bert_dir), short_socket_dir() / "t.sock"),
        env=worker_env({"VLLM_SRUN_CPU_ADAPTIVE_THREADS": "fast"}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 78
    assert "VLLM_SRUN_CPU_ADAPTIVE_THREADS" in proc.stderr


def test_worker_exits_when_its_parent_dies(tiny_bert_dir: Path) -> None:
    uds = short_socket_dir() / "orphan.sock"
    parent_code = textwrap.dedent(
        f"""
        import subprocess, sys, time
        p = subprocess.Popen({worker_argv(str(tiny_bert_dir), uds)!r})
        print(p.pid, flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code], stdout=subprocess.PIPE, env=worker_env(), text=True
    )
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    try:
        deadline = time.monotonic() + 120
        while not uds.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _alive(child_pid):
            time.sleep(0.05)
        assert not _alive(child_pid), "the worker outlived its parent"
    finally:
        if _alive(child_pid):
            os.kill(child_pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
