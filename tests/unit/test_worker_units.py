"""Small worker pieces: classification maths and the centroid cache, JSON output with and
without orjson, truncation that keeps the closing special token, the thread default."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy
import pytest

from vllm_sr.errors import InvalidRequest
from vllm_sr.worker import classify, jsonio
from vllm_sr.worker.main import expected_parent, watch_parent
from vllm_sr.worker.options import default_threads, faults_from_env
from vllm_sr.worker.runner import TokenizerAdapter


def test_centroid_classification_uses_the_documented_temperature() -> None:
    emb = numpy.array([[1.0, 0.0]], dtype=numpy.float32)
    cos_b = 0.9
    centroids = numpy.array([[1.0, 0.0], [cos_b, (1 - cos_b**2) ** 0.5]], dtype=numpy.float32)
    (result,) = classify.by_centroids(emb, centroids, ["a", "b"])
    odds = result["probabilities"]["a"] / result["probabilities"]["b"]
    assert odds == pytest.approx(numpy.exp((1.0 - cos_b) / classify.TEMPERATURE), rel=1e-4)
    assert result["label"] == "a"


def test_centroids_are_normalised_means_in_label_order() -> None:
    key = classify.parse_labels({"x": ["p", "q"], "y": ["r"]})
    emb = numpy.array([[2.0, 0.0], [0.0, 2.0], [0.0, -3.0]], dtype=numpy.float32)
    got = classify.centroids_from(emb, key)
    numpy.testing.assert_allclose(got, [[2**-0.5, 2**-0.5], [0.0, -1.0]], rtol=1e-6)


@pytest.mark.parametrize(
    ("labels", "words"),
    [
        ({}, "non-empty object"),
        ([], "non-empty object"),
        ({"a": []}, "labels.a"),
        ({"a": [1]}, "labels.a"),
        ({str(i): ["x"] for i in range(classify.MAX_LABELS + 1)}, "at most"),
    ],
)
def test_bad_label_sets_are_refused(labels: object, words: str) -> None:
    with pytest.raises(InvalidRequest, match=words):
        classify.parse_labels(labels)


def test_a_single_example_string_is_accepted() -> None:
    assert classify.parse_labels({"a": "one"}) == (("a", ("one",)),)


async def test_concurrent_misses_on_one_label_set_compute_once() -> None:
    cache = classify.CentroidCache(size=2)
    calls = 0
    release = asyncio.Event()

    async def compute(key: classify.LabelKey) -> numpy.ndarray:
        nonlocal calls
        calls += 1
        await release.wait()
        return numpy.ones((len(key), 2))

    key = classify.parse_labels({"a": ["x"]})
    waiters = [asyncio.ensure_future(cache.get(key, compute)) for _ in range(5)]
    await asyncio.sleep(0)  # one loop turn: every waiter reaches its first await (deterministic)
    assert calls == 1
    release.set()
    results = await asyncio.gather(*waiters)
    assert calls == 1
    assert all(r is results[0] for r in results)
    await cache.get(key, compute)
    assert (cache.hits, cache.misses) == (1, 1)


async def test_cache_evicts_the_least_recently_used_label_set() -> None:
    cache = classify.CentroidCache(size=2)

    async def compute(key: classify.LabelKey) -> numpy.ndarray:
        return numpy.zeros((1, 1))

    keys = [classify.parse_labels({n: ["x"]}) for n in "abc"]
    for k in keys:
        await cache.get(k, compute)
    await cache.get(keys[0], compute)
    assert cache.misses == 4  # "a" was evicted by "c"


def test_json_output_is_the_same_with_and_without_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    body = {"v": numpy.array([0.5, -1.25, 3.0], dtype=numpy.float32), "n": numpy.float32(2.5)}
    fast = json.loads(jsonio.dumps(body))
    monkeypatch.setattr(jsonio, "orjson", None)
    slow = json.loads(jsonio.dumps(body))
    assert fast == slow == {"v": [0.5, -1.25, 3.0], "n": 2.5}
    with pytest.raises(ValueError):
        jsonio.loads("{nope")


class _FakeHF:
    all_special_ids = (101, 102)


def test_truncation_keeps_the_closing_special_token() -> None:
    tok = TokenizerAdapter(_FakeHF())
    assert tok.truncate([101, 5, 6, 7, 8, 102], 4) == [101, 5, 6, 102]
    assert tok.truncate([5, 6, 7, 8], 2) == [5, 6]
    assert tok.truncate([101, 5, 102], 8) == [101, 5, 102]


def test_the_adapter_gives_the_ids_the_hf_tokenizer_gives(d3_edge_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(d3_edge_model_dir, local_files_only=True)
    texts = [
        "my card was charged twice",
        "Café déjà vu: naïve façade, 東京 and 🙂 emoji",
        "  spaces\tand\nnewlines  ",
        " ".join(["a long text of many words to cut into word pieces"] * 60),
    ]
    want = hf(texts, add_special_tokens=True, truncation=False, padding=False)["input_ids"]
    assert TokenizerAdapter(hf).encode(texts) == [list(ids) for ids in want]
    assert len(want[3]) > hf.model_max_length  # not cut: the API decides on truncation


@pytest.mark.parametrize(("budget", "threads"), [(1, 1), (2, 1), (3, 1), (8, 4), (64, 16)])
def test_default_threads_is_half_the_budget_between_1_and_16(budget: int, threads: int) -> None:
    assert default_threads(budget) == threads


def test_faults_only_when_enabled() -> None:
    assert faults_from_env({"VLLM_SR_FAULT_FORWARD_DELAY_MS": "500"}).forward_delay_s == 0.0
    on = faults_from_env({"VLLM_SR_ENABLE_FAULTS": "1", "VLLM_SR_FAULT_FORWARD_DELAY_MS": "500"})
    assert on.enabled and on.forward_delay_s == 0.5


def test_expected_parent_reads_the_supervisors_pid() -> None:
    assert expected_parent({"VLLM_SR_PARENT_PID": "4242"}) == 4242
    assert expected_parent({"VLLM_SR_PARENT_PID": "1"}) is None
    assert expected_parent({"VLLM_SR_PARENT_PID": "x"}) is None
    assert expected_parent({}) is None


async def test_watch_parent_stops_when_the_named_supervisor_is_gone() -> None:
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid names no process now
    stop = asyncio.Event()
    await asyncio.wait_for(watch_parent(stop, gone.pid), 5)
    assert stop.is_set()


@pytest.mark.parametrize(
    "argv",
    [
        ["worker", "vllm-sr/d3-edge"],
        ["worker", "vllm-sr/d3-edge", "--uds", "/tmp/a.sock", "--port", "8000"],
        ["worker", "vllm-sr/d3-edge", "--uds", "/tmp/a.sock", "--device", "gpu0"],
        ["worker", "vllm-sr/d3-edge", "--uds", "/tmp/a.sock", "--threads", "0"],
        ["worker", "vllm-sr/d3-edge", "--port", "70000"],
        ["worker", "vllm-sr/d3-edge", "--uds", "/tmp/a.sock", "--dtype", "int8"],
    ],
)
def test_worker_command_line_refusals_exit_2(argv: list[str]) -> None:
    from vllm_sr.cli import build_parser

    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2


def test_worker_command_line_accepts_the_documented_flags() -> None:
    from vllm_sr.cli import build_parser

    argv = "worker vllm-sr/d3-edge --uds /tmp/a.sock --device rocm:1 --threads 2"
    argv += " --max-num-seqs 8 --max-num-batched-tokens 1024"
    argv += " --replica-id primary-1 --served-model-name primary --dtype bfloat16"
    args = build_parser().parse_args(argv.split())
    assert (args.device, args.threads, args.max_num_seqs) == ("rocm:1", 2, 8)
    assert args.dtype == "bfloat16"
    assert build_parser().parse_args(argv.split()[:4]).dtype == "auto"  # the default
    assert (args.max_num_batched_tokens, args.replica_id) == (1024, "primary-1")
    assert args.served_model_name == ["primary"]
