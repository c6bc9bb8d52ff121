"""v0.4's renamed fields (config/renames.py): both names read, the v0.4 one current, both
together an error at the old name's path and line."""

from __future__ import annotations

import pytest

from vllm_sr.config.files import effective_dict, parse_config
from vllm_sr.config.renames import RENAMES, Rename, current_name, given
from vllm_sr.errors import ConfigError
from vllm_sr.router.reasoning import effort_for

TEMPLATE = """\
providers:
  defaults:
{defaults}
  models:
    - name: general
      backend_refs: [{{endpoint: 127.0.0.1:8000}}]
    - name: coder
      backend_refs: [{{endpoint: 127.0.0.1:8001}}]
global:
  router: {{enabled: true}}
  model_catalog: {{deployments: {{}}}}
"""


def config_text(**defaults: str) -> str:
    return TEMPLATE.format(defaults="\n".join(f"    {k}: {v}" for k, v in defaults.items()))


def problems_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.yaml")
    return info.value.problems


@pytest.mark.parametrize(
    "defaults",
    [
        {"model": "coder", "reasoning_effort": "high"},
        {"default_model": "coder", "default_reasoning_effort": "high"},
        {"model": "coder", "default_reasoning_effort": "high"},
    ],
    ids=["v0.4", "3d48f8c9", "mixed"],
)
def test_both_names_read_the_same_field(defaults: dict[str, str]) -> None:
    config = parse_config(config_text(**defaults))
    assert config.providers is not None
    d = config.providers.defaults
    assert (d.default_model, d.default_reasoning_effort) == ("coder", "high")
    model = config.providers.models[1]
    assert effort_for([], "coder", model, d) == "high"  # the default effort is acted on


def test_the_v04_name_is_the_one_shown() -> None:
    config = parse_config(config_text(default_model="coder"))
    shown = effective_dict(config)["providers"]["defaults"]
    assert shown["model"] == "coder" and "default_model" not in shown
    for r in RENAMES:
        assert current_name(r.section, r.old) == r.new


@pytest.mark.parametrize("rename", RENAMES, ids=lambda r: r.old)
def test_both_names_together_are_an_error_at_the_old_name(rename: Rename) -> None:
    text = config_text(**{rename.new: "coder", rename.old: "general"})
    (problem,) = problems_of(text)
    assert problem.startswith(f"c.yaml:4: {'.'.join(rename.section)}.{rename.old}: ")
    assert f"'{rename.old}' and '{rename.new}' are both given" in problem
    assert f"preferably {rename.new}" in problem


@pytest.mark.parametrize("key", ["model", "default_model"])
def test_an_unknown_default_model_is_reported_under_the_name_written(key: str) -> None:
    (problem,) = problems_of(config_text(**{key: "nope"}))
    assert problem == (
        f"c.yaml:3: providers.defaults.{key}: 'nope' names no model; accepted: one of "
        "general, coder"
    )


def test_a_missing_default_model_is_named_by_its_current_name() -> None:
    (problem,) = problems_of(config_text(reasoning_effort="low"))
    assert problem == "c.yaml:2: providers.defaults.model: missing; this key is required"


def test_an_unknown_key_offers_the_current_names() -> None:
    (problem,) = problems_of(config_text(model="general", default_modle="x"))
    assert "unknown key 'default_modle'; accepted: model, reasoning_effort," in problem


def test_given_says_which_name_the_file_uses() -> None:
    section = ("providers", "defaults")
    assert given({"default_model": "a"}, section, "model") == ("default_model", "a")
    assert given({"model": "b"}, section, "model") == ("model", "b")
    assert given({}, section, "model") is None
