"""What `vllm-sr serve` says when it starts (issue 39, item 6): the banner's curl is a chat in
Router mode (an embedding only in Engine mode), and the curl it prints is one a shell runs."""

from __future__ import annotations

import json
import shlex

import pytest

from vllm_sr.commands import serve
from vllm_sr.config.files import parse_config
from vllm_sr.placement import planner
from vllm_sr.plan import ServicePlan
from vllm_sr.supervisor.service import service_plan

ROUTER = """\
providers:
  defaults: {default_model: general}
  models:
    - {name: general, backend_refs: [{endpoint: "127.0.0.1:8000"}]}
routing:
  signals:
    keywords: [{name: code, keywords: [code]}]
  decisions:
    - name: coding
      rules: {operator: AND, conditions: [{type: keyword, name: code}]}
      modelRefs: [{model: general}]
"""
ENGINE = "global:\n  router: {enabled: false}\n"


def plan_of(text: str) -> ServicePlan:
    config = parse_config(text, "config.yaml")
    return service_plan(config, list(planner.plan(config).replicas))


def banner(
    plan: ServicePlan, capsys: pytest.CaptureFixture[str]
) -> tuple[str, str, dict[str, object]]:
    """(the first line, the curl's URL, its JSON body) of the banner serve prints."""
    serve._announce("127.0.0.1:8080", "/run/vllm-sr/control.sock", plan)
    first, second = capsys.readouterr().err.splitlines()
    argv = shlex.split(second.removeprefix("  try: "))
    assert argv[:2] == ["curl", "-s"] and argv[4] == "Content-Type: application/json"
    return first, argv[2], json.loads(argv[argv.index("-d") + 1])


def test_router_mode_suggests_a_routed_chat(capsys: pytest.CaptureFixture[str]) -> None:
    first, url, body = banner(plan_of(ROUTER), capsys)
    assert first.startswith("vllm-sr: serving on http://127.0.0.1:8080")
    assert url == "http://127.0.0.1:8080/v1/chat/completions"
    assert body == {"model": "vllm-sr/auto", "messages": [{"role": "user", "content": "hello"}]}


def test_router_mode_without_auto_names_uses_an_entrypoint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = ROUTER.replace("providers:", "global:\n  router: {auto_model_names: []}\nproviders:", 1)
    text += "entrypoints:\n  - {model_names: [smart], recipe: default}\n"
    assert banner(plan_of(text), capsys)[2]["model"] == "smart"


def test_engine_mode_suggests_an_embedding(capsys: pytest.CaptureFixture[str]) -> None:
    _, url, body = banner(plan_of(ENGINE), capsys)
    assert url == "http://127.0.0.1:8080/v1/embeddings"
    assert body == {"model": "primary", "input": "hello"}
