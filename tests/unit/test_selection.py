"""The latency_aware and multi_factor selectors (vllm_sr/router/selection) on upstream's own
fragments (tests/fixtures/upstream/fragments/algorithm/selection/), with fake facts; the
observations they read on a fake clock; and the bad input their blocks refuse."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_sr.clock import FakeClock
from vllm_sr.config.files import parse_config
from vllm_sr.config.problems import format_path
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_rules import routing_local_problems
from vllm_sr.config.routing_selection import (
    RUN_SELECTORS,
    LatencyAwareSettings,
    parse_settings,
)
from vllm_sr.config.selection_multi_factor import MultiFactorSettings
from vllm_sr.router.selection.decide import DecisionSelection
from vllm_sr.router.selection.observations import (
    MAX_SAMPLES,
    AnswerTiming,
    ModelObservations,
    Window,
    percentile_of,
)
from vllm_sr.router.selection.selectors import NoCandidates, latency_aware, multi_factor

FRAGMENTS = Path(__file__).parents[1] / "fixtures/upstream/fragments/algorithm/selection"


def upstream(name: str) -> dict[str, Any]:
    algo = yaml.safe_load((FRAGMENTS / name).read_text())["algorithm"]
    assert isinstance(algo, dict)
    return algo


def latency_settings() -> LatencyAwareSettings:
    algo = upstream("latency-aware.yaml")
    settings = parse_settings("latency_aware", algo["latency_aware"])
    assert isinstance(settings, LatencyAwareSettings)
    return settings  # tpot p90, ttft p95


def multi_settings(**changes: Any) -> MultiFactorSettings:
    algo = upstream("multi-factor.yaml")
    block = algo["multi_factor"]
    for key, value in changes.items():
        if isinstance(value, dict):
            block[key] = {**block.get(key, {}), **value}
        else:
            block[key] = value
    settings = parse_settings("multi_factor", block)
    assert isinstance(settings, MultiFactorSettings)
    return settings  # q .4 l .2 c .2 L .2; slo tpot 200ms, ttft 800ms, $5, 50 in flight


@dataclass
class Ref:
    model: str
    lora_name: str | None = None


@dataclass
class Facts:
    tpots: dict[str, float] = field(default_factory=dict)  # seconds, any percentile
    ttfts: dict[str, float] = field(default_factory=dict)
    inflights: dict[str, int] = field(default_factory=dict)
    prices: dict[str, float] = field(default_factory=dict)
    qualities: dict[str, float] = field(default_factory=dict)
    asked: list[tuple[str, str, int]] = field(default_factory=list)

    def tpot(self, model: str, percentile: int) -> float | None:
        self.asked.append(("tpot", model, percentile))
        return self.tpots.get(model)

    def ttft(self, model: str, percentile: int) -> float | None:
        self.asked.append(("ttft", model, percentile))
        return self.ttfts.get(model)

    def inflight(self, model: str) -> int:
        return self.inflights.get(model, 0)

    def prompt_price(self, model: str) -> float | None:
        return self.prices.get(model)

    def quality(self, model: str) -> float | None:
        return self.qualities.get(model)


REFS = [Ref("a"), Ref("b"), Ref("c")]


# -- latency_aware -----------------------------------------------------------------------------


def test_latency_aware_without_data_takes_the_first_model_ref() -> None:
    picked = latency_aware(REFS, latency_settings(), Facts())
    assert picked.ref.model == "a"
    assert "no latency observations" in picked.reason


def test_latency_aware_reads_the_configured_percentiles_and_takes_the_lowest() -> None:
    facts = Facts(tpots={"a": 0.05, "b": 0.02, "c": 0.04}, ttfts={"a": 0.5, "b": 0.3, "c": 0.2})
    picked = latency_aware(REFS, latency_settings(), facts)
    # b: (0.02/0.02 + 0.3/0.2) / 2 = 1.25; c: (2 + 1) / 2 = 1.5; a: (2.5 + 2.5) / 2 = 2.5
    assert picked.ref.model == "b"
    assert picked.scores == pytest.approx({"a": 2.5, "b": 1.25, "c": 1.5})
    assert {(m, p) for m, _, p in facts.asked} == {("tpot", 90), ("ttft", 95)}


def test_latency_aware_leaves_out_a_model_missing_a_configured_metric() -> None:
    # c is fastest on TPOT but has no TTFT: it is not a candidate
    facts = Facts(tpots={"a": 0.05, "b": 0.04, "c": 0.001}, ttfts={"a": 0.5, "b": 0.6})
    picked = latency_aware(REFS, latency_settings(), facts)
    assert set(picked.scores) == {"a", "b"}
    # a: (0.05/0.04 + 0.5/0.5) / 2 = 1.125; b: (1 + 0.6/0.5) / 2 = 1.1
    assert picked.ref.model == "b"
    assert picked.scores == pytest.approx({"a": 1.125, "b": 1.1})


def test_latency_aware_with_only_ttft() -> None:
    settings = LatencyAwareSettings(ttft_percentile=50)
    picked = latency_aware(REFS, settings, Facts(ttfts={"a": 0.9, "b": 0.1}))
    assert picked.ref.model == "b" and set(picked.scores) == {"a", "b"}


# -- multi_factor ------------------------------------------------------------------------------


def test_multi_factor_slo_drops_what_breaks_a_ceiling() -> None:
    # upstream's fragment: TPOT 200 ms, TTFT 800 ms, $5 per 1M, 50 in flight at p95
    facts = Facts(
        tpots={"a": 0.25, "b": 0.05, "c": 0.05},
        ttfts={"b": 0.9},
        prices={"c": 1.0},
        inflights={"c": 3},
    )
    picked = multi_factor(REFS, multi_settings(), facts)
    assert picked.ref.model == "c"
    assert set(picked.scores) == {"c"}
    assert (
        "a:tpot_p95=250.0ms>200ms" in picked.reason and "b:ttft_p95=900.0ms>800ms" in picked.reason
    )
    assert ("tpot", "a", 95) in facts.asked
    # price and in-flight ceilings
    facts = Facts(prices={"a": 6.0, "b": 1.0, "c": 1.0}, inflights={"b": 51})
    picked = multi_factor(REFS, multi_settings(), facts)
    assert picked.ref.model == "c" and set(picked.scores) == {"c"}
    # a model with no data for a ceiling is kept
    assert set(multi_factor(REFS, multi_settings(), Facts()).scores) == {"a", "b", "c"}


def test_multi_factor_weights_trade_quality_for_cost() -> None:
    facts = Facts(qualities={"a": 0.9, "b": 0.5}, prices={"a": 4.0, "b": 1.0})
    refs = REFS[:2]
    # quality 0.4 against cost 0.2 (+ load and latency equal or absent): a wins
    quality_first = multi_factor(refs, multi_settings(), facts)
    # load is equal (0.5 each, weight 0.2); latency has no data (left out)
    # a: (0.4*1 + 0.2*0 + 0.2*0.5) / 0.8 = 0.625; b: (0 + 0.2*1 + 0.1) / 0.8 = 0.375
    assert quality_first.ref.model == "a"
    assert quality_first.scores == pytest.approx({"a": 0.625, "b": 0.375})
    cost_first = multi_factor(refs, multi_settings(weights={"quality": 0.1, "cost": 0.6}), facts)
    assert cost_first.ref.model == "b"


def test_multi_factor_load_and_latency_are_lower_is_better() -> None:
    facts = Facts(inflights={"a": 9, "b": 1}, tpots={"a": 0.01, "b": 0.02})
    only_load = multi_settings(weights={"quality": 0, "latency": 0, "cost": 0, "load": 1})
    assert multi_factor(REFS[:2], only_load, facts).ref.model == "b"
    only_latency = multi_settings(weights={"quality": 0, "latency": 1, "cost": 0, "load": 0})
    assert multi_factor(REFS[:2], only_latency, facts).ref.model == "a"
    # TTFT stands in for a model's latency when it has no TPOT
    facts = Facts(ttfts={"a": 0.3, "b": 0.1})
    assert multi_factor(REFS[:2], only_latency, facts).ref.model == "b"
    # all zero weights: equal weights (upstream's normalisation); ties: the first
    zero = multi_settings(weights={"quality": 0, "latency": 0, "cost": 0, "load": 0})
    assert zero.weights.normalised().quality == 0.25
    assert multi_factor(REFS, zero, Facts()).ref.model == "a"


@pytest.mark.parametrize(("mode", "model"), [("cheapest", "b"), ("first", "a"), ("", "b")])
def test_multi_factor_on_no_candidates(mode: str, model: str) -> None:
    facts = Facts(inflights={"a": 60, "b": 70, "c": 80}, prices={"a": 3.0, "b": 1.0})
    picked = multi_factor(REFS, multi_settings(on_no_candidates=mode), facts)
    assert picked.ref.model == model
    assert "the SLO dropped every candidate" in picked.reason


async def test_multi_factor_on_no_candidates_fail_raises_and_the_chat_takes_the_first() -> None:
    facts = Facts(inflights={"a": 60, "b": 70})
    settings = multi_settings(on_no_candidates="fail")
    with pytest.raises(NoCandidates, match="a:inflight=60>50"):
        multi_factor(REFS[:2], settings, facts)
    routing = Routing.model_validate(
        {
            "decisions": [
                {
                    "name": "d",
                    "modelRefs": [{"model": "a"}, {"model": "b"}, {"model": "c"}],
                    "algorithm": {
                        "type": "multi_factor",
                        "multi_factor": {"slo": {"max_inflight": 50}, "on_no_candidates": "fail"},
                    },
                }
            ]
        }
    )
    facts = Facts(inflights={"a": 60, "b": 70, "c": 80})
    selection = DecisionSelection(routing, facts)
    decision = routing.decisions[0]
    healthy = {"b", "c"}
    choice = await selection.choose(decision, "dflt", lambda m: m in healthy)
    assert (choice.model, choice.method, choice.fallback) == ("b", "multi_factor", None)
    preview = selection.preview(decision)
    assert (preview.ref.model, preview.status, preview.method) == ("a", "fallback", "multi_factor")


async def test_decision_selection_health_single_and_static() -> None:
    routing = Routing.model_validate(
        {
            "decisions": [
                {
                    "name": "fast",
                    "modelRefs": [{"model": "a"}, {"model": "b"}],
                    "algorithm": {
                        "type": "latency_aware",
                        "latency_aware": {"ttft_percentile": 50},
                    },
                },
                {
                    "name": "one",
                    "modelRefs": [{"model": "a"}],
                    "algorithm": {
                        "type": "latency_aware",
                        "latency_aware": {"ttft_percentile": 50},
                    },
                },
                {"name": "plain", "modelRefs": [{"model": "a"}, {"model": "b"}]},
            ]
        }
    )
    fast, one, plain = routing.decisions
    selection = DecisionSelection(routing, Facts(ttfts={"a": 0.2, "b": 0.1}))
    everyone = await selection.choose(fast, "dflt", lambda m: True)
    assert (everyone.model, everyone.method) == ("b", "latency_aware")
    # the faster model is down: the selector sees only a
    assert (await selection.choose(fast, "dflt", lambda m: m != "b")).model == "a"
    down = await selection.choose(fast, "dflt", lambda m: False)
    assert (down.model, down.fallback) == ("dflt", "models_unhealthy")
    assert (await selection.choose(one, "dflt", lambda m: True)).method == "single"
    assert (await selection.choose(plain, "dflt", lambda m: True)).method == "static"
    assert not selection.runs_selector(plain)


# -- observations ------------------------------------------------------------------------------


def test_percentiles_as_upstream_reads_them() -> None:
    assert percentile_of([], 50) is None
    assert percentile_of([0.1], 95) == 0.1
    assert percentile_of([0.1, 0.2], 95) == pytest.approx(0.3 * 0.2 + 0.7 * 0.1)  # the EMA
    values = [0.4, 0.1, 0.3, 0.2, 0.5]
    assert percentile_of(values, 50) == pytest.approx(0.3)
    assert percentile_of(values, 90) == pytest.approx(0.46)  # between 0.4 and 0.5
    assert percentile_of(values, 100) == pytest.approx(0.5)


def test_observations_are_bounded_in_count_and_age() -> None:
    clock = FakeClock()
    obs = ModelObservations(clock, max_samples=4, max_age_s=60.0)
    for v in (9.0, 9.0, 0.1, 0.2, 0.3, 0.4):
        obs.record("m", tpot_s=v)
    assert obs.tpot("m", 100) == pytest.approx(0.4)  # the two 9.0 fell out of the window
    assert obs.snapshot()["m"]["tpot"]["samples"] == 4
    obs.record("m", ttft_s=0.5, tpot_s=0.0)  # non-positive: not recorded (upstream)
    assert obs.ttft("m", 50) == 0.5 and obs.snapshot()["m"]["tpot"]["samples"] == 4
    clock.advance(61.0)
    assert obs.tpot("m", 50) is None and obs.ttft("m", 50) is None
    assert obs.snapshot() == {}
    assert obs.tpot("unknown", 50) is None and obs.tpot("m", 0) is None
    assert ModelObservations(clock).max_samples == MAX_SAMPLES == 1000


def test_a_window_reads_as_percentile_of_its_values_through_evictions_and_ageing() -> None:
    rng = random.Random(7)
    clock = FakeClock()
    window = Window(max_samples=50, max_age_s=30.0)
    kept: list[tuple[float, float]] = []
    for _ in range(400):
        clock.advance(rng.uniform(0.0, 0.5))
        value = round(rng.uniform(0.01, 2.0), 2)  # repeats happen: equal values evict right
        window.add(clock.monotonic(), value)
        kept = [*kept, (clock.monotonic(), value)][-50:]
        now = clock.monotonic()
        kept = [(at, v) for at, v in kept if now - at <= 30.0]
        p = rng.randint(1, 100)
        assert window.percentile(now, p) == pytest.approx(percentile_of([v for _, v in kept], p))
        assert window.ordered == sorted(v for _, v in kept)


@dataclass
class Inner:
    seen: list[Any] = field(default_factory=list)

    def whole(self, status: int, body: bytes) -> None:
        self.seen.append(("whole", status))

    def chunk(self, data: bytes) -> None:
        self.seen.append(("chunk", data))

    def finish(self) -> None:
        self.seen.append("finish")


def sse(delta: dict[str, Any], usage: dict[str, int] | None = None) -> bytes:
    event: dict[str, Any] = {"choices": [{"index": 0, "delta": delta}]}
    if usage is not None:
        event["usage"] = usage
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def test_a_whole_answer_gives_ttft_and_tpot_from_its_usage() -> None:
    clock = FakeClock()
    obs = ModelObservations(clock)
    inner = Inner()
    tap = obs.timing("m", clock.monotonic(), inner)
    clock.advance(2.0)
    tap.whole(200, json.dumps({"usage": {"completion_tokens": 40}}).encode())
    assert obs.ttft("m", 50) == pytest.approx(2.0)
    assert obs.tpot("m", 50) == pytest.approx(0.05)
    assert inner.seen == [("whole", 200)]
    failed = obs.timing("bad", clock.monotonic(), None)
    failed.whole(503, b'{"error": {}}')
    assert obs.ttft("bad", 50) is None


def test_a_whole_answers_tokens_are_usages_not_a_quote_in_its_content() -> None:
    clock = FakeClock()
    obs = ModelObservations(clock)
    tap = obs.timing("m", clock.monotonic(), None)
    clock.advance(1.0)
    content = 'write "completion_tokens": 1 in the file'
    answer = {
        "choices": [{"message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 20, "completion_tokens_details": {}},
    }
    tap.whole(200, json.dumps(answer).encode())
    assert obs.tpot("m", 50) == pytest.approx(0.05)
    bare = obs.timing("n", clock.monotonic(), None)
    clock.advance(1.0)
    bare.whole(200, json.dumps({"choices": []}).encode())  # no usage: TTFT only
    assert obs.ttft("n", 50) == pytest.approx(1.0) and obs.tpot("n", 50) is None


def test_a_stream_gives_ttft_at_its_first_chunk_and_tpot_at_its_end() -> None:
    clock = FakeClock()
    obs = ModelObservations(clock)
    inner = Inner()
    tap = obs.timing("m", clock.monotonic(), inner)
    clock.advance(0.3)
    first = sse({"role": "assistant", "content": "he"})
    tap.chunk(first[:10])  # a read may end mid-line
    assert obs.ttft("m", 50) == pytest.approx(0.3)
    clock.advance(0.2)
    tap.chunk(first[10:] + sse({"content": "llo"}) + sse({}))
    clock.advance(0.5)
    tap.chunk(b"data: [DONE]\n\n")
    tap.finish()
    # no usage: the two chunks that carried content, over the whole second
    assert obs.tpot("m", 50) == pytest.approx(0.5)
    assert inner.seen[-1] == "finish" and len(inner.seen) == 4
    # with usage in the stream, its completion_tokens count
    timed = AnswerTiming(obs, "u", clock.monotonic(), None)
    clock.advance(1.0)
    timed.chunk(sse({"content": "x"}) + sse({}, {"completion_tokens": 10}))
    timed.finish()
    assert obs.tpot("u", 50) == pytest.approx(0.1)
    # a stream that broke (no finish) gives its TTFT only
    broken = AnswerTiming(obs, "broken", clock.monotonic(), None)
    clock.advance(0.1)
    broken.chunk(sse({"content": "x"}))
    assert obs.ttft("broken", 50) == pytest.approx(0.1) and obs.tpot("broken", 50) is None


# -- bad input ---------------------------------------------------------------------------------


def problems_of(algorithm: dict[str, Any]) -> dict[str, str]:
    decision = {"name": "d", "modelRefs": [{"model": "a"}, {"model": "b"}], "algorithm": algorithm}
    return {
        format_path(p.path): p.message for p in routing_local_problems({"decisions": [decision]})
    }


BASE = "routing.decisions[0].algorithm"


@pytest.mark.parametrize(
    ("algorithm", "path", "words"),
    [
        ({"type": "latency_aware"}, "latency_aware", ["without an algorithm.latency_aware block"]),
        ({"type": "multi_factor"}, "multi_factor", ["without an algorithm.multi_factor block"]),
        (
            {"type": "latency_aware", "latency_aware": {"tpot_percentile": 150}},
            "latency_aware.tpot_percentile",
            ["150", "an integer from 1 to 100"],
        ),
        (
            {"type": "latency_aware", "latency_aware": {"ttft_percentile": 9.5}},
            "latency_aware.ttft_percentile",
            ["9.5", "an integer from 1 to 100"],
        ),
        (
            {"type": "latency_aware", "latency_aware": {"tpot_percentile": 0}},
            "latency_aware",
            ["tpot_percentile 0 and ttft_percentile None", "at least one of them"],
        ),
        (
            {"type": "latency_aware", "latency_aware": {"tpot_percentile": 50, "p": 1}},
            "latency_aware.p",
            ["unknown key 'p'", "tpot_percentile, ttft_percentile"],
        ),
        (
            {"type": "multi_factor", "multi_factor": {"weights": {"quality": -1}}},
            "multi_factor.weights.quality",
            ["-1", "a finite number >= 0"],
        ),
        (
            {"type": "multi_factor", "multi_factor": {"weights": [1, 2]}},
            "multi_factor.weights",
            ["[1, 2]", "a mapping"],
        ),
        (
            {"type": "multi_factor", "multi_factor": {"slo": {"max_inflight": 2.5}}},
            "multi_factor.slo.max_inflight",
            ["2.5", "an integer >= 0"],
        ),
        (
            {"type": "multi_factor", "multi_factor": {"slo": {"max_p99": 1}}},
            "multi_factor.slo.max_p99",
            ["unknown key", "max_tpot_ms, max_ttft_ms, max_cost_per_1m, max_inflight"],
        ),
        (
            {"type": "multi_factor", "multi_factor": {"latency_percentile": 101}},
            "multi_factor.latency_percentile",
            ["101", "from 1 to 100", "95"],
        ),
        (
            {"type": "multi_factor", "multi_factor": {"on_no_candidates": "random"}},
            "multi_factor.on_no_candidates",
            ["'random'", "cheapest, first, fail"],
        ),
        (
            {"type": "multi_factor", "multi_factor": {"objective_v2": 1}},
            "multi_factor.objective_v2",
            ["unknown key 'objective_v2'", "weights, objective, quality"],
        ),
        (
            {"type": "multi_factor", "multi_factor": {}, "latency_aware": {"ttft_percentile": 5}},
            "latency_aware",
            ["a latency_aware block on algorithm 'multi_factor'", "only a multi_factor block"],
        ),
    ],
)
def test_bad_blocks_name_field_value_and_what_is_accepted(
    algorithm: dict[str, Any], path: str, words: list[str]
) -> None:
    found = problems_of(algorithm)
    assert list(found) == [f"{BASE}.{path}"], found
    for word in words:
        assert word in found[f"{BASE}.{path}"]
    with pytest.raises(ValueError):  # the model refuses it too
        Routing.model_validate(
            {"decisions": [{"name": "d", "modelRefs": [{"model": "a"}], "algorithm": algorithm}]}
        )


def test_good_blocks_pass() -> None:
    assert problems_of(upstream("latency-aware.yaml")) == {}
    assert problems_of(upstream("multi-factor.yaml")) == {}
    assert problems_of({"type": "multi_factor", "multi_factor": {"on_no_candidates": ""}}) == {}


def test_the_backends_view_shows_what_the_selectors_read() -> None:
    """`vllm-sr status` and vllm-sr-top's backends view: in flight, TTFT/TPOT p50, price."""
    from rich.console import Console

    from vllm_sr.control.render import backends_table

    clock = FakeClock()
    obs = ModelObservations(clock)
    obs.record("m", ttft_s=0.25, tpot_s=0.0125)
    router = {
        "backends": [
            {
                "model": "m",
                "url": "http://a",
                "state": "healthy",
                "pricing": {"prompt_per_1m": 2.5},
            },
            {"model": "n", "url": "http://b", "state": "healthy", "pricing": None},
        ],
        "selection": {"m": {"inflight": 7, **obs.snapshot()["m"]}, "n": {"inflight": 0}},
    }
    console = Console(width=250, record=True)
    console.print(backends_table(router))
    rows = {line.split()[0]: line.split() for line in console.export_text().splitlines()[2:]}
    assert rows["m"][-4:-1] == ["7", "250.0/12.5", "2.5"]
    assert rows["n"][-4:-1] == ["0", "-/-", "-"]


