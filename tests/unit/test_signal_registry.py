"""The signal-family registry (``vllm_sr.config.signal_registry`` and its router half,
``vllm_sr.router.families``): every family has one row, every ``routing.signals`` list maps to
a row, and config validation, declared keys, the CPU step, eval keys and headers read their
names from it."""

from __future__ import annotations

import json
import typing
from collections.abc import Mapping
from typing import get_args

import pytest
import yaml
from pydantic import Field

from tests.unit.test_deployment_needs import MODEL_FREE, NEEDS_MODEL
from vllm_sr.config.problems import format_path
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_rules import check_routing
from vllm_sr.config.routing_signals import KeywordSignal, Signals
from vllm_sr.config.routing_support import support_problems
from vllm_sr.config.routing_tree import LEAF_TYPES
from vllm_sr.config.signal_registry import (
    BY_CONFIG_KEY,
    BY_NAME,
    FAMILIES,
    SUPPORTED_LEAF_TYPES,
    SignalFamily,
    entry_asks_deployment,
)
from vllm_sr.jsontypes import JsonObject
from vllm_sr.router import cpu_signals, families
from vllm_sr.router.answers import answer_headers
from vllm_sr.router.cpu_signals import CpuSignals, cpu_report
from vllm_sr.router.deployment_questions import SignalAnswerError
from vllm_sr.router.eval import grouped
from vllm_sr.router.family_deployment import DeploymentAsk
from vllm_sr.router.family_step import Names, SignalKey, StepReport
from vllm_sr.router.questions import QuestionPlan, declared_keys
from vllm_sr.router.request_view import RequestView
from vllm_sr.router.route import RouteResult
from vllm_sr.router.signals import SignalResult
from vllm_sr.router.signals_heads import Heads

SUPPORTED = [f for f in FAMILIES if f.supported]
REFUSED = [f for f in FAMILIES if not f.supported]


def test_every_family_has_one_row_and_every_leaf_type_is_a_family() -> None:
    names = [f.name for f in FAMILIES]
    assert len(names) == len(set(names))
    leaves = {f.name for f in FAMILIES if f.leaf}
    assert leaves == set(LEAF_TYPES)  # routing_tree's Literal: upstream's leaf types
    assert {f.name for f in FAMILIES if not f.leaf} == {"hallucination"}
    assert len({f.eval_key for f in FAMILIES}) == len(FAMILIES)
    headers = [f.header for f in FAMILIES if f.header is not None]
    assert len(headers) == len(set(headers))


def lists_without_their_row(section: type[Signals]) -> list[str]:
    """The section's lists with no registry row, or whose row names another model."""
    out = []
    for key, field in section.model_fields.items():
        (item,) = typing.get_args(field.annotation)
        row = BY_CONFIG_KEY.get(key)
        untyped_refusal = row is not None and row.model is None and not row.supported
        if row is None or (row.model is not item and not untyped_refusal):
            out.append(key)
    return out


def test_every_config_list_maps_to_a_row_with_its_model() -> None:
    assert lists_without_their_row(Signals) == []
    assert set(Signals.model_fields) == set(BY_CONFIG_KEY)


def test_a_config_list_with_no_row_fails_the_check() -> None:
    class Grown(Signals):
        input_shapes: list[KeywordSignal] = Field(default_factory=list)

    assert lists_without_their_row(Grown) == ["input_shapes"]


def test_rows_without_a_list_are_derived_families() -> None:
    assert [f.name for f in FAMILIES if f.config_key is None] == ["projection"]
    assert BY_NAME["projection"].evaluated == "derived"


def test_every_evaluated_family_is_bound_to_its_evaluator() -> None:
    assert set(families.BINDINGS) == {f.name for f in SUPPORTED}
    for name, binding in families.BINDINGS.items():
        if binding.row.evaluated == "cpu_step":
            assert binding.step is not None, name
        else:  # a DeploymentAsk builder, or what answers it
            assert binding.step is None and (binding.answered_by or binding.deployment), name
        if binding.row.takes_deployment:
            answerer = binding.answered_by or binding.deployment
            assert answerer, f"{name}: entries naming a deployment need an answerer"
    assert set(families.STEP_BUILDERS) == set(families.STEP_FAMILIES)
    assert not {f.name for f in REFUSED} & (set(families.STEP_BUILDERS) | set(families.ANSWERED_BY))


