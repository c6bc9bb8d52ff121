"""Upstream's recipe probes (``probes.yaml``) through vllm-sr's ``POST /api/v1/routing/preview``
(v0.4's envelope; the same handler as ``/api/v1/eval``), with the model-backed signals answered
by the real d3-edge model (the worker's own loading and bundle code, in this process): how many
probes route to the decision upstream expects, and why the others do not.

Sources: the eight maintained recipes of upstream commit 3d48f8c9
(tests/fixtures/upstream/recipes/<name>/{config,probes}.yaml: accuracy, agent, balance,
feedback, knowledge, mom-v1, multi-objective, privacy) and upstream v0.4's released built-in
bundle (tests/fixtures/upstream/v0.4/mom-v1: 315 probes).

Loading (bench/recipe_strip.py): each recipe is loaded unchanged where vllm-sr loads it; where
vllm-sr refuses part of it, only what is refused is removed, and what was removed is printed
per recipe before the table. The v0.4 bundle has no ``providers`` and no ``entrypoints`` (the
v0.4 CLI adds them): the bench adds one stand-in model (never called: a preview does not
generate) and 3d48f8c9 mom-v1's five entrypoint names for its five recipes, and says so.

Each probe variant is sent as upstream's sr-bench sends it (tools/agent/scripts/
router_calibration_evaluation.py at 3d48f8c9; cli/routing_preview.py in v0.4): ``text`` (with
``repeat`` and ``padding``) or ``messages`` (image fixtures inlined as data URIs, ``generated_text``
filled to its byte target), the request fields (tools, functions, tool_choice, ...), its
``model`` or, for a probe of a named recipe, that recipe's entrypoint, and ``options.trace``.
A probe passes when ``routing_decision`` (else ``decision_result.decision_name``) is its
``expected_decision`` and ``signal_errors`` is empty (upstream's first and "always"
assertions; the plugin, algorithm and signal assertions are not scored here). A probe is
skipped when its expected decision is not in the loaded recipe. Misses are grouped by cause:
the preview's error, signal errors, or expected against got decision (the expected one matched
too and was outranked, or did not match), with the leaves that made the winner match (its NOT
guards left out) and those that kept the expected decision from matching (from the trace;
``NOT type:name``: a leaf under a NOT that matched).

    python bench/router_probes.py [--recipe feedback ...] [--verbose] [--stand-in]

``--recipe`` takes a 3d48f8c9 name or ``v0.4/mom-v1``. ``--stand-in`` answers the bundles with
tests/support's toy encoder instead of d3-edge (no model load: the smoke test's mode; its pass
counts say nothing about routing quality).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from bench.recipe_strip import NotLoadable, strip_refused, summary  # noqa: E402

UPSTREAM = REPO / "tests" / "fixtures" / "upstream"
RECIPES_3D48 = (
    "accuracy",
    "agent",
    "balance",
    "feedback",
    "knowledge",
    "mom-v1",
    "multi-objective",
    "privacy",
)
V04 = "v0.4/mom-v1"
SOURCES = (*RECIPES_3D48, V04)
# 3d48f8c9 mom-v1's entrypoints: the bench gives v0.4's bundle the same names.
V04_ENTRYPOINTS = {
    "balance": "vllm-sr/mom-v1-blend",
    "cost": "vllm-sr/mom-v1-lite",
    "speed": "vllm-sr/mom-v1-flash",
    "accuracy": "vllm-sr/mom-v1-ultra",
    "vault": "vllm-sr/mom-v1-vault",
}
PROMPT_FIELDS = ("tools", "functions", "tool_choice", "function_call", "response_format")
AUTO = "vllm-sr/auto"
Exchange = Callable[[str, str, bytes, float | None], Awaitable[tuple[int, bytes]]]


def paths(source: str) -> tuple[Path, Path]:
    base = UPSTREAM / source if source == V04 else UPSTREAM / "recipes" / source
    return base / "config.yaml", base / "probes.yaml"


# -- the recipe, as vllm-sr loads it ----------------------------------------------------------


def completed(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A recipe bundle without providers (v0.4's) -> with a stand-in model and entrypoints,
    and what was added."""
    if raw.get("providers"):
        return raw, []
    doc = copy.deepcopy(raw)
    doc["providers"] = {
        "defaults": {"default_model": "stand-in"},
        "models": [{"name": "stand-in", "backend_refs": [{"endpoint": "127.0.0.1:9"}]}],
    }
    added = ["providers: one stand-in model (never called: a preview does not generate)"]
    names = [r.get("name") for r in doc.get("recipes") or []]
    entries = [
        {"model_names": [V04_ENTRYPOINTS.get(n, f"vllm-sr/mom-v1-{n}")], "recipe": n}
        for n in names
        if n
    ]
    if entries and not doc.get("entrypoints"):
        doc["entrypoints"] = entries
        added.append(
            "entrypoints: " + ", ".join(f"{e['model_names'][0]} -> {e['recipe']}" for e in entries)
        )
    return doc, added