# -- upstream's recipes --------------------------------------------------------------------------

RECIPES = Path(__file__).parents[1] / "fixtures/upstream/recipes"


def _selector_decisions(doc: Any) -> list[dict[str, Any]]:
    found = []
    if isinstance(doc, dict):
        algo = doc.get("algorithm")
        if "modelRefs" in doc and isinstance(algo, dict) and algo.get("type") in RUN_SELECTORS:
            found.append(doc)
        for value in doc.values():
            found += _selector_decisions(value)
    elif isinstance(doc, list):
        for value in doc:
            found += _selector_decisions(value)
    return found


@pytest.mark.parametrize(
    ("recipe", "selectors"), [("accuracy", 0), ("multi-objective", 8), ("mom-v1", 10)]
)
def test_upstream_selector_recipes_load_unchanged(recipe: str, selectors: int) -> None:
    text = (RECIPES / recipe / "config.yaml").read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    decisions = _selector_decisions(doc)
    assert len(decisions) == selectors
    for decision in decisions:  # every selector decision loads and its settings parse
        assert routing_local_problems({"decisions": [decision]}) == []
        kind = decision["algorithm"]["type"]
        parse_settings(kind, decision["algorithm"][kind])
    # vllm-sr runs every looper (vllm_sr/router/looper) and acts on multi-objective's embedding
    # top_k, soft matching and address-less Responses store: all three load unchanged
    parse_config(text, recipe)
    # with upstream's own switch for running loopers as static, the same
    doc.setdefault("global", {}).setdefault("integrations", {})["looper"] = {"endpoint": ""}
    parse_config(yaml.safe_dump(doc), recipe)
