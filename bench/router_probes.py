"""Upstream's recipe probes (``probes.yaml``) through vllm-sr's ``/api/v1/eval``, with the
model-backed signals answered by the real d3-edge model (the worker's own loading and pooling
code, in this process): how many probes route to the decision upstream expects.

Each recipe's ``config.yaml`` (tests/fixtures/upstream/recipes) is loaded as vllm-sr loads it,
after removing what vllm-sr refuses but that does not take part in choosing a decision
(plugins, adaptations, global services, the looper endpoint), so the decision rules and
signals are upstream's own. A probe passes when the eval's routing_decision (else
decision_result.decision_name) is its ``expected_decision``; ``signal_errors`` must be empty.
Variants with ``generated_text`` or image fixtures are not run (counted as skipped).

    python bench/router_probes.py [--recipe feedback ...] [--verbose] [--stand-in]

``--stand-in`` answers the bundles with tests/support's toy encoder instead of d3-edge (no model
load: the smoke test's mode; its pass counts say nothing about routing quality).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

RECIPES = REPO / "tests" / "fixtures" / "upstream" / "recipes"
WITH_PROBES = ("accuracy", "agent", "feedback", "knowledge", "privacy")
Exchange = Callable[[str, str, bytes, float | None], Awaitable[tuple[int, bytes]]]


def loadable(doc: dict[str, Any]) -> dict[str, Any]:
    """The recipe without what vllm-sr refuses and routing does not read."""
    doc = json.loads(json.dumps(doc))
    glob = doc.setdefault("global", {})
    glob.pop("services", None)
    glob.pop("stores", None)
    router = glob.get("router") or {}
    router.pop("learning", None)
    glob.setdefault("integrations", {}).setdefault("looper", {})["endpoint"] = ""
    for dec in doc.get("routing", {}).get("decisions", []):
        dec.pop("plugins", None)
        dec.pop("adaptations", None)
        dec.pop("emits", None)
    return doc


class D3Edge:
    """The d3-edge artifact loaded by the worker's code; embeds lists of texts."""

    def __init__(self) -> None:
        from vllm_sr.worker import artifacts

        self.model = artifacts.load(artifacts.resolve(artifacts.D3_EDGE), "cpu")
        self.cache: dict[str, numpy.ndarray] = {}

    def embed(self, texts: list[str]) -> numpy.ndarray:
        todo = [t for t in dict.fromkeys(texts) if t not in self.cache]
        for start in range(0, len(todo), 32):
            chunk = todo[start : start + 32]
            ids = self.model.tokenizer.encode(chunk)
            rows = [self.model.tokenizer.truncate(r, self.model.max_length) for r in ids]
            out = self.model.runner.forward(rows)[:, : self.model.dimensions]
            for text, vec in zip(chunk, out, strict=True):
                self.cache[text] = vec.astype(numpy.float32)
        return numpy.stack([self.cache[t] for t in texts])

    async def exchange(
        self, deployment: str, path: str, body: bytes, timeout_ms: float | None
    ) -> tuple[int, bytes]:
        results = []
        for task in json.loads(body)["tasks"]:
            vectors = self.embed(task["embeddings"]["input"])
            data = [
                {"index": i, "embedding": base64.b64encode(v.tobytes()).decode()}
                for i, v in enumerate(vectors)
            ]
            results.append({"id": task["id"], "status": 200, "body": {"data": data}})
        return 200, json.dumps({"results": results}).encode()


def variant_payload(variant: dict[str, Any], model: str | None) -> dict[str, Any] | None:
    if "generated_text" in variant or "image_fixture" in variant:
        return None
    payload: dict[str, Any] = {}
    if "messages" in variant:
        payload["messages"] = variant["messages"]
    else:
        text = variant.get("query", "")
        if variant.get("repeat"):
            text = "\n".join([text] * int(variant["repeat"]))
        pad = variant.get("padding")
        if pad:
            filler = " ".join([pad.get("text", "")] * int(pad.get("repeat", 1)))
            place = pad.get("placement", "after")
            if place in ("before", "around"):
                text = filler + "\n" + text
            if place in ("after", "around"):
                text = text + "\n" + filler
        payload["text"] = text
    if variant.get("tools"):
        payload["tools"] = variant["tools"]
    if model:
        payload["model"] = model
    return payload


async def stand_in_exchange(
    deployment: str, path: str, body: bytes, timeout_ms: float | None
) -> tuple[int, bytes]:
    """Bundles answered by the tests' toy encoder (the worker's own bundle code around it)."""
    from tests.support.backends import answer_bundle

    return 200, answer_bundle(body)


async def run_recipe(name: str, exchange: Exchange, verbose: bool) -> Counter[str]:
    from vllm_sr.config.schema import RootConfig
    from vllm_sr.router.backends import BackendSet
    from vllm_sr.router.chat import build_chat_router

    raw = loadable(yaml.safe_load((RECIPES / name / "config.yaml").read_text()))
    config = RootConfig.model_validate(raw)
    assert config.providers is not None and config.routing is not None
    backends = BackendSet(config.providers)
    chat = build_chat_router(
        config.providers,
        config.routing,
        exchange=exchange,
        decision_deployment="primary",
        auto_model_names=["vllm-sr/auto", "auto", "MoM"],
        backends=backends,
        global_=config.global_,
    )
    probes = yaml.safe_load((RECIPES / name / "probes.yaml").read_text())
    tally: Counter[str] = Counter()
    for dec in probes["decisions"]:
        for variant in dec.get("variants", []):
            payload = variant_payload(variant, variant.get("model") or dec.get("model"))
            if payload is None:
                tally["skipped"] += 1
                continue
            doc = await chat.evaluate(
                payload, model="vllm-sr/auto", recipe="default", want_trace=False
            )
            result = doc["decision_result"]
            assert isinstance(result, dict)
            got = doc.get("routing_decision") or result["decision_name"]
            ok = got == dec["expected_decision"] and not doc["signal_errors"]
            tally["pass" if ok else "fail"] += 1
            if verbose and not ok:
                print(f"  {name}/{dec['id']}/{variant.get('id')}: expected "
                      f"{dec['expected_decision']!r}, got {got!r}; matched "
                      f"{result['matched_signals']}")  # fmt: skip
    return tally


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", action="append", choices=WITH_PROBES)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--stand-in", action="store_true", help="a toy encoder, not d3-edge")
    args = parser.parse_args()
    exchange = stand_in_exchange if args.stand_in else D3Edge().exchange
    total: Counter[str] = Counter()
    print(f"{'recipe':<12} {'pass':>5} {'fail':>5} {'skipped':>8}")
    for name in args.recipe or WITH_PROBES:
        tally = asyncio.run(run_recipe(name, exchange, args.verbose))
        total.update(tally)
        print(f"{name:<12} {tally['pass']:>5} {tally['fail']:>5} {tally['skipped']:>8}")
    print(f"{'all':<12} {total['pass']:>5} {total['fail']:>5} {total['skipped']:>8}")


if __name__ == "__main__":
    main()