def build(config: Any, exchange: Exchange) -> Any:
    """Router mode's handlers for the config, as ``vllm-sr serve`` builds them
    (supervisor/service.py's RouterPlan), on the given bundle exchange; backends never
    started (a preview calls none)."""
    from vllm_sr.router.backends import BackendSet
    from vllm_sr.router.chat import build_chat_router

    return build_chat_router(
        config.providers,
        config.recipes_by_name()["default"],
        exchange=exchange,
        decision_deployment=config.default_deployment(),
        auto_model_names=list(config.global_.router.auto_model_names),
        backends=BackendSet(config.providers),
        recipes=config.recipes_by_name(),
        entrypoints={
            name.strip(): config.recipe_name_for(name) or "default"
            for entry in config.entrypoints
            for name in entry.model_names
        },
        global_=config.global_,
        cache=False,
    )


# -- the bundle exchange: d3-edge or the toy encoder -----------------------------------------


class D3Edge:
    """The d3-edge artifact loaded by the worker's code, answering bundles with the worker's
    own bundle parsing and finishing (embeddings, and classify by label examples)."""

    def __init__(self) -> None:
        from vllm_sr.worker import artifacts, surfaces

        self.model = artifacts.load(artifacts.resolve(artifacts.D3_EDGE), "cpu")
        self.view = surfaces.ModelView(
            name=artifacts.D3_EDGE,
            names=frozenset({artifacts.D3_EDGE}),
            dimensions=self.model.dimensions,
            max_length=self.model.max_length,
            head_labels=self.model.labels,
            encode=self.model.tokenizer.encode,
            truncate=self.model.tokenizer.truncate,
            vocab_size=self.model.vocab_size,
        )
        self.cache: dict[str, numpy.ndarray] = {}

    def embed(self, texts: list[str]) -> numpy.ndarray:
        todo = [t for t in dict.fromkeys(texts) if t not in self.cache]
        for start in range(0, len(todo), 16):
            chunk = todo[start : start + 16]
            ids = self.model.tokenizer.encode(chunk)
            rows = [self.model.tokenizer.truncate(r, self.model.max_length) for r in ids]
            out = self.model.runner.forward(rows)[:, : self.model.dimensions]
            for text, vec in zip(chunk, out, strict=True):
                self.cache[text] = vec.astype(numpy.float32)
        return numpy.stack([self.cache[t] for t in texts])

    async def exchange(
        self, deployment: str, path: str, body: bytes, timeout_ms: float | None
    ) -> tuple[int, bytes]:
        from vllm_sr.errors import InvalidRequest, VllmSrError
        from vllm_sr.worker import classify, surfaces

        view, results = self.view, []
        for task_id, surface, inner in surfaces.parse_bundle(json.loads(body), view):
            try:
                if surface == "embeddings":
                    texts, _, fmt = surfaces.validate_embeddings(inner, view)
                    doc = surfaces.embeddings_finisher(view, fmt, len(texts))(self.embed(texts))
                else:
                    texts, _, key = surfaces.validate_classify(inner, view)
                    if key is None:
                        raise InvalidRequest("d3-edge has no classification head")
                    examples = self.embed([e for _, ex in key for e in ex])
                    centroids = classify.centroids_from(examples, key)
                    finish = surfaces.classify_finisher(view, len(texts), centroids, key)
                    doc = finish(self.embed(texts))
                results.append({"id": task_id, "status": 200, "body": doc})
            except VllmSrError as exc:
                results.append({"id": task_id, "status": exc.http_status, "body": exc.to_json()})
        return 200, json.dumps({"object": "bundle", "results": results}, default=_plain).encode()


