"""multi_factor's v0.4 keys (``objective``, ``quality``, ``latency_metric``) on the released
v0.4 mom-v1 bundle's own blocks (tests/fixtures/upstream/v0.4/mom-v1/config.yaml): they load,
and the selector acts on them over real observations on a fake clock."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_sr.clock import FakeClock
from vllm_sr.config.problems import format_path
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_rules import routing_local_problems
from vllm_sr.config.routing_selection import parse_settings
from vllm_sr.config.selection_multi_factor import MultiFactorSettings
from vllm_sr.router.selection.decide import DecisionSelection
from vllm_sr.router.selection.observations import ModelObservations
from vllm_sr.router.selection.selectors import NoCandidates, multi_factor

MOM_V1 = Path(__file__).parents[1] / "fixtures/upstream/v0.4/mom-v1/config.yaml"


def mom_v1_blocks() -> dict[str, dict[str, Any]]:
    """recipe/decision -> the decision's algorithm block, for every multi_factor decision."""
    config = yaml.safe_load(MOM_V1.read_text())
    return {
        f"{recipe['name']}/{decision['name']}": decision["algorithm"]
        for recipe in config["recipes"]
        for decision in recipe["routing"]["decisions"]
        if decision.get("algorithm", {}).get("type") == "multi_factor"
    }


BLOCKS = mom_v1_blocks()


def settings_of(name: str, **changes: Any) -> MultiFactorSettings:
    block = copy.deepcopy(BLOCKS[name]["multi_factor"])
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(block.get(key), dict):
            block[key] = {**block[key], **value}
        else:
            block[key] = value
    settings = parse_settings("multi_factor", block)
    assert isinstance(settings, MultiFactorSettings)
    return settings


@dataclass
class Ref:
    model: str
    lora_name: str | None = None


@dataclass
class ObservedFacts:
    """Latencies from real :class:`ModelObservations` on a fake clock; the rest given."""

    observations: ModelObservations
    qualities: dict[str, float] = field(default_factory=dict)
    prices: dict[str, float] = field(default_factory=dict)
    inflights: dict[str, int] = field(default_factory=dict)

    def tpot(self, model: str, percentile: int) -> float | None:
        return self.observations.tpot(model, percentile)

    def ttft(self, model: str, percentile: int) -> float | None:
        return self.observations.ttft(model, percentile)

    def inflight(self, model: str) -> int:
        return self.inflights.get(model, 0)

    def prompt_price(self, model: str) -> float | None:
        return self.prices.get(model)

    def quality(self, model: str) -> float | None:
        return self.qualities.get(model)


def observed(
    clock: FakeClock, tpot: dict[str, float] | None = None, ttft: dict[str, float] | None = None
) -> ModelObservations:
    obs = ModelObservations(clock, max_age_s=60.0)
    for model, value in (tpot or {}).items():
        for _ in range(5):
            obs.record(model, tpot_s=value)
            clock.advance(1.0)
    for model, value in (ttft or {}).items():
        for _ in range(5):
            obs.record(model, ttft_s=value)
            clock.advance(1.0)
    return obs


REFS = [Ref("a"), Ref("b"), Ref("c")]


def test_mom_v1_has_thirteen_multi_factor_blocks_and_all_load() -> None:
    assert len(BLOCKS) == 13
    metrics = set()
    for name, algo in BLOCKS.items():
        decision = {"name": "d", "modelRefs": [{"model": "a"}, {"model": "b"}], "algorithm": algo}
        found = routing_local_problems({"decisions": [decision]})
        assert [p for p in found if "multi_factor" in format_path(p.path)] == [], name
        settings = settings_of(name)
        assert settings.objective.lexicographic and settings.objective.priorities
        assert settings.quality is not None and settings.quality.on_missing == "exclude"
        assert settings.quality.index.startswith("vllm-sr/")
        assert settings.on_no_candidates == "fail"
        metrics.add(settings.latency_metric)
    assert metrics == {"ttft", "tpot"}