@pytest.mark.parametrize("row", REFUSED, ids=lambda f: f.name)
def test_refused_families_are_refused_by_list_and_leaf_from_the_row(row: SignalFamily) -> None:
    routing = {
        "signals": {row.config_key: [{"name": "x"}]},
        "decisions": [{"name": "d", "rules": {"type": row.name, "name": "x"}}],
    }
    paths = {format_path(p.path): p.message for p in support_problems(routing)}
    assert "not supported by vllm-sr" in paths[f"routing.signals.{row.config_key}"]
    message = paths["routing.decisions[0].rules.type"]
    assert f"the rule leaf type {row.name!r}" in message
    assert ", ".join(SUPPORTED_LEAF_TYPES) in message
    if row.refusal_reason is not None:  # the row's reason, on the list and on the leaf
        assert row.refusal_reason in message
        assert row.refusal_reason in paths[f"routing.signals.{row.config_key}"]


def test_the_decision_family_is_refused_for_the_reason_its_row_gives() -> None:
    assert [f.name for f in FAMILIES if f.refusal_reason] == ["decision"]
    assert "generative decision model" in str(BY_NAME["decision"].refusal_reason)


@pytest.mark.parametrize("row", [f for f in FAMILIES if f.takes_deployment], ids=lambda f: f.name)
def test_deployment_names_are_checked_for_the_rows_that_take_one(row: SignalFamily) -> None:
    assert row.config_key is not None
    routing = {"signals": {row.config_key: [{"name": "x", "deployment": "nowhere"}]}}
    paths = {format_path(p.path) for p in check_routing(None, routing, {"primary"}, "primary")}
    assert f"routing.signals.{row.config_key}[0].deployment" in paths


def unset_deployment_paths(routing: JsonObject, system: JsonObject | None = None) -> set[str]:
    """The entries flagged for asking the decision model's deployment, which is not declared."""
    found = check_routing(None, routing, {"other"}, "primary", system)
    return {format_path(p.path) for p in found if "decision model's deployment" in p.message}


@pytest.mark.parametrize("row", [f for f in FAMILIES if f.takes_deployment], ids=lambda f: f.name)
def test_an_entry_naming_no_deployment_asks_what_its_row_says(row: SignalFamily) -> None:
    assert row.config_key is not None
    path = f"routing.signals.{row.config_key}[0]"
    entry = {"name": "x", "labels": ["violence"]} if row.name == "classifier" else {"name": "x"}
    routing: JsonObject = {"signals": {row.config_key: [entry]}}
    flagged = unset_deployment_paths(routing)
    if not entry_asks_deployment(row, None):  # pii: the CPU step
        assert flagged == set()
        return
    assert flagged == {path}  # the decision model's deployment, which does not exist
    if row.unset_deployment == "system_safety":
        assert unset_deployment_paths(routing, {"safety": "other"}) == set()
    if row.unset_deployment == "model_binding":
        bound = {**routing, "model_bindings": {"classifier.x": {"deployment": "other"}}}
        assert unset_deployment_paths(bound) == set()
        undeclared = {**routing, "model_bindings": {"classifier.x": {"deployment": "hazard"}}}
        assert unset_deployment_paths(undeclared) == {path}  # bound only to a declared one
    found = check_routing(None, routing, {"other"}, "primary")
    (message,) = [p.message for p in found if "decision model" in p.message]
    alternative = {
        "decision_model": "one of other",
        "system_safety": "one of other, or global.model_catalog.system.safety",
        "model_binding": "one of other, or routing.model_bindings['classifier.x'].deployment",
    }[row.unset_deployment]
    assert message.endswith(alternative)


@pytest.mark.parametrize("row", [f for f in FAMILIES if f.leaf_names_checked], ids=lambda f: f.name)
def test_leaf_names_are_checked_against_the_rows_list(row: SignalFamily) -> None:
    routing = {"decisions": [{"name": "d", "rules": {"type": row.name, "name": "ghost"}}]}
    problems = {format_path(p.path): p.message for p in check_routing(None, routing, set(), "")}
    message = problems["routing.decisions[0].rules.name"]
    assert f"routing.signals.{row.config_key}" in message