def _plain(obj: Any) -> Any:
    if isinstance(obj, numpy.ndarray):
        return obj.tolist()
    if isinstance(obj, numpy.generic):
        return obj.item()
    raise TypeError(type(obj).__name__)


async def stand_in_exchange(
    deployment: str, path: str, body: bytes, timeout_ms: float | None
) -> tuple[int, bytes]:
    """Bundles answered by the tests' toy encoder (the worker's own bundle code around it)."""
    from tests.support.backends import answer_bundle

    return 200, answer_bundle(body)


# -- a probe as sr-bench sends it --------------------------------------------------------------


def probe_text(variant: dict[str, Any]) -> str:
    query = "\n".join([variant.get("query") or ""] * int(variant.get("repeat") or 1))
    pad = variant.get("padding")
    if not pad:
        return query
    lines = [pad.get("text", "")] * int(pad.get("repeat", 1))
    place = pad.get("placement", "after")
    if place == "before":
        parts = [*lines, query]
    elif place == "after":
        parts = [query, *lines]
    else:
        mid = len(lines) // 2
        parts = [*lines[:mid], query, *lines[mid:]]
    return "\n".join(p for p in parts if p)


def _text_bytes(content: list[Any]) -> int:
    return sum(
        len(json.dumps(p.get("text", ""), ensure_ascii=False).encode()) - 2
        for p in content
        if isinstance(p, dict) and p.get("type") == "text"
    )


def probe_messages(variant: dict[str, Any], images: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = copy.deepcopy(variant["messages"])
    gen = variant.get("generated_text")
    if gen:
        content = messages[gen["message_index"]]["content"]
        extra = int(gen["target_text_bytes"]) - _text_bytes(content)
        content.insert(
            gen["content_index"], {"type": "text", "text": gen.get("character", "x") * extra}
        )
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            for i, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") == "image_fixture":
                    image = images[part["fixture"]]
                    data = "".join(image["data_base64"].split())
                    url = f"data:{image['media_type']};base64,{data}"
                    content[i] = {"type": "image_url", "image_url": {"url": url}}
    return messages


def envelope(
    dec: dict[str, Any], variant: dict[str, Any], images: dict[str, Any], model: str
) -> dict[str, Any]:
    body: dict[str, Any] = {k: variant[k] for k in PROMPT_FIELDS if k in variant}
    if "request_metadata" in variant:
        body["metadata"] = variant["request_metadata"]
    if "messages" in variant:
        body["messages"] = probe_messages(variant, images)
    else:
        body["text"] = probe_text(variant)
    body["model"] = model
    body["options"] = {"trace": True}
    return body


def model_for(dec: dict[str, Any], variant: dict[str, Any], entry_of: dict[str, str]) -> str:
    model = variant.get("model") or dec.get("model")
    if model:
        return str(model)
    recipe = dec.get("expected_recipe") or "default"
    return entry_of.get(recipe, AUTO) if recipe != "default" else AUTO


# -- running and judging -----------------------------------------------------------------------


@dataclass
class Tally:
    probes: int = 0
    run: int = 0
    passed: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    misses: dict[str, Miss] = field(default_factory=lambda: defaultdict(Miss))
    stripped: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    seconds: float = 0.0
    # per recipe of a bundle (a probe's ``expected_recipe``): [probes, run, passed]
    by_recipe: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0, 0]))

    @property
    def missed(self) -> int:
        return sum(len(m.ids) for m in self.misses.values())