def test_lexicographic_keeps_what_is_within_tolerance_then_the_next_factor_decides() -> None:
    # balance/reasoning: quality ±0.03, latency ±0.1, cost, load; tpot p95
    settings = settings_of("balance/reasoning")
    clock = FakeClock()
    facts = ObservedFacts(
        observed(clock, tpot={"a": 0.05, "b": 0.02, "c": 0.01}),
        qualities={"a": 90.0, "b": 88.0, "c": 80.0},  # 88 >= 90 - 2.7: b stays, c leaves
    )
    picked = multi_factor(REFS, settings, facts)
    assert picked.ref.model == "b"  # a is slower than 0.02 * 1.1
    # scores: left at stage 0 (quality) -> 0/5, stage 1 (latency) -> 1/5, survivor -> 1
    assert picked.scores == pytest.approx({"c": 0.0, "a": 0.2, "b": 1.0})
    assert "lexicographic[quality±0.03,latency±0.1,cost±0,load±0]" in picked.reason
    assert "quality index vllm-sr/reasoning@1.0.0" in picked.reason
    # with no tolerance on quality, a alone survives the first stage
    strict = settings_of(
        "balance/reasoning",
        objective={"strategy": "lexicographic", "priorities": [{"factor": "quality"}]},
    )
    assert multi_factor(REFS, strict, facts).ref.model == "a"


def test_equal_values_pass_a_stage_and_cost_then_load_break_the_tie() -> None:
    settings = settings_of("balance/reasoning")  # ..., cost (0), load (0)
    facts = ObservedFacts(
        observed(FakeClock(), tpot={"a": 0.02, "b": 0.02, "c": 0.02}),
        qualities={"a": 70.0, "b": 70.0, "c": 70.0},
        prices={"a": 2.0, "b": 1.0, "c": 1.0},
        inflights={"a": 0, "b": 4, "c": 1},
    )
    picked = multi_factor(REFS, settings, facts)
    assert picked.ref.model == "c"
    assert picked.scores == pytest.approx({"a": 0.4, "b": 0.6, "c": 1.0})


def test_latency_metric_reads_the_named_observation() -> None:
    # a: fast TPOT, slow TTFT; b: the other way round
    clock = FakeClock()
    obs = observed(clock, tpot={"a": 0.01, "b": 0.05}, ttft={"a": 0.9, "b": 0.1})
    facts = ObservedFacts(obs, qualities={"a": 50.0, "b": 50.0})
    tpot = settings_of("balance/reasoning")  # latency_metric tpot
    ttft = settings_of("balance/simple")  # latency_metric ttft; quality ±0.12, cost, latency
    assert tpot.latency_metric == "tpot" and ttft.latency_metric == "ttft"
    assert multi_factor(REFS[:2], tpot, facts).ref.model == "a"
    assert multi_factor(REFS[:2], ttft, facts).ref.model == "b"
    # a model with only the other metric has no latency: it leaves at the latency stage
    only_ttft = ObservedFacts(
        observed(FakeClock(), tpot={"a": 0.05}, ttft={"b": 0.01}),
        qualities={"a": 50.0, "b": 50.0},
    )
    picked = multi_factor(REFS[:2], tpot, only_ttft)
    assert picked.ref.model == "a" and picked.scores["b"] == pytest.approx(0.2)
    # observations age out on the clock: no latency for anyone, the stage is skipped
    clock.advance(120.0)
    facts = ObservedFacts(obs, qualities={"a": 50.0, "b": 50.0}, prices={"a": 2.0, "b": 1.0})
    assert multi_factor(REFS[:2], tpot, facts).ref.model == "b"  # cost decides