def test_declared_keys_cover_every_evaluated_list() -> None:
    entries = {**MODEL_FREE, **NEEDS_MODEL}
    raw = {"signals": {key: [entry] for key, entry in entries.items()}, "decisions": []}
    routing = Routing.model_validate(yaml.safe_load(yaml.safe_dump(raw)))
    kinds = {kind for kind, _ in declared_keys(routing)}
    listed = {f.name for f in SUPPORTED if f.config_key in entries}
    assert listed == {f.name for f in SUPPORTED if f.config_key is not None}
    assert kinds == listed
    assert ("authz", entries["role_bindings"]["role"]) in declared_keys(routing)


def test_eval_keys_and_debug_headers_come_from_the_rows() -> None:
    matched = tuple(sorted(f"{f.name}:n" for f in SUPPORTED))
    headers = answer_headers(RouteResult(model="m", matched_signals=matched), debug=True)
    for row in SUPPORTED:
        if row.header is not None:
            assert headers[f"x-vsr-matched-{row.header}"] == "n", row.name
    sent = {h.removeprefix("x-vsr-matched-") for h in headers if h.startswith("x-vsr-matched-")}
    assert sent - {"signals"} == {f.header for f in SUPPORTED if f.header is not None}
    assert grouped({(f.name, "n") for f in SUPPORTED}) == {f.eval_key: ["n"] for f in SUPPORTED}


class ShoutFamily:
    """A family the registry does not have: the CPU step runs any bound StepFamily."""

    family = "shout"
    heavy = False
    loaded = True

    def load(self) -> None:
        pass

    def keys(self, names: Names | None) -> set[SignalKey]:
        return {("shout", "loud")}

    def evaluate(self, view: RequestView, names: Names | None, out: StepReport) -> float:
        hit = view.text.isupper()
        out.results[("shout", "loud")] = SignalResult(hit, 1.0 if hit else 0.0)
        return 1.0


def test_a_bound_step_family_runs_in_the_cpu_step(monkeypatch: pytest.MonkeyPatch) -> None:
    steps = {**families.STEP_BUILDERS, "shout": lambda signals: ShoutFamily()}
    monkeypatch.setattr(cpu_signals, "STEP_BUILDERS", steps)
    monkeypatch.setattr(cpu_signals, "STEP_FAMILIES", (*families.STEP_FAMILIES, "shout"))
    cpu = CpuSignals.build(Signals(), {("shout", "loud")})
    assert cpu.keys() == {("shout", "loud")}
    report = cpu_report(cpu, RequestView(text="HELLO THERE"))
    assert report.results[("shout", "loud")].matched
    assert report.family_confidence == {"shout": 1.0} and "shout" in report.timings_ms
    assert not cpu_report(cpu, RequestView(text="hello")).results[("shout", "loud")].matched
    # an unreferenced family is not built
    assert not CpuSignals.build(Signals(), {("keyword", "x")}).any


def test_evaluated_kinds_are_literal_values() -> None:
    from vllm_sr.config.signal_registry import Evaluated

    assert {f.evaluated for f in FAMILIES} == set(get_args(Evaluated))


class EchoAsk:
    """A made-up deployment family: one classify-style task, matched when its head says yes."""

    family = "echo"
    shares_query = False

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def signal_keys(self) -> list[SignalKey]:
        return [("echo", n) for n in self.names]

    def tasks(self, view: RequestView) -> list[JsonObject]:
        return [{"id": "echo", "classify": {"input": [view.text]}}]

    def results(
        self, answers: Mapping[str, object], view: RequestView
    ) -> dict[SignalKey, SignalResult]:
        body = answers.get("echo")
        if not isinstance(body, dict) or not isinstance(body.get("yes"), bool):
            raise ValueError("no echo answer")
        return {k: SignalResult(body["yes"], 1.0) for k in self.signal_keys()}


