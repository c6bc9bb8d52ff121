"""The structure signal on upstream's ``structure/request-shape.yaml`` fragment and upstream's
own text-unit and keyword cases: values, matches, confidences, and the load-time rules."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from vllm_sr.config.routing_signals import Signals
from vllm_sr.config.signal_families import StructureSignal
from vllm_sr.router.deterministic import DeterministicSignals
from vllm_sr.router.request_view import RequestView
from vllm_sr.router.structure import keyword_occurrences, text_units

FRAGMENTS = Path(__file__).parents[1] / "fixtures" / "upstream" / "fragments" / "signal"


def fragment(path: str) -> Signals:
    """An upstream fragment's ``routing.signals``, loaded unchanged."""
    doc = yaml.safe_load((FRAGMENTS / path).read_text())
    return Signals.model_validate(doc["routing"]["signals"])


def shape_rules() -> DeterministicSignals:
    return DeterministicSignals(fragment("structure/request-shape.yaml"))


def run(text: str, user_text: str | None = None) -> dict[str, tuple[bool, float, float | None]]:
    view = RequestView(text=text, current_user_text=text if user_text is None else user_text)
    out = shape_rules().evaluate(view)
    return {name: (r.matched, r.confidence, r.value) for (_, name), r in out.items()}


def sigmoid4(d: float) -> float:
    return max(0.5, 1.0 / (1.0 + math.exp(-4.0 * d)))


def test_question_counts_with_full_width_marks() -> None:
    out = run("Why? How？ What? When? Where?")
    assert out["many_questions"] == (True, pytest.approx(sigmoid4(1)), 5.0)
    assert out["at_most_one_question"] == (False, 0.0, 5.0)
    one = run("What is this?")
    assert one["many_questions"][0] is False
    assert one["at_most_one_question"] == (True, 0.5, 1.0)  # on the bound: distance 0
    assert run("Tell me.")["at_most_one_question"] == (True, pytest.approx(sigmoid4(1)), 0.0)


def test_numbered_steps_exist_on_any_line() -> None:
    assert run("Do this:\n  1. open\n2. save")["numbered_steps"] == (True, 1.0, 1.0)
    assert run("version 1.2 is out")["numbered_steps"] == (False, 0.0, 0.0)


def test_first_then_flow_needs_markers_in_order() -> None:
    assert run("First open the file, then save it.")["first_then_flow"][0]
    assert not run("Then save it, first open it.")["first_then_flow"][0]
    assert run("首先打开文件，然后保存")["first_then_flow"][0]
    assert run("FIRST a, NEXT b, FINALLY c")["first_then_flow"][0]  # case-insensitive


def test_constraint_density_counts_bounded_keywords_per_text_unit() -> None:
    out = run("Answer in at most 50 words")  # 6 units, "at most" once
    assert out["constraint_dense"] == (True, pytest.approx(sigmoid4(1 / 6 - 0.08)), 1 / 6)
    # "under" inside "understand" and "within" inside "withinness" do not count.
    assert run("I understand withinness")["constraint_dense"][2] == 0.0
    assert run("最多三点")["constraint_dense"][2] == pytest.approx(1 / 4)  # CJK: no bounds


def test_keyword_set_counts_each_listed_keyword_so_json_twice() -> None:
    # The fragment lists both "json" and "JSON": case-folded, each counts (as upstream).
    assert run("Return JSON")["format_directive_dense"][2] == pytest.approx(2 / 2)


def test_low_question_density() -> None:
    text = "Summarise the following report in plain words for a general audience please"
    assert run(text)["low_question_density"] == (True, pytest.approx(sigmoid4(0.05)), 0.0)
    assert not run("Why? Why?")["low_question_density"][0]


def test_every_rule_records_a_value_even_unmatched() -> None:
    out = run("")
    assert set(out) == {
        "many_questions",
        "at_most_one_question",
        "numbered_steps",
        "first_then_flow",
        "constraint_dense",
        "format_directive_dense",
        "low_question_density",
    }
    assert all(value is not None for _, _, value in out.values())


# upstream's structure_text_test.go cases