def leaves(node: dict[str, Any] | None, holds: bool, negated: bool = False) -> list[str]:
    """The trace's leaves whose effect on the rule is ``holds`` (a leaf under an odd number of
    NOTs counts inverted, and is shown as ``NOT type:name``): with True, the leaves that made
    a decision match; with False, those that kept it from matching."""
    if not node:
        return []
    if node.get("node_type") == "leaf":
        if (bool(node.get("matched")) != negated) == holds:
            prefix = "NOT " if negated else ""
            return [f"{prefix}{node.get('signal_type')}:{node.get('signal_name')}"]
        return []
    flip = negated != (str(node.get("node_type")).upper() == "NOT")
    return [x for child in node.get("children") or [] for x in leaves(child, holds, flip)]


@dataclass
class Miss:
    """Probes routed elsewhere than expected, for one (expected, got) pair."""

    ids: list[str] = field(default_factory=list)
    winner_leaves: Counter[str] = field(default_factory=Counter)  # what made the winner match
    expected_unmatched: Counter[str] = field(default_factory=Counter)  # why expected did not


def miss_key(doc: dict[str, Any], expected: str, got: str) -> tuple[str, list[str], list[str]]:
    """A wrong decision's cause -> (group, the winner's matched leaves (its NOT guards that
    held left out), the expected decision's failing leaves; empty when it matched too and was
    outranked)."""
    trace = {t.get("decision_name"): t for t in doc.get("eval_trace") or []}
    want = trace.get(expected) or {}
    won = trace.get(got) or {}
    winner = [x for x in leaves(won.get("root_trace"), holds=True) if not x.startswith("NOT ")]
    shown = repr(got) if got else "no decision (the default model)"
    if want.get("matched"):
        return f"expected {expected!r} matched too, outranked by {shown}", winner, []
    return (
        f"expected {expected!r} did not match; got {shown}",
        winner,
        leaves(want.get("root_trace"), holds=False),
    )


def _top(counter: Counter[str], n: int = 5) -> str:
    return ", ".join(f"{k} x{v}" for k, v in counter.most_common(n)) or "-"


async def run_source(source: str, exchange: Exchange, verbose: bool) -> Tally:
    from vllm_sr.httpserver import Request
    from vllm_sr.router.preview import PREVIEW_PATH

    tally = Tally()
    config_path, probes_path = paths(source)
    raw, tally.added = completed(yaml.safe_load(config_path.read_text()))
    probes = yaml.safe_load(probes_path.read_text())
    images = (probes.get("fixtures") or {}).get("images") or {}
    variants = [(d, v) for d in probes["decisions"] for v in d.get("variants", [])]
    tally.probes = len(variants)
    try:
        config, stripped = strip_refused(raw)
    except NotLoadable as exc:
        tally.skipped[f"recipe not loadable: {exc}"] = tally.probes
        return tally
    tally.stripped = summary(stripped)
    chat = build(config, exchange)
    handler = chat.routes()[PREVIEW_PATH]["POST"]
    entry_of = {r: m for m, r in chat.entrypoints.items()} if chat.entrypoints else {}
    started = time.perf_counter()
    for dec, variant in variants:
        expected = dec["expected_decision"]
        recipe = dec.get("expected_recipe") or "default"
        counts = tally.by_recipe[recipe]
        counts[0] += 1
        loaded = chat.recipes.get(recipe)
        names = {d.name for d in loaded.routing.decisions} if loaded is not None else set()
        if expected not in names:
            tally.skipped[f"decision {recipe}/{expected} not in the loaded recipe"] += 1
            continue
        body = envelope(dec, variant, images, model_for(dec, variant, entry_of))
        request = Request("POST", PREVIEW_PATH, "", {}, json.dumps(body).encode())
        answer = await handler(request)
        tally.run += 1
        counts[1] += 1
        doc = json.loads(answer.body)
        vid = f"{dec['id']}/{variant.get('id')}"
        if answer.status != 200:
            err = doc.get("error", {})
            why = f"preview {answer.status} {err.get('code')}: {err.get('message')}"
            tally.misses[why].ids.append(vid)
            continue
        got = doc.get("routing_decision") or doc["decision_result"]["decision_name"]
        if doc.get("signal_errors"):
            errors = json.dumps(doc["signal_errors"])
            tally.misses[f"signal errors: {errors[:160]}"].ids.append(vid)
        elif got == expected:
            tally.passed += 1
            counts[2] += 1
        else:
            key, won, unmatched = miss_key(doc, expected, got)
            miss = tally.misses[key]
            miss.ids.append(vid)
            miss.winner_leaves.update(won)
            miss.expected_unmatched.update(unmatched)
    tally.seconds = time.perf_counter() - started
    if verbose:
        print(f"  {source}: {tally.run} probes in {tally.seconds:.1f} s", flush=True)
    return tally