def echo_builder(
    signals: Signals, referenced: frozenset[SignalKey], decision: str
) -> dict[str, DeploymentAsk]:
    return {"echoer": EchoAsk(sorted(n for kind, n in referenced if kind == "echo"))}


def test_a_bound_deployment_family_is_asked_in_the_bundle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    row = SignalFamily("echo", None, None, "echo", None, "deployment", takes_deployment=True)
    monkeypatch.setattr(families, "FAMILIES", (*FAMILIES, row))
    monkeypatch.setattr(families, "DEPLOYMENT_BUILDERS", {"echo": echo_builder})
    monkeypatch.setattr(families, "BINDINGS", families._bind())
    assert families.BINDINGS["echo"].deployment is echo_builder
    routing = Routing.model_validate({"decisions": []})
    plan = QuestionPlan(routing, "primary", wanted={("echo", "e1")})
    dq = plan.deployments["echoer"]
    assert dq.signal_keys() == [("echo", "e1")] and dq.kinds() == ["echo"]
    view = RequestView(text="hello")
    sent = json.loads(dq.bundle("hello", view))
    assert {"id": "echo", "classify": {"input": ["hello"]}} in sent["tasks"]

    def answer(body: object) -> bytes:
        results = [{"id": "echo", "status": 200, "body": body}]
        if not dq.cached:
            results.append({"id": "candidates", "status": 200, "body": {"data": []}})
        return json.dumps({"results": results}).encode()

    assert dq.read(answer({"yes": True}), view=view)[("echo", "e1")].matched
    assert not dq.read(answer({"yes": False}), view=view)[("echo", "e1")].matched
    with pytest.raises(SignalAnswerError, match="echo family"):
        dq.read(answer({}), view=view)
    # unreferenced: not asked anywhere
    assert "echoer" not in QuestionPlan(routing, "primary", wanted={("keyword", "x")}).deployments


def test_the_families_a_head_answers_bind_their_part_of_the_heads() -> None:
    headed = {name for name, b in families.BINDINGS.items() if Heads in b.answered_by}
    assert headed == set(families.HEAD_BUILDERS)
    for name in headed:
        assert families.BINDINGS[name].heads is families.HEAD_BUILDERS[name], name
        assert families.BINDINGS[name].row.takes_deployment, name


def test_two_families_on_one_head_share_the_deployments_classify_task() -> None:
    routing = Routing.model_validate(
        {
            "signals": {
                "jailbreak": [{"name": "jb", "method": "classifier", "deployment": "guard"}],
                "safety": [{"name": "unsafe", "deployment": "guard"}],
                "pii": [{"name": "ids", "deployment": "guard"}],
            },
            "decisions": [],
        }
    )
    wanted = {("jailbreak", "jb"), ("safety", "unsafe"), ("pii", "ids")}
    plan = QuestionPlan(routing, "primary", wanted=wanted)
    assert set(plan.deployments) == {"guard"}
    dq = plan.deployments["guard"]
    assert set(dq.signal_keys()) == wanted and dq.asks == []
    sent = json.loads(dq.bundle("hi", RequestView(text="hi")))
    assert [t["id"] for t in sent["tasks"]] == ["classify"]
    # unreferenced: no part of the head
    only_jb = QuestionPlan(routing, "primary", wanted={("jailbreak", "jb")})
    assert only_jb.deployments["guard"].signal_keys() == [("jailbreak", "jb")]


@pytest.mark.parametrize("row", [f for f in FAMILIES if f.takes_deployment], ids=lambda f: f.name)
def test_an_entry_naming_a_deployment_is_asked_there_by_its_binding(row: SignalFamily) -> None:
    assert row.config_key is not None and row.leaf_names is not None
    entry = {**{**MODEL_FREE, **NEEDS_MODEL}[row.config_key], "deployment": "guard"}
    routing = Routing.model_validate({"signals": {row.config_key: [entry]}, "decisions": []})
    wanted = {(row.name, name) for name in row.leaf_names(routing.signals)}
    plan = QuestionPlan(routing, "primary", wanted=wanted)
    assert set(plan.deployments) == {"guard"}  # its head, its ask or its embedding question
    assert wanted <= set(plan.deployments["guard"].signal_keys())