def test_on_missing_exclude_drops_candidates_without_quality_and_fail_raises() -> None:
    settings = settings_of("balance/medium")
    facts = ObservedFacts(observed(FakeClock()), qualities={"b": 60.0}, prices={"a": 0.1})
    picked = multi_factor(REFS, settings, facts)
    assert picked.ref.model == "b" and set(picked.scores) == {"b"}
    assert "a:no quality for vllm-sr/general@1.0.0" in picked.reason
    # nobody has evidence: mom-v1's on_no_candidates fail
    with pytest.raises(NoCandidates, match="quality evidence dropped every candidate"):
        multi_factor(REFS, settings, ObservedFacts(observed(FakeClock())))
    cheapest = settings_of("balance/medium", on_no_candidates="cheapest")
    lone = ObservedFacts(observed(FakeClock()), prices={"c": 0.5, "a": 1.0})
    assert multi_factor(REFS, cheapest, lone).ref.model == "c"
    # min_score drops a figure below it
    floor = settings_of("balance/medium", quality={"min_score": 70})
    facts = ObservedFacts(observed(FakeClock()), qualities={"a": 65.0, "b": 72.0, "c": 71.0})
    picked = multi_factor(REFS, floor, facts)
    assert set(picked.scores) == {"b", "c"} and "a:quality=65<70" in picked.reason


def test_disable_quality_leaves_the_factor_out_when_a_figure_is_missing() -> None:
    settings = settings_of("balance/medium", quality={"on_missing": "disable_quality"})
    facts = ObservedFacts(
        observed(FakeClock(), ttft={"a": 0.3, "b": 0.1, "c": 0.2}), qualities={"a": 99.0}
    )
    picked = multi_factor(REFS, settings, facts)
    assert picked.ref.model == "b"  # quality ignored: the fastest TTFT wins
    assert picked.scores["a"] == pytest.approx(0.2)  # left at the latency stage, not quality
    # everyone has a figure: quality is used again
    facts.qualities.update({"b": 10.0, "c": 10.0})
    assert multi_factor(REFS, settings, facts).ref.model == "a"


def test_the_weighted_objective_reads_latency_metric_too() -> None:
    block = {"weights": {"quality": 0, "latency": 1, "cost": 0, "load": 0}}
    fast_ttft = {"latency_metric": "ttft", **block}
    settings = parse_settings("multi_factor", fast_ttft)
    assert isinstance(settings, MultiFactorSettings) and not settings.objective.lexicographic
    obs = observed(FakeClock(), tpot={"a": 0.01, "b": 0.05}, ttft={"a": 0.9, "b": 0.1})
    assert multi_factor(REFS[:2], settings, ObservedFacts(obs)).ref.model == "b"
    default = parse_settings("multi_factor", block)
    assert isinstance(default, MultiFactorSettings)
    assert multi_factor(REFS[:2], default, ObservedFacts(obs)).ref.model == "a"  # TPOT first


async def test_a_decision_with_mom_v1s_block_chooses_through_decision_selection() -> None:
    algorithm = copy.deepcopy(BLOCKS["balance/reasoning"])
    decision = {
        "name": "reasoning",
        "modelRefs": [{"model": "a"}, {"model": "b"}, {"model": "c"}],
        "algorithm": algorithm,
    }
    routing = Routing.model_validate({"decisions": [decision]})
    facts = ObservedFacts(
        observed(FakeClock(), tpot={"a": 0.05, "b": 0.02, "c": 0.01}),
        qualities={"a": 90.0, "b": 88.0},  # c has no figure: excluded
    )
    selection = DecisionSelection(routing, facts)
    choice = await selection.choose(routing.decisions[0], "dflt", lambda m: True)
    assert (choice.model, choice.method, choice.fallback) == ("b", "multi_factor", None)
    # b is down: a alone has evidence among the healthy
    down = await selection.choose(routing.decisions[0], "dflt", lambda m: m != "b")
    assert (down.model, down.method) == ("a", "multi_factor")
    # nobody healthy has evidence: mom-v1's on_no_candidates fail, the first modelRef answers
    assert not selection.fallbacks
    none = await selection.choose(routing.decisions[0], "dflt", lambda m: m == "c")
    assert (none.model, none.method) == ("c", "multi_factor")
    assert dict(selection.fallbacks) == {("multi_factor", "reasoning", "selector_error"): 1}
    assert selection.preview(routing.decisions[0]).status == "selected"


