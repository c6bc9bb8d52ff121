"""Upstream's maintained recipes on a real `vllm-sr serve`: each config file as upstream ships it
(tests/fixtures/upstream/recipes), with only its backends pointed at a local stand-in, loads,
starts with the embedded d3-edge worker and routes a chat from its own probes through the
official openai SDK to the decision `/api/v1/eval` names for the same text (balance ships no
probes: any text, in a conversation Router Learning's protection tracks). The agent recipe also
answers through its Responses API (memory store), with its replay store (host `postgres`, not
reachable here) down: chats are served and the records counted lost (test_serve_replay.py).
mom-v1, upstream's built-in default, loads unchanged and serves its multi_factor decisions;
accuracy loads unchanged and answers its workflows and fusion probes through vllm-sr's own
loopers (vllm_sr/router/looper), its static probe directly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml

from tests.integration.test_serve import free_port
from tests.support.backends import StandInBackend
from tests.support.serving import served

pytestmark = pytest.mark.slow
RECIPES = Path(__file__).resolve().parents[1] / "fixtures" / "upstream" / "recipes"


def pointed_at(recipe: str, endpoint: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((RECIPES / recipe / "config.yaml").read_text())
    for model in doc["providers"]["models"]:
        for ref in model.get("backend_refs") or []:
            if "base_url" in ref:  # a hosted API (accuracy's OpenRouter workers)
                ref["base_url"] = f"http://{endpoint}/v1"
            else:
                ref["endpoint"] = endpoint
    return doc


ANY_TEXT = "Summarize the trade-offs of caching in a web service."


def first_probe(recipe: str) -> str:
    path = RECIPES / recipe / "probes.yaml"
    if not path.exists():
        return ANY_TEXT
    probes = yaml.safe_load(path.read_text())
    query: str = probes["decisions"][0]["variants"][0]["query"]
    return query


@pytest.mark.parametrize("recipe", ["agent", "balance", "feedback", "knowledge", "privacy"])
async def test_a_maintained_recipe_loads_unchanged_and_serves(tmp_path: Path, recipe: str) -> None:
    backend = await StandInBackend("llm").start()
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(pointed_at(recipe, backend.endpoint), sort_keys=False))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    listen = ("--listen", f"127.0.0.1:{port}")
    try:
        async with served(config, url, *listen, log=tmp_path / "serve.log"):
            await routes_a_probe(url, recipe, config)
    finally:
        await backend.stop()


async def routes_a_probe(url: str, recipe: str, config: Path) -> None:
    text = first_probe(recipe)
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/api/v1/eval", json={"text": text}) as r,
    ):
        assert r.status == 200, await r.text()
        doc = await r.json()
    assert doc["signal_errors"] == {}, doc["signal_errors"]
    decision = doc["decision_result"]["decision_name"]
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    raw = await client.chat.completions.with_raw_response.create(
        model="vllm-sr/auto",
        messages=[{"role": "user", "content": text}],
        extra_headers={
            "x-authz-user-id": "alice",
            "x-session-id": "s1",
            "x-conversation-id": "c1",
            "x-vsr-debug": "true",
        },
    )
    assert raw.parse().choices[0].message.content == f"llm got: {text}"
    assert raw.headers.get("x-vsr-selected-decision", "") == decision
    assert raw.headers["x-vsr-selected-model"] in {
        m["name"] for m in yaml.safe_load(config.read_text())["providers"]["models"]
    }
    assert "x-vsr-routing-fallback" not in raw.headers
    if recipe == "balance":  # learning on: protection starts the conversation on this model
        assert raw.headers["x-vsr-learning-actions"] == "protection=establish_baseline"
    if recipe == "agent":  # learning on; this probe's decision bypasses it (its adaptations)
        assert raw.headers["x-vsr-learning-actions"] == "adaptation=bypass,protection=bypass"
        await answers_through_responses(client, text)


async def answers_through_responses(client: openai.AsyncOpenAI, text: str) -> None:
    """The agent recipe's response_api block: a response, then one chained on it."""
    first = await client.responses.create(model="vllm-sr/auto", input=text)
    assert first.output_text == f"llm got: {text}"
    second = await client.responses.create(
        model="vllm-sr/auto", input="and then?", previous_response_id=first.id
    )
    assert second.output_text == "llm got: and then?"
    assert second.previous_response_id == first.id


BLEND = "vllm-sr/mom-v1-blend"  # mom-v1's entrypoint whose decisions run multi_factor


