"""config.yaml schema: the seed's and DESIGN.md's examples validate; every refusal names the
YAML path, the line, the bad value and what is accepted; all problems come in one run."""

from __future__ import annotations

import pytest

from vllm_sr.config.files import EMBEDDED_DEFAULT_YAML, load_config, parse_config
from vllm_sr.config.schema import Deployment, OutlierDetection, RootConfig
from vllm_sr.errors import ConfigError

SEED_PLACEMENT = """\
global:
  router:
    enabled: false
  model_catalog:
    deployments:
      primary:
        provider: model_runtime
        artifact: vllm-sr/d3-edge
        replicas:
          - device: rocm:0
          - device: rocm:1
    system:
      decision_model:
        deployment: primary
"""

SEED_OUTLIER = """\
global:
  model_catalog:
    deployments:
      primary:
        provider: model_runtime
        artifact: vllm-sr/Vela-2.0-4B
        replicas:
          - device: rocm:0
          - device: rocm:1
        outlier_detection:
          consecutive_timeouts: 3 # default 3; 0 turns ejection off
          base_ejection_ms: 30000 # default 30000
          max_ejection_ms: 300000 # default ten times the base, at most an hour
          max_ejection_percent: 50 # default 50
"""

DESIGN = """\
global:
  router:
    enabled: false            # -e / --engine: Engine mode, routing consumers off
  model_catalog:
    deployments:
      primary:
        provider: model_runtime
        artifact: vllm-sr/d3-edge
        engine_args:          # optional; unset limits are calibrated per worker
          max_num_seqs: 64
          max_num_batched_tokens: 8192
        timeout_ms: 2000      # per exchange with a worker; a caller's deadline can be shorter
        replicas:             # or the one-worker shorthand: device: / endpoint: on the deployment
          - device: rocm:0
          - device: rocm:1
          # - endpoint: http://10.0.0.7:8100   (attached runtime)
          #   model: primary
        outlier_detection:    # every field optional
          consecutive_timeouts: 3
          base_ejection_ms: 30000
          max_ejection_ms: 300000
          max_ejection_percent: 50
    system:
      decision_model:
        deployment: primary
"""


def _problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse_config(text, "config.yaml")
    return exc.value.problems


def _dep(body: str) -> str:
    """A one-deployment config with ``body`` (indented 8) under deployments.primary."""
    return (
        "global:\n  model_catalog:\n    deployments:\n      primary:\n"
        "        artifact: vllm-sr/d3-edge\n" + body
    )


def test_seed_examples_and_design_validate() -> None:
    a = parse_config(SEED_PLACEMENT)
    assert a.global_.router.enabled is False
    assert [r.device for r in a.deployments["primary"].effective_replicas()] == ["rocm:0", "rocm:1"]
    b = parse_config(SEED_OUTLIER)
    od = b.deployments["primary"].outlier_detection
    assert (od.consecutive_timeouts, od.base_ejection_ms, od.max_ejection_ms) == (3, 30000, 300000)
    assert b.global_.router.enabled is True  # the documented default
    c = parse_config(DESIGN)
    d = c.deployments["primary"]
    assert (d.engine_args.max_num_seqs, d.engine_args.max_num_batched_tokens) == (64, 8192)
    assert d.timeout_ms == 2000 and d.platform == "rocm"


def test_embedded_default_is_one_cpu_worker_engine_mode(tmp_path) -> None:
    config = load_config(tmp_path / "missing.yaml")
    assert parse_config(EMBEDDED_DEFAULT_YAML) == config
    dep = config.deployments["primary"]
    assert dep.artifact == "vllm-sr/d3-edge"
    assert [r.device for r in dep.effective_replicas()] == ["cpu"]
    assert config.global_.router.enabled is False
    assert config.default_deployment() == "primary"


def test_outlier_defaults() -> None:
    od = OutlierDetection()
    assert (
        od.consecutive_timeouts,
        od.base_ejection_ms,
        od.max_ejection_ms,
        od.max_ejection_percent,
    ) == (3, 30000, 300000, 50)
    assert OutlierDetection(base_ejection_ms=1000).max_ejection_ms == 10000
    # ten times the base, but at most an hour
    assert OutlierDetection(base_ejection_ms=600_000).max_ejection_ms == 3_600_000
    assert Deployment().timeout_ms == 30000


def test_shorthand_is_one_replica() -> None:
    c = parse_config(_dep("        device: cuda:1\n"))
    assert [r.device for r in c.deployments["primary"].effective_replicas()] == ["cuda:1"]
    c = parse_config(_dep("        endpoint: http://127.0.0.1:8100\n        model: m\n"))
    (r,) = c.deployments["primary"].effective_replicas()
    assert (r.endpoint, r.model) == ("http://127.0.0.1:8100", "m")
    assert c.deployments["primary"].platform is None