@pytest.mark.parametrize(
    ("text", "units"),
    [
        ("please output markdown table", 4),
        ("请用表格输出", 6),
        ("请输出JSON表格", 6),
        ("", 0),
        # Go's IsLetter/IsDigit: "²" (a number, not a decimal digit) splits a run; "ー" is
        # a letter but not Katakana (Common script), so it starts a run of its own.
        ("x²y café", 3),
        ("カー", 2),
        ("한국어 text", 4),
    ],
)
def test_text_units(text: str, units: int) -> None:
    assert text_units(text) == units


def test_keyword_occurrences_cjk_and_mixed_script() -> None:
    text = "请用表格输出，最多三点。"
    assert keyword_occurrences(text, "表格") + keyword_occurrences(text, "最多") == 2
    assert keyword_occurrences("请输出json格式。", "json") == 1  # CJK neighbours do not block
    assert keyword_occurrences("jsonschema output", "json") == 0
    assert keyword_occurrences("json,json json", "json") == 3


def text_bytes_rule(**predicate: float) -> StructureSignal:
    return StructureSignal.model_validate(
        {
            "name": "long_prompt",
            "feature": {"type": "count", "source": {"type": "text_bytes"}},
            "predicate": predicate,
        }
    )


def test_text_bytes_reads_the_current_user_text_in_utf8() -> None:
    sigs = DeterministicSignals(Signals(structure=[text_bytes_rule(gte=6)]))
    key = ("structure", "long_prompt")
    res = sigs.evaluate(RequestView(text="ignored system text", current_user_text="中文"))[key]
    assert res.matched and res.value == 6.0


def test_regex_case_sensitivity() -> None:
    rule = StructureSignal.model_validate(
        {
            "name": "shout",
            "feature": {
                "type": "count",
                "source": {"type": "regex", "pattern": "URGENT", "case_sensitive": True},
            },
        }
    )
    sigs = DeterministicSignals(Signals(structure=[rule]))
    assert sigs.evaluate(RequestView(text="URGENT now"))[("structure", "shout")].matched
    assert not sigs.evaluate(RequestView(text="urgent now"))[("structure", "shout")].matched


@pytest.mark.parametrize(
    ("feature", "predicate", "message"),
    [
        (
            {"type": "exists", "source": {"type": "regex", "pattern": "x"}},
            {"gt": 0},
            "does not accept a predicate",
        ),
        (
            {"type": "sequence", "source": {"type": "regex", "pattern": "x"}},
            None,
            "requires feature.source.type sequence",
        ),
        (
            {"type": "density", "source": {"type": "text_bytes"}},
            None,
            "requires feature.type count",
        ),
        ({"type": "count", "source": {"type": "regex"}}, None, "requires pattern"),
        ({"type": "count", "source": {"type": "keyword_set"}}, None, "requires keywords"),
        (
            {"type": "sequence", "source": {"type": "sequence", "sequences": [["a"]]}},
            None,
            "at least 2 markers",
        ),
        ({"type": "count", "source": {"type": "regex", "pattern": "("}}, None, "does not compile"),
        (
            {"type": "count", "source": {"type": "regex", "pattern": "x"}},
            {"gt": 1, "gte": 2},
            "both gt and gte",
        ),
        (
            {"type": "count", "source": {"type": "regex", "pattern": "x"}},
            {"gt": 3, "lt": 3},
            "empty range",
        ),
        ({"type": "count", "source": {"type": "regex", "pattern": "x"}}, {}, "at least one"),
        (
            {"type": "histogram", "source": {"type": "regex", "pattern": "x"}},
            None,
            "'exists', 'count', 'density' or 'sequence'",
        ),
    ],
)
def test_load_rules_as_upstream(
    feature: dict[str, object], predicate: dict[str, float] | None, message: str
) -> None:
    doc: dict[str, object] = {"name": "r", "feature": feature}
    if predicate is not None:
        doc["predicate"] = predicate
    with pytest.raises(ValidationError) as err:
        StructureSignal.model_validate(doc)
    assert message in str(err.value)


def test_feature_and_source_types_ignore_case_and_space() -> None:
    rule = StructureSignal.model_validate(
        {"name": "r", "feature": {"type": " Count", "source": {"type": "REGEX ", "pattern": "a"}}}
    )
    assert (rule.feature.type, rule.feature.source.type) == ("count", "regex")