def print_report(results: dict[str, Tally]) -> None:
    print("what was removed or added to load each recipe (bench/recipe_strip.py):")
    for name, t in results.items():
        if not t.stripped and not t.added:
            print(f"  {name}: loaded unchanged")
            continue
        print(f"  {name}:")
        for line in t.added:
            print(f"      added: {line}")
        for line in t.stripped:
            print(f"    removed {line}")
    print()
    header = f"{'recipe':<16} {'probes':>6} {'run':>5} {'passed':>6} {'missed':>6} {'skipped':>7}"
    print(header)
    total = Tally()
    for name, t in results.items():
        skipped = sum(t.skipped.values())
        print(f"{name:<16} {t.probes:>6} {t.run:>5} {t.passed:>6} {t.missed:>6} {skipped:>7}")
        if len(t.by_recipe) > 1:  # a bundle of recipes (v0.4's): a row for each
            for recipe, (n, ran, ok) in sorted(t.by_recipe.items()):
                label = f"  {recipe}"
                print(f"{label:<16} {n:>6} {ran:>5} {ok:>6} {ran - ok:>6} {n - ran:>7}")
        total.probes += t.probes
        total.run += t.run
        total.passed += t.passed
        total.skipped.update(t.skipped)
        for k, m in t.misses.items():
            total.misses[k].ids += m.ids
    skipped = sum(total.skipped.values())
    print(
        f"{'all':<16} {total.probes:>6} {total.run:>5} {total.passed:>6} {total.missed:>6} "
        f"{skipped:>7}"
    )
    for name, t in results.items():
        for why, n in t.skipped.items():
            print(f"  skipped {name}: {n} x {why}")
    print()
    for name, t in results.items():
        if not t.misses:
            continue
        print(f"misses, {name} (by cause):")
        for why, m in sorted(t.misses.items(), key=lambda kv: -len(kv[1].ids)):
            ids = m.ids
            print(f"  {len(ids):>3} x {why}")
            if m.winner_leaves:
                print(f"        winner's matched leaves: {_top(m.winner_leaves)}")
            if m.expected_unmatched:
                print(f"        expected's unmatched leaves: {_top(m.expected_unmatched)}")
            shown = ", ".join(ids[:3]) + (f", +{len(ids) - 3} more" if len(ids) > 3 else "")
            print(f"        probes: {shown}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", action="append", choices=SOURCES)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--stand-in", action="store_true", help="a toy encoder, not d3-edge")
    args = parser.parse_args()
    t0 = time.perf_counter()
    exchange = stand_in_exchange if args.stand_in else D3Edge().exchange
    mode = "stand-in toy encoder" if args.stand_in else "d3-edge (float32, cpu, in process)"
    print(f"signals answered by: {mode}; load {time.perf_counter() - t0:.1f} s", flush=True)
    results = {
        name: asyncio.run(run_source(name, exchange, args.verbose))
        for name in args.recipe or SOURCES
    }
    print_report(results)


if __name__ == "__main__":
    main()