@pytest.mark.parametrize(
    ("body", "line", "path", "fragments"),
    [
        (
            "        device: rocm:0\n        replicas:\n          - device: rocm:1\n",
            6,
            "deployments.primary.device",
            ["'rocm:0'", "set together with replicas", "not both"],
        ),
        (
            "        endpoint: http://h:1\n        model: m\n        replicas:\n"
            "          - device: rocm:1\n",
            6,
            "deployments.primary.endpoint",
            ["'http://h:1'", "set together with replicas"],
        ),
        (
            "        replicas:\n          - endpoint: http://10.0.0.7:8100\n",
            7,
            "replicas[0].model",
            ["'http://10.0.0.7:8100'", "has no model", "served model name"],
        ),
        (
            "        replicas:\n          - device: rocm:0\n            model: x\n",
            8,
            "replicas[0].model",
            ["'x'", "only with endpoint"],
        ),
        (
            "        replicas:\n          - device: gpu:0\n",
            7,
            "replicas[0].device",
            ["'gpu:0'", "cpu, rocm:N or cuda:N"],
        ),
        (
            "        replicas:\n          - device: rocm:0\n          - device: cuda:1\n",
            8,
            "replicas[1].device",
            ["'cuda'", "one platform per deployment"],
        ),
        ("        replicas: []\n", 6, "replicas", ["at least 1 item"]),
        (
            "        replicas:\n" + "          - device: cpu\n" * 65,
            6,
            "replicas",
            ["at most 64 item"],
        ),
        ("        provider: ollama\n", 6, "provider", ["'ollama'", "'model_runtime'"]),
        (
            "        engine_args:\n          max_num_seqs: 0\n",
            7,
            "engine_args.max_num_seqs",
            ["0 is not accepted", ">= 1"],
        ),
        (
            "        engine_args:\n          dtype: fp8\n",
            7,
            "engine_args.dtype",
            ["'fp8'", "'auto'", "'float32'", "'bfloat16'", "'float16'"],
        ),
        ("        timeout_ms: fast\n", 6, "timeout_ms", ["'fast'", "an integer"]),
        (
            "        outlier_detection:\n          consecutive_timeouts: -1\n",
            7,
            "consecutive_timeouts",
            ["-1", ">= 0"],
        ),
        (
            "        outlier_detection:\n          max_ejection_percent: 101\n",
            7,
            "max_ejection_percent",
            ["101", "<= 100"],
        ),
        (
            "        outlier_detection:\n          max_ejection_ms: 3600001\n",
            7,
            "max_ejection_ms",
            ["3600001", "<= 3600000"],
        ),
        (
            "        outlier_detection:\n          base_ejection_ms: 5000\n"
            "          max_ejection_ms: 1000\n",
            8,
            "max_ejection_ms",
            ["1000 is below base_ejection_ms 5000"],
        ),
        (
            "        replicas:\n          - device: cpu\n            threads: 4\n",
            8,
            "replicas[0].threads",
            ["unknown key 'threads'", "device, endpoint, model"],
        ),
    ],
)
def test_refusals_name_path_line_value_and_accepted(
    body: str, line: int, path: str, fragments: list[str]
) -> None:
    problems = _problems(_dep(body))
    hit = [p for p in problems if path in p]
    assert hit, problems
    assert hit[0].startswith(f"config.yaml:{line}: global.model_catalog.")
    for fragment in fragments:
        assert fragment in hit[0], hit[0]


@pytest.mark.parametrize(
    ("text", "wanted"),
    [
        (  # a float field whose bound is written ge=0: a number, the bound as validated
            "global:\n  router:\n    learning:\n      protection: {tuning: {switch_margin: -1}}\n",
            "config.yaml:4: global.router.learning.protection.tuning.switch_margin: -1 is not "
            "accepted; accepted: a number >= 0.0",
        ),
        (
            "global:\n  router:\n    learning:\n"
            "      protection: {tuning: {min_turns_before_switch: -1}}\n",
            "config.yaml:4: global.router.learning.protection.tuning.min_turns_before_switch: -1 "
            "is not accepted; accepted: an integer >= 0",
        ),
        (
            "routing:\n  signals:\n    embeddings: [{name: e, threshold: 2, candidates: [a]}]\n",
            "config.yaml:3: routing.signals.embeddings[0].threshold: 2 is not accepted; "
            "accepted: a number <= 1.0",
        ),
        (
            _dep("        outlier_detection:\n          max_ejection_percent: 101\n"),
            "config.yaml:7: global.model_catalog.deployments.primary.outlier_detection."
            "max_ejection_percent: 101 is not accepted; accepted: an integer <= 100",
        ),
    ],
)
def test_a_bound_says_integer_for_int_fields_and_number_for_float_ones(
    text: str, wanted: str
) -> None:
    path = wanted.split(": ")[1]
    assert [p for p in _problems(text) if f": {path}: " in p] == [wanted]


def test_decision_model_must_name_a_deployment() -> None:
    text = _dep("") + "    system:\n      decision_model:\n        deployment: other\n"
    (problem,) = _problems(text)
    assert problem.startswith(
        "config.yaml:8: global.model_catalog.system.decision_model.deployment"
    )
    assert "'other' names no deployment; accepted: one of primary" in problem