def problems_of(block: dict[str, Any]) -> dict[str, str]:
    algorithm = {"type": "multi_factor", "multi_factor": block}
    decision = {"name": "d", "modelRefs": [{"model": "a"}, {"model": "b"}], "algorithm": algorithm}
    return {
        format_path(p.path): p.message for p in routing_local_problems({"decisions": [decision]})
    }


BASE = "routing.decisions[0].algorithm.multi_factor"
LEX = {"strategy": "lexicographic", "priorities": [{"factor": "quality"}]}


@pytest.mark.parametrize(
    ("block", "path", "words"),
    [
        (
            {"objective": {"strategy": "pareto"}},
            "objective.strategy",
            ["'pareto'", "weighted, lexicographic"],
        ),
        (
            {"objective": {"strategy": "weighted", "priorities": [{"factor": "cost"}]}},
            "objective.priorities",
            ["strategy weighted", "only with strategy lexicographic"],
        ),
        (
            {"objective": {"strategy": "lexicographic"}},
            "objective.priorities",
            ["strategy lexicographic", "at least one"],
        ),
        (
            {"objective": {"strategy": "lexicographic", "priorities": [{"factor": "speed"}]}},
            "objective.priorities[0].factor",
            ["'speed'", "quality, latency, cost, load"],
        ),
        (
            {
                "objective": {
                    "strategy": "lexicographic",
                    "priorities": [{"factor": "cost"}, {"factor": "cost"}],
                }
            },
            "objective.priorities[1].factor",
            ["'cost' repeats", "each factor at most once"],
        ),
        (
            {
                "objective": {
                    "strategy": "lexicographic",
                    "priorities": [{"factor": "cost", "tolerance": 1.5}],
                }
            },
            "objective.priorities[0].tolerance",
            ["1.5", "from 0 to 1"],
        ),
        (
            {"objective": LEX, "weights": {"cost": 1}},
            "weights",
            ["{'cost': 1}", "only with the weighted objective"],
        ),
        ({"latency_metric": "e2e"}, "latency_metric", ["'e2e'", "ttft, tpot"]),
        (
            {"quality": {"index": "vllm-sr/general@1.0.0", "on_missing": "ignore"}},
            "quality.on_missing",
            ["'ignore'", "exclude, disable_quality"],
        ),
        ({"quality": {"index": " x "}}, "quality.index", ["' x '", "no surrounding blanks"]),
        (
            {"quality": {"index": "i", "on_missing": "disable_quality", "min_score": 5}},
            "quality.min_score",
            ["5 with on_missing disable_quality", "only with on_missing exclude"],
        ),
        (
            {"quality": {"index": "i", "min_coverage": 2}},
            "quality.min_coverage",
            ["2", "from 0 to 1"],
        ),
        (
            {"expected_output_tokens": 4096},
            "expected_output_tokens",
            ["expected_output_tokens 4096", "not supported", "completion price", "latency_metric"],
        ),
        (
            {"quality": {"index": "i", "source": "x"}},
            "quality.source",
            ["unknown key 'source'", "index, on_missing, min_score, min_coverage"],
        ),
    ],
)
def test_bad_v04_keys_name_field_value_and_what_is_accepted(
    block: dict[str, Any], path: str, words: list[str]
) -> None:
    found = problems_of(block)
    assert list(found) == [f"{BASE}.{path}"], found
    for word in words:
        assert word in found[f"{BASE}.{path}"]
    decision = {
        "name": "d",
        "modelRefs": [{"model": "a"}],
        "algorithm": {"type": "multi_factor", "multi_factor": block},
    }
    with pytest.raises(ValueError):  # the model refuses it too
        Routing.model_validate({"decisions": [decision]})