async def test_mom_v1_loads_unchanged_and_serves_its_selectors(tmp_path: Path) -> None:
    """Upstream's built-in default, unchanged but for its backends (its looper decisions run as
    loopers in vllm-sr): it loads, and a chat goes where eval's selector dry run says, with the
    same `x-vsr-selected-algorithm` as eval's `selection_method`."""
    backend = await StandInBackend("llm").start()
    doc = pointed_at("mom-v1", backend.endpoint)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    try:
        async with served(config, url, "--listen", f"127.0.0.1:{port}", log=tmp_path / "s.log"):
            async with (
                aiohttp.ClientSession() as s,
                s.post(url + "/api/v1/eval", json={"text": ANY_TEXT, "model": BLEND}) as r,
            ):
                assert r.status == 200, await r.text()
                evaluated = await r.json()
            assert evaluated["signal_errors"] == {}, evaluated["signal_errors"]
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            raw = await client.chat.completions.with_raw_response.create(
                model=BLEND, messages=[{"role": "user", "content": ANY_TEXT}]
            )
            assert raw.parse().choices[0].message.content == f"llm got: {ANY_TEXT}"
            decision = evaluated["decision_result"]["decision_name"]
            assert raw.headers.get("x-vsr-selected-decision", "") == decision
            assert evaluated["decision_result"]["algorithm"] == "multi_factor", decision
            assert evaluated["selection_status"] == "selected"
            assert raw.headers["x-vsr-selected-algorithm"] == evaluated["selection_method"]
            assert raw.headers["x-vsr-selected-model"] == evaluated["selected_model"]
            await client.close()
    finally:
        await backend.stop()


ULTRA = "vllm-sr/mom-v1-ultra"  # multi-objective's entrypoint with its three embedding signals
DEEP = "Explore several reasoning paths and synthesize the strongest rigorous solution."
# Under all three thresholds (0.78, 0.79, 0.78) on d3-edge, at least 0.5 for each: all three
# soft-match, and top_k 1 keeps the best (unified_frontier_deep_intent).
SOFT = (
    "Investigate the repository, explore several reasoning paths, and synthesize the strongest"
    " solution."
)


async def test_multi_objective_serves_with_upstreams_embedding_top_k_and_soft_matching(
    tmp_path: Path,
) -> None:
    """multi-objective with one change, `global.integrations.looper.endpoint: ""` (its four
    looper decisions run as static): its `embedding_config` (`top_k: 1`, soft matching at 0.5)
    and its Responses store without an address load; eval scores every embedding signal, keeps
    at most one matched (of three that soft-match, the best), and a chat goes where eval
    says."""
    backend = await StandInBackend("llm").start()
    doc = pointed_at("multi-objective", backend.endpoint)
    doc["global"]["integrations"]["looper"]["endpoint"] = ""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    try:
        async with served(config, url, "--listen", f"127.0.0.1:{port}", log=tmp_path / "s.log"):
            for text in (DEEP, SOFT, ANY_TEXT):
                async with (
                    aiohttp.ClientSession() as s,
                    s.post(url + "/api/v1/eval", json={"text": text, "model": ULTRA}) as r,
                ):
                    assert r.status == 200, await r.text()
                    evaluated = await r.json()
                assert evaluated["signal_errors"] == {}, evaluated["signal_errors"]
                scored = [k for k in evaluated["signal_values"] if k.startswith("embedding:")]
                assert len(scored) == 3, evaluated["signal_values"]  # every rule is scored
                matched = evaluated["decision_result"]["matched_signals"]
                embedded = [n for family, names in matched.items() if "embedding" in family
                            for n in names]  # fmt: skip
                assert len(embedded) <= 1, matched  # top_k: 1
                raw = await client.chat.completions.with_raw_response.create(
                    model=ULTRA, messages=[{"role": "user", "content": text}]
                )
                assert raw.parse().choices[0].message.content == f"llm got: {text}"
                decision = evaluated["decision_result"]["decision_name"]
                assert raw.headers.get("x-vsr-selected-decision", "") == decision
                hits = [h for h in raw.headers["x-vsr-matched-signals"].split(",") if h]
                assert [h for h in hits if h.startswith("embedding:")] == [
                    f"embedding:{n}" for n in embedded
                ]
                if text == DEEP:  # a candidate of unified_frontier_deep_intent, verbatim
                    assert embedded == ["unified_frontier_deep_intent"], evaluated
                if text == SOFT:
                    scores = [evaluated["signal_values"][k] for k in scored]
                    assert all(0.5 <= v < 0.78 for v in scores), scores  # soft, all three
                    assert embedded == ["unified_frontier_deep_intent"], evaluated
    finally:
        await client.close()


# The looper's final answer, by algorithm: the stand-in echoes the synthesis prompt it got.
FINAL_PROMPTS = {
    "workflows": "llm got: You are the Router Flow final synthesizer.",
    "fusion": "llm got: You are the Fusion calling model.",
}