def test_every_problem_in_one_run_sorted_by_line() -> None:
    text = (
        "global:\n  router:\n    enabled: maybe\n  model_catalog:\n    deployments:\n"
        "      primary:\n        colour: red\n        device: rocm:0\n        replicas:\n"
        "          - device: tpu:0\n          - endpoint: http://h:1\n"
        "        outlier_detection:\n          max_ejection_percent: 200\n"
        "    system:\n      decision_model:\n        deployment: nope\n"
    )
    problems = _problems(text)
    lines = [int(p.split(":")[1]) for p in problems]
    assert lines == sorted(lines)
    assert lines == [3, 7, 8, 10, 11, 13, 16]


def test_unknown_top_level_key_and_optional_catalog() -> None:
    # model_catalog may be omitted (the embedded default runs); an unknown key still fails,
    # listing upstream's v0.3 top level.
    problems = _problems("global:\n  router: {}\nextra: 1\n")
    assert problems == [
        "config.yaml:3: extra: unknown key 'extra'; accepted: version, listeners, global, "
        "providers, routing, entrypoints, recipes, evaluation"
    ]


def test_yaml_syntax_error_has_a_line() -> None:
    (problem,) = _problems("global:\n  model_catalog:\n    deployments: [\n")
    assert problem.startswith("config.yaml:4: YAML syntax")


def test_duplicate_key_is_refused() -> None:
    (problem,) = _problems(_dep("        artifact: other\n"))
    assert "artifact" in problem and "config.yaml" in problem


def test_empty_file() -> None:
    (problem,) = _problems("")
    assert "must hold a mapping with the key 'global'" in problem


def test_programmatic_construction_applies_the_same_rules() -> None:
    data = {
        "global": {
            "model_catalog": {
                "deployments": {"p": {"device": "cpu", "replicas": [{"device": "cpu"}]}}
            }
        }
    }
    with pytest.raises(ValueError, match="set together with replicas"):
        RootConfig.model_validate(data)


def test_every_field_has_a_docstring() -> None:
    from pydantic import BaseModel

    from vllm_sr.config import deployment, schema

    models = [
        v
        for module in (schema, deployment)
        for v in vars(module).values()
        if isinstance(v, type)
        and issubclass(v, BaseModel)
        and v.__module__ == module.__name__
        and not v.__name__.startswith("_")
    ]
    assert len(models) >= 8
    for model in models:
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring"


@pytest.mark.parametrize(
    ("body", "wanted"),
    [
        (
            "        threads: 4\n        replicas:\n          - device: cuda:1\n",
            "config.yaml:6: global.model_catalog.deployments.primary.threads: threads 4 applies "
            "to CPU workers, but this deployment runs on cuda GPUs (cuda:1); accepted: remove "
            "threads, or place the deployment on cpu",
        ),
        (
            "        threads: 4\n        endpoint: http://10.0.0.7:8100\n        model: m\n",
            "config.yaml:6: global.model_catalog.deployments.primary.threads: threads 4 on a "
            "deployment whose replicas are all attached (endpoint): attached runtimes manage "
            "their own threads; accepted: remove threads",
        ),
        (
            "        threads: 0\n",
            "config.yaml:6: global.model_catalog.deployments.primary.threads: 0 is not "
            "accepted; accepted: an integer >= 1",
        ),
    ],
)
def test_threads_is_refused_where_it_cannot_apply(body: str, wanted: str) -> None:
    assert _problems(_dep(body)) == [wanted]


def test_threads_on_cpu_workers_and_mixed_attached() -> None:
    """Accepted on the default (one CPU worker), and where CPU workers sit beside attached
    runtimes (it sizes only the CPU workers)."""
    assert parse_config(_dep("        threads: 3\n")).deployments["primary"].threads == 3
    mixed = (
        "        threads: 3\n        replicas:\n          - device: cpu\n"
        "          - endpoint: http://10.0.0.7:8100\n            model: m\n"
    )
    assert parse_config(_dep(mixed)).deployments["primary"].threads == 3


@pytest.mark.parametrize(
    ("endpoint", "reason"),
    [
        ("unix://host/run/w.sock", "a Unix socket has none"),
        ("https://user:pw@h:8443", "credentials in the URL are not accepted"),
        ("http://h:70000", "the port is not a number 1-65535"),
    ],
)
def test_an_endpoint_the_client_cannot_serve_is_refused_with_field_and_reason(
    endpoint: str, reason: str
) -> None:
    body = f"        replicas:\n          - endpoint: {endpoint}\n            model: m\n"
    problems = _problems(_dep(body))
    hit = [p for p in problems if "replicas[0].endpoint" in p]
    assert hit and reason in hit[0] and endpoint in hit[0], problems


@pytest.mark.parametrize(
    "endpoint", ["https://h:8443/v1", "unix:/run/w.sock", "unix:///run/w.sock"]
)
def test_https_and_unix_endpoints_validate(endpoint: str) -> None:
    body = f"        replicas:\n          - endpoint: {endpoint}\n            model: m\n"
    parse_config(_dep(body), "config.yaml")