async def test_accuracy_loads_unchanged_and_answers_through_its_loopers(tmp_path: Path) -> None:
    """accuracy's probes for its workflows, fusion and static decisions: each chat goes to the
    decision eval names; the looper ones answer with the looper's synthesis (upstream's
    prompts, echoed by the stand-in) and upstream's `x-vsr-looper-*` headers."""
    backend = await StandInBackend("llm").start()
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(pointed_at("accuracy", backend.endpoint), sort_keys=False))
    probes = yaml.safe_load((RECIPES / "accuracy" / "probes.yaml").read_text())["decisions"]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    try:
        async with served(config, url, "--listen", f"127.0.0.1:{port}", log=tmp_path / "s.log"):
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            for probe in probes:
                variant = probe["variants"][0]
                text = " ".join([variant["query"]] * variant.get("repeat", 1))
                async with (
                    aiohttp.ClientSession() as s,
                    s.post(url + "/api/v1/eval", json={"text": text}) as r,
                ):
                    evaluated = await r.json()
                decision = evaluated["decision_result"]["decision_name"]
                assert decision == probe["expected_decision"], text[:200]
                kind = probe["expected_algorithm"]
                raw = await client.chat.completions.with_raw_response.create(
                    model="vllm-sr/auto", messages=[{"role": "user", "content": text}]
                )
                parsed = raw.parse()
                answer = parsed.choices[0].message.content or ""
                assert raw.headers["x-vsr-selected-decision"] == decision
                if kind == "static":
                    assert answer == f"llm got: {text}"
                    assert "x-vsr-looper-algorithm" not in raw.headers
                    continue
                # upstream's eval: fusion's configured judge (qwen-coordinator) is the planned
                # final model; accuracy's workflows names no final model
                if kind == "fusion":
                    assert evaluated["selection_status"] == "planned_final"
                    assert evaluated["selected_model"] == "qwen-coordinator"
                else:
                    assert evaluated["selection_status"] == "execution_required"
                assert raw.headers["x-vsr-looper-algorithm"] == kind
                assert answer.startswith(FINAL_PROMPTS[kind]), answer[:200]
                assert text in answer
                assert int(raw.headers["x-vsr-looper-iterations"]) >= 3
                iterations = int(raw.headers["x-vsr-looper-iterations"])
                # the usage is summed over the calls that answered (2 tokens each from the
                # stand-in); a panel or step call still running when its round's quorum
                # (min_successful_responses: 2) is reached is cancelled and adds none
                assert parsed.usage is not None
                total = parsed.usage.total_tokens
                assert total % 2 == 0 and 2 * 3 <= total <= 2 * iterations, (total, iterations)
            await client.close()
    finally:
        await backend.stop()


async def test_multi_objective_loads_unchanged_and_routes_each_algorithm_as_eval_says(
    tmp_path: Path,
) -> None:
    """multi-objective unchanged but for its backends (its looper decisions run as loopers, its
    embedding top_k, soft matching and address-less Responses store acted on): for the first
    probe of each algorithm it declares (static, the selectors, the five loopers), a chat through
    the SDK goes to the decision eval names on the same entrypoint, and a looper decision answers
    through its looper (`x-vsr-looper-algorithm`)."""
    backend = await StandInBackend("llm").start()
    config = tmp_path / "config.yaml"
    doc = pointed_at("multi-objective", backend.endpoint)
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    probes = yaml.safe_load((RECIPES / "multi-objective" / "probes.yaml").read_text())
    firsts: dict[str, dict[str, Any]] = {}
    for probe in probes["decisions"]:
        if "query" in probe["variants"][0]:  # a text probe (others send messages or tools)
            firsts.setdefault(probe["expected_algorithm"], probe)
    loopers = {"confidence", "ratings", "remom", "fusion", "workflows"}
    assert {"static", "multi_factor", "confidence", "remom", "fusion", "workflows"} <= set(firsts)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    try:
        async with served(config, url, "--listen", f"127.0.0.1:{port}", log=tmp_path / "s.log"):
            for kind, probe in sorted(firsts.items()):
                text = probe["variants"][0]["query"]
                model = probe["variants"][0].get("model") or probe["model"]
                async with (
                    aiohttp.ClientSession() as s,
                    s.post(url + "/api/v1/eval", json={"text": text, "model": model}) as r,
                ):
                    assert r.status == 200, await r.text()
                    evaluated = await r.json()
                decision = evaluated["decision_result"]["decision_name"]
                raw = await client.chat.completions.with_raw_response.create(
                    model=model, messages=[{"role": "user", "content": text}]
                )
                assert raw.headers.get("x-vsr-selected-decision", "") == decision, kind
                algorithm = evaluated["decision_result"]["algorithm"]
                if decision and algorithm in loopers:
                    assert raw.headers["x-vsr-looper-algorithm"] == algorithm, kind
                else:
                    assert "x-vsr-looper-algorithm" not in raw.headers, kind
                    assert raw.parse().choices[0].message.content == f"llm got: {text}"
    finally:
        await client.close()
        await backend.stop()
