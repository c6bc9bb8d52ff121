"""Upstream v0.3 files: the file shape outside routing (version, listeners, global, entrypoints,
recipes) loads; what vllm-sr does not act on is refused by name ("not supported by vllm-sr",
naming what is supported), every refusal in one run, each at its YAML path and line; the
embedded default runs when no deployment is declared; recipes are selected by request model.

Fixtures under tests/fixtures/upstream/ are upstream's own files (see its README)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from vllm_sr.cli import main
from vllm_sr.config.files import effective_dict, parse_config
from vllm_sr.config.schema import RootConfig, semantic_problems
from vllm_sr.errors import ConfigError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "upstream"
NOT_SUPPORTED = "not supported by vllm-sr"
RECIPES = sorted(p.parent.name for p in (FIXTURES / "recipes").glob("*/config.yaml"))

PROVIDERS = """\
providers:
  defaults:
    default_model: small
  models:
    - name: small
      backend_refs:
        - endpoint: 127.0.0.1:8000
    - name: big
      backend_refs:
        - endpoint: 127.0.0.1:8001
"""

ROUTING = """\
routing:
  signals:
    keywords:
      - name: code
        operator: OR
        keywords: [code]
  decisions:
    - name: coding
      priority: 10
      rules:
        operator: AND
        conditions:
          - type: keyword
            name: code
      modelRefs:
        - model: big
"""


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


# Upstream's reference file writes `method: fuzzy` on a keyword rule, which upstream's own
# keyword constructor rejects (fuzzy is `fuzzy_match: true`): an invalid value, not a feature.
UPSTREAM_INVALID = "routing.signals.keywords[3].method: 'fuzzy' is not accepted"


def _problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_config(textwrap.dedent(text))
    return list(err.value.problems)


def _load(text: str) -> RootConfig:
    return parse_config(textwrap.dedent(text))


# -- upstream's own files ----------------------------------------------------------------------


def _upstream_problems(path: Path) -> list[str]:
    try:
        parse_config(path.read_text(encoding="utf-8"), str(path))
    except ConfigError as exc:
        return list(exc.problems)
    return []


@pytest.mark.parametrize("recipe", RECIPES)
def test_each_upstream_recipe_loads_or_is_refused_only_by_name(recipe: str) -> None:
    problems = _upstream_problems(FIXTURES / "recipes" / recipe / "config.yaml")
    shape = [p for p in problems if NOT_SUPPORTED not in p]
    assert shape == [], f"{recipe}: refused for the file's shape, not a feature"
    for p in problems:
        assert "; supported: " in p  # each refusal names what is supported instead


def test_balance_recipe_has_no_refusals() -> None:
    """Its providers' reliability blocks (retries, ejection, health checks) and its Router
    Learning (protection on, adaptation off) are acted on: nothing is refused."""
    problems = _upstream_problems(FIXTURES / "recipes" / "balance" / "config.yaml")
    assert problems == []


def test_upstream_reference_config_lists_every_refusal_in_one_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = FIXTURES / "config.yaml"
    code, _, err = _run(["config", "validate", "--config", str(path)], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0
    invalid = [line for line in lines if NOT_SUPPORTED not in line]
    assert len(invalid) == 1 and UPSTREAM_INVALID in invalid[0], invalid
    text = path.read_text(encoding="utf-8").splitlines()

    def line_no(hit: str) -> int:
        return int(hit.split(f"{path}:", 1)[1].split(":", 1)[0])

    expected = {
        "global.services.response_api.redis.config_path": (
            "config_path: config/backends/response-api-redis.yaml"
        ),
        "global.services.authz.providers": "providers:",
        "global.services.ratelimit.providers": "providers:",
        "global.stores.memory.enabled": "enabled: true",
        "global.stores.vector_store.enabled": "enabled: true",
        "global.model_catalog.modules.prompt_compression.enabled": "enabled: true",
    }
    for field, source in expected.items():
        (hit,) = [line for line in lines if f": {field}: " in line]
        assert text[line_no(hit) - 1].strip() == source, (field, hit)
    # every looper passes upstream's checks and runs in vllm-sr: none is refused at its type
    # or in its block (the confidence block's tool_call_args token filter aside)
    algorithms = [line for line in lines if ".algorithm.type: " in line]
    refused = {text[line_no(hit) - 1].strip().removeprefix("type: ") for hit in algorithms}
    assert not refused & {"confidence", "ratings", "remom", "fusion", "workflows"}
    blocks = (".algorithm.ratings", ".algorithm.remom", ".algorithm.fusion", ".algorithm.workflows")
    assert not [line for line in lines if any(b in line for b in blocks)]
    numbers = [line_no(hit) for hit in lines]
    assert numbers == sorted(numbers)


def test_upstream_reference_config_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(FIXTURES / "config.yaml")
    code, out, _ = _run(["config", "validate", "--json", "--config", path], capsys)
    answer = json.loads(out)
    assert code != 0 and answer["valid"] is False
    problems = answer["problems"]
    assert len(problems) > 30  # every refusal in one run (fewer as more is acted on)
    assert [p for p in problems if NOT_SUPPORTED not in p and UPSTREAM_INVALID not in p] == []


# The families issue 24 built (the other fragments are tested in test_routing_schema.py).
DETERMINISTIC = ("authz", "context", "conversation", "keyword", "language", "metadata", "structure")
FRAGMENTS = sorted(
    str(p.relative_to(FIXTURES / "fragments"))
    for family in DETERMINISTIC
    for p in (FIXTURES / "fragments" / "signal" / family).rglob("*.yaml")
)


@pytest.mark.parametrize("fragment", FRAGMENTS)
def test_each_signal_fragment_loads_unchanged(fragment: str) -> None:
    text = (FIXTURES / "fragments" / fragment).read_text(encoding="utf-8")
    config = parse_config(PROVIDERS + text, fragment)
    assert config.routing is not None


# -- the embedded default ----------------------------------------------------------------------


# A routing with a signal a deployment answers (keywords alone need no model: no worker runs,
# tests/unit/test_deployment_needs.py).
ROUTING_EMBEDDING = ROUTING.replace(
    "  signals:\n",
    "  signals:\n    embeddings:\n      - {name: billing, threshold: 0.6, candidates: [refund]}\n",
)


def test_without_model_catalog_the_embedded_default_runs() -> None:
    config = _load(PROVIDERS + ROUTING_EMBEDDING)
    assert config.uses_embedded_default
    assert list(config.deployments) == ["primary"]
    dep = config.deployments["primary"]
    assert dep.artifact == "vllm-sr/d3-edge"
    assert [r.device for r in dep.effective_replicas()] == ["cpu"]
    assert config.default_deployment() == "primary"
    shown = effective_dict(config)["global"]["model_catalog"]["deployments"]
    assert shown == {"primary": shown["primary"]}
    assert shown["primary"]["replicas"] == [{"device": "cpu"}]


def test_a_catalog_without_deployments_is_the_embedded_default_too() -> None:
    config = _load("global:\n  model_catalog:\n    system: {}\n" + PROVIDERS + ROUTING_EMBEDDING)
    assert config.uses_embedded_default and list(config.deployments) == ["primary"]


def test_declared_deployments_are_not_the_embedded_default() -> None:
    config = _load(
        """\
        global:
          model_catalog:
            deployments:
              edge: {device: cpu}
        """
    )
    assert not config.uses_embedded_default
    assert list(config.deployments) == ["edge"] and config.default_deployment() == "edge"


def test_programmatic_config_without_catalog() -> None:
    config = RootConfig.model_validate({"global": {"router": {"enabled": False}}})
    assert config.uses_embedded_default and config.default_deployment() == "primary"


def test_the_embedded_default_is_what_signals_and_the_decision_model_name() -> None:
    ok = _load(
        PROVIDERS
        + textwrap.dedent(
            """\
        global:
          model_catalog:
            system:
              decision_model: {deployment: primary}
        routing:
          signals:
            embeddings:
              - {name: e, threshold: 0.5, candidates: [x], deployment: primary}
        """
        )
    )
    assert ok.default_deployment() == "primary"
    problems = _problems(
        PROVIDERS
        + textwrap.dedent(
            """\
        global:
          model_catalog:
            system:
              decision_model: {deployment: gpu}
        routing:
          signals:
            embeddings:
              - {name: e, threshold: 0.5, candidates: [x], deployment: gpu}
        """
        )
    )
    assert any(
        "global.model_catalog.system.decision_model.deployment: 'gpu' names no deployment; "
        "accepted: one of primary (the embedded default" in p
        for p in problems
    )
    assert any(
        "routing.signals.embeddings[0].deployment: 'gpu' names no deployment" in p for p in problems
    )


def test_a_file_with_nothing_to_run_is_refused() -> None:
    (problem,) = _problems("version: v0.3\n")
    assert "none of global, routing, providers or recipes" in problem


# -- the top level: version, listeners -------------------------------------------------------


def test_listeners_give_the_listen_address() -> None:
    config = _load(
        """\
        version: v0.3
        listeners:
          - {name: http-8899, address: 0.0.0.0, port: 8899, timeout: 300s}
          - {name: other, address: 127.0.0.1, port: 9000}
        global: {}
        """
    )
    assert config.version == "v0.3"
    assert config.listen_address() == ("0.0.0.0", 8899)
    assert _load("global: {}\n").listen_address() is None


def test_bad_listener_fields_are_refused_at_their_lines() -> None:
    problems = _problems(
        """\
        global: {}
        listeners:
          - name: a
            port: 70000
            timeout: soon
            tls: true
        """
    )
    assert any(p.startswith("config.yaml:4: listeners[0].port: 70000") for p in problems)
    assert any(p.startswith("config.yaml:5: listeners[0].timeout: 'soon'") for p in problems)
    assert any(
        p.startswith(
            "config.yaml:6: listeners[0].tls: unknown key 'tls'; accepted: name, "
            "address, port, timeout, api_keys"
        )
        for p in problems
    )


def test_unknown_keys_deep_in_global_still_fail_with_path_and_line() -> None:
    problems = _problems(
        """\
        global:
          services:
            authz:
              identity:
                user_header: x-user
            observability:
              tracing:
                exporter: {type: otlp, endpont: "jaeger:4317"}
          router:
            learning:
              protection: {tuning: {switch_margn: 0.1}}
          integrations:
            looper:
              endpont: ""
        """
    )
    assert problems == [
        "config.yaml:5: global.services.authz.identity.user_header: unknown key "
        "'user_header'; accepted: user_id_header, user_groups_header",
        "config.yaml:8: global.services.observability.tracing.exporter.endpont: unknown key "
        "'endpont'; accepted: type, endpoint, insecure",
        "config.yaml:11: global.router.learning.protection.tuning.switch_margn: unknown key "
        "'switch_margn'; accepted: idle_timeout_seconds, min_turns_before_switch, switch_margin, "
        "stability_weight, progress_gate",
        "config.yaml:14: global.integrations.looper.endpont: unknown key 'endpont'; accepted: "
        "endpoint, grpc_max_msg_size_mb, max_response_bytes_mb, timeout_seconds, retry_count, "
        "headers, remom, fusion, flow",
    ]


def test_authz_identity_is_typed_with_upstream_defaults() -> None:
    authz = _load("global: {}\n").global_.services.authz
    assert (authz.identity.user_id_header, authz.identity.user_groups_header) == (
        "x-authz-user-id",
        "x-authz-user-groups",
    )
    assert authz.fail_open is False
    custom = _load(
        """\
        global:
          services:
            authz:
              fail_open: true
              identity: {user_id_header: x-user-id, user_groups_header: x-user-groups}
        """
    ).global_.services.authz
    assert custom.fail_open and custom.identity.user_id_header == "x-user-id"


# -- global.router: aliases and strategy -----------------------------------------------------


@pytest.mark.parametrize(
    ("router", "names"),
    [
        ("{}", ["vllm-sr/auto", "auto", "MoM"]),
        ("{auto_model_name: reference}", ["vllm-sr/auto", "auto", "reference"]),
        ("{auto_model_name: x, auto_model_names: [' a ', a, b]}", ["a", "b"]),
        ("{auto_model_names: []}", []),
    ],
)
def test_auto_model_names_as_upstream(router: str, names: list[str]) -> None:
    config = _load(f"global:\n  router: {router}\n")
    assert config.global_.router.auto_model_names == names


def test_strategy_inheritance() -> None:
    base = PROVIDERS + ROUTING + "recipes:\n  - name: r\n    routing: {}\n"
    config = _load("global:\n  router: {strategy: confidence}\n" + base)
    by_name = config.recipes_by_name()
    assert by_name["default"].strategy == "confidence"
    assert by_name["r"].strategy == "confidence"
    top = _load(
        "global:\n  router: {strategy: confidence}\n"
        + PROVIDERS
        + ROUTING.replace("routing:\n", "routing:\n  strategy: priority\n")
        + "recipes:\n  - name: r\n    routing: {}\n"
        + "  - name: s\n    routing: {strategy: confidence}\n"
    ).recipes_by_name()
    assert (top["default"].strategy, top["r"].strategy, top["s"].strategy) == (
        "priority",
        "priority",
        "confidence",
    )


# -- recipes and entrypoints -------------------------------------------------------------------

RECIPE_FILE = (
    PROVIDERS
    + ROUTING
    + """\
entrypoints:
  - model_names: [vllm-sr/privacy, " private "]
    recipe: privacy
  - model_names: [vllm-sr/main]
    recipe: default
recipes:
  - name: privacy
    description: Local only.
    routing:
      signals:
        keywords:
          - {name: secret, operator: OR, keywords: [ssn]}
      decisions:
        - name: local
          rules:
            operator: OR
            conditions:
              - {type: keyword, name: secret}
          modelRefs:
            - model: small
"""
)


def test_recipe_selection_by_request_model() -> None:
    config = _load(RECIPE_FILE)
    assert config.recipe_name_for("auto") == "default"
    assert config.recipe_name_for("vllm-sr/main") == "default"
    assert config.recipe_name_for("private") == "privacy"
    assert config.recipe_name_for("big") is None
    default, privacy = config.recipe_for("MoM"), config.recipe_for("vllm-sr/privacy")
    assert default is not None and [d.name for d in default.decisions] == ["coding"]
    assert privacy is not None and [d.name for d in privacy.decisions] == ["local"]
    assert config.recipe_for("small") is None


def test_recipes_only_layout_uses_the_recipe_named_default() -> None:
    text = RECIPE_FILE.replace(ROUTING, "").replace("name: privacy\n", "name: default\n")
    text = text.replace("recipe: privacy", "recipe: default")
    config = _load(text)
    default = config.recipe_for("auto")
    assert default is not None and [d.name for d in default.decisions] == ["local"]


def test_recipe_and_entrypoint_rules_are_reported_in_one_run() -> None:
    problems = _problems(
        PROVIDERS
        + ROUTING
        + textwrap.dedent(
            """\
        entrypoints:
          - model_names: [big]
            recipe: nowhere
          - model_names: [auto, vllm-sr/remom]
            recipe: default
          - model_names: [fresh, fresh]
            recipe: default
        recipes:
          - name: default
            routing: {}
          - name: twice
            routing:
              modelCards: [{name: big}]
          - name: twice
            routing:
              decisions:
                - name: d
                  rules:
                    operator: AND
                    conditions:
                      - {type: keyword, name: nope}
                  modelRefs:
                    - model: big
        global:
          integrations:
            looper:
              remom: {model_names: [vllm-sr/remom]}
        """
        )
    )
    wanted = [
        "entrypoints[0].recipe: 'nowhere' names no recipe; accepted: one of default, twice",
        "entrypoints[0].model_names[0]: 'big' is already a configured model",
        "entrypoints[1].model_names[0]: 'auto' is already an auto alias",
        "entrypoints[1].model_names[1]: 'vllm-sr/remom' is already a looper slug",
        "entrypoints[2].model_names[1]: 'fresh' is already mapped by entrypoints[2]",
        "recipes[0].name: recipe 'default' conflicts with the top-level routing profile",
        "recipes[1].routing.modelCards: the model catalog is shared",
        "recipes[2].name: recipe name 'twice' is used twice",
        "recipes[2].routing.decisions[0].rules.conditions[0].name: keyword signal 'nope' is "
        "not declared",
    ]
    for text in wanted:
        assert any(text in p for p in problems), (text, problems)


# -- refusals ----------------------------------------------------------------------------------

REFUSED = [
    ("router:\n    skip_processing: {enabled: true}", "global.router.skip_processing.enabled"),
    ("router:\n    config_source: kubernetes", "global.router.config_source"),
    (
        "services:\n    response_api: {redis: {address: 'r:1', cluster_mode: true}}",
        "global.services.response_api.redis.cluster_mode",
    ),
    (
        "services:\n    response_api: {redis: {address: 'r:1', tls_enabled: true}}",
        "global.services.response_api.redis.tls_enabled",
    ),
    (
        "services:\n    response_api: {redis: {address: 'r:1', config_path: r.yaml}}",
        "global.services.response_api.redis.config_path",
    ),
    (
        "services:\n    router_replay: {enabled: true, store_backend: milvus}",
        "global.services.router_replay.store_backend",
    ),
    (
        "services:\n    router_replay:\n      qdrant: {host: q}",
        "global.services.router_replay.qdrant",
    ),
    (
        "services:\n    ratelimit:\n      providers: [{type: local-limiter}]",
        "global.services.ratelimit.providers",
    ),
    (
        "services:\n    authz:\n      providers: [{type: header-injection}]",
        "global.services.authz.providers",
    ),
    ("stores:\n    memory: {enabled: true}", "global.stores.memory.enabled"),
    ("stores:\n    vector_store: {enabled: true}", "global.stores.vector_store.enabled"),
    (
        "model_catalog:\n    modules:\n      prompt_compression: {enabled: true, max_tokens: 512}",
        "global.model_catalog.modules.prompt_compression.enabled",
    ),
]

ACCEPTED = [
    "router:\n    skip_processing: {enabled: false}\n    learning: {enabled: false}",
    "router:\n    learning: {enabled: true, state_store: {backend: redis, redis: {address: r:1}}}",
    "router:\n    config_source: file\n    streamed_body: {enabled: true, max_bytes: 1}",
    "router:\n    model_selection: {enabled: true, method: hybrid, hybrid: {cost_weight: 0.1}}",
    "services:\n    response_api: {enabled: false, store_backend: redis}\n"
    "    observability: {tracing: {enabled: true}}\n"
    "    management_api: {bind_address: 127.0.0.1, port: 8080}",
    "services:\n    response_api: {store_backend: memory, ttl_seconds: 60, max_responses: 5}",
    "services:\n    response_api:\n      redis: {address: 'redis:6379', db: 1,\n"
    "              tls_enabled: false, cluster_addresses: ['a:1'], config_path: ''}",
    "services:\n    response_api:\n      {enabled: false, redis: {cluster_mode: true}}\n"
    "    observability: {tracing: {enabled: true}}\n"
    "    management_api: {bind_address: 127.0.0.1, port: 8080}",
    "services:\n    ratelimit: {fail_open: true, providers: []}",
    "services:\n    router_replay:\n      enabled: true\n      store_backend: postgres\n"
    "      postgres: {host: postgres, database: vsr, user: router, table_name: rr}\n"
    "      milvus: {address: 'milvus:19530'}",
    "services:\n    router_replay: {enabled: true, redis: {address: 'redis:6379', db: 2}}",
    "stores:\n    memory: {enabled: false, backend: milvus}\n"
    "    vector_store: {enabled: false}\n    response_cache: {enabled: true}",
    "integrations:\n    tools: {enabled: true, top_k: 3}",
    "model_catalog:\n    modules:\n      prompt_compression: {enabled: true, max_tokens: 0}",
    "model_catalog:\n    embeddings:\n      semantic:\n        embedding_config:\n"
    "          enable_soft_matching: true\n          top_k: 1",
    # upstream's default store: Redis, its address the host's own (localhost:6379)
    "services:\n    response_api: {enabled: true}",
]


@pytest.mark.parametrize(("snippet", "path"), REFUSED)
def test_refused_global_settings(snippet: str, path: str) -> None:
    problems = _problems(PROVIDERS + ROUTING + f"global:\n  {snippet}\n")
    (hit,) = [p for p in problems if f": {path}: " in p]
    assert NOT_SUPPORTED in hit and "; supported: " in hit
    assert problems == [hit]


@pytest.mark.parametrize("snippet", ACCEPTED)
def test_accepted_global_settings(snippet: str) -> None:
    assert _load(PROVIDERS + ROUTING + f"global:\n  {snippet}\n").providers is not None


def test_response_cache_without_decisions_is_refused() -> None:
    (problem,) = _problems(PROVIDERS + "global:\n  stores:\n    response_cache: {enabled: true}\n")
    assert "global.stores.response_cache.enabled" in problem and NOT_SUPPORTED in problem


EMBEDDING_ROUTING = """\
routing:
  signals:
    embeddings:
      - {name: e, threshold: 0.5, candidates: [hello]}
global:
  model_catalog:
    embeddings:
      semantic:
        embedding_config:
          enable_soft_matching: true
          top_k: 1
          prototype_scoring: {enabled: true, max_prototypes: 8}
"""


def test_embedding_matching_options_are_acted_on() -> None:
    """Upstream's embedding_config loads (no refusal) and reaches the router's options."""
    from vllm_sr.router.embedding_matching import EmbeddingMatching

    loaded = _load(PROVIDERS + EMBEDDING_ROUTING)
    matching = EmbeddingMatching.of(loaded.global_)
    assert (matching.top_k, matching.soft_matching, matching.min_score) == (1, True, 0.5)
    assert matching.prototypes.enabled and matching.prototypes.max_prototypes == 8
    written = EMBEDDING_ROUTING.replace("true", "false").replace("top_k: 1", "top_k: 0")
    written = written.replace("top_k: 0", "top_k: 0\n          min_score_threshold: 0.3")
    matching = EmbeddingMatching.of(_load(PROVIDERS + written).global_)
    assert (matching.top_k, matching.soft_matching, matching.min_score) == (0, False, 0.3)
    assert not matching.prototypes.enabled


def _looper_decision(kind: str, models: list[str]) -> str:
    refs = "".join(f"        - model: {m}\n" for m in models)
    return (
        "routing:\n  signals:\n    keywords:\n      - {name: k, operator: OR, keywords: [x]}\n"
        "  decisions:\n    - name: d\n      rules:\n        operator: OR\n        conditions:\n"
        "          - {type: keyword, name: k}\n      modelRefs:\n"
        + refs
        + f"      algorithm:\n        type: {kind}\n"
    )


def test_looper_decisions_follow_the_looper_endpoint() -> None:
    decisions: list[dict[str, Any]] = [
        {
            "name": "a",
            "modelRefs": [{"model": "x"}, {"model": "y"}],
            "algorithm": {"type": "confidence"},
        },
        {"name": "b", "modelRefs": [{"model": "x"}], "algorithm": {"type": "ratings"}},
        {
            "name": "c",
            "modelRefs": [{"model": "x"}],
            "algorithm": {
                "type": "workflows",
                "workflows": {"mode": "dynamic", "roles": [{"name": "r", "models": ["x"]}]},
            },
        },
        {"name": "d", "modelRefs": [{"model": "x"}], "algorithm": {"type": "remom"}},
        {
            "name": "e",
            "modelRefs": [{"model": "x"}],
            "algorithm": {
                "type": "fusion",
                "fusion": {"grounding": {"enabled": True}, "max_concurrent": 2},
            },
        },
    ]
    raw: dict[str, Any] = {"routing": {"decisions": decisions}}
    # Omitted, the endpoint is upstream's default: every looper with enough models runs, in
    # vllm-sr too; what vllm-sr does not run of a running looper is refused by name (fusion's
    # grounding); upstream's own checks apply either way (workflows dynamic takes no roles).
    problems = semantic_problems(raw)
    refused = [p for p in problems if NOT_SUPPORTED in p.message]
    assert [p.path for p in refused] == [
        ("routing", "decisions", 4, "algorithm", "fusion", "grounding", "enabled")
    ]
    invalid = [p for p in problems if NOT_SUPPORTED not in p.message and "algorithm" in p.path]
    assert [p.path for p in invalid] == [
        ("routing", "decisions", 2, "algorithm", "workflows", "roles")
    ]
    raw["global"] = {"integrations": {"looper": {"endpoint": ""}}}
    problems = [p for p in semantic_problems(raw) if "algorithm" in p.path]
    assert [p.path for p in problems] == [p.path for p in invalid]


def test_looper_refusal_in_a_file_names_its_line() -> None:
    text = PROVIDERS + _looper_decision("fusion", ["small", "big"])
    text += "        fusion:\n          grounding: {enabled: true}\n"
    problems = _problems(text)
    hit = [p for p in problems if "grounding" in p and NOT_SUPPORTED in p]
    line = text.splitlines().index("          grounding: {enabled: true}") + 1
    assert hit and hit[0].startswith(
        f"config.yaml:{line}: routing.decisions[0].algorithm.fusion.grounding.enabled:"
    )


def test_every_problem_of_a_file_comes_in_one_run() -> None:
    problems = _problems(
        PROVIDERS
        + ROUTING
        + textwrap.dedent(
            """\
        global:
          router:
            skip_processing: {enabled: true}
            bogus: 1
          services:
            router_replay: {enabled: true, store_backend: qdrant}
          stores:
            memory: {enabled: true}
        """
        )
    )
    assert len(problems) == 4
    assert sum(NOT_SUPPORTED in p for p in problems) == 3
    assert any("global.router.bogus: unknown key 'bogus'" in p for p in problems)


def test_every_new_model_field_has_a_docstring() -> None:
    from pydantic import BaseModel

    from vllm_sr.config import (
        recipes,
        router_replay,
        upstream_catalog,
        upstream_global,
        upstream_learning,
        upstream_modules,
        upstream_settings,
        upstream_stores,
    )

    models = [
        v
        for module in (
            recipes,
            router_replay,
            upstream_catalog,
            upstream_global,
            upstream_learning,
            upstream_modules,
            upstream_settings,
            upstream_stores,
        )
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, BaseModel) and v.__module__ == module.__name__
    ]
    assert len(models) >= 60
    for model in models:
        assert model.model_config.get("extra") == "forbid", model.__name__
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring"


def test_a_flag_edits_the_embedded_default_by_writing_it_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: v0.3  # upstream file\n" + PROVIDERS + ROUTING, encoding="utf-8")
    code, _, _ = _run(["config", "apply", "--config", str(path), "--threads", "2"], capsys)
    assert code == 0
    text = path.read_text(encoding="utf-8")
    assert text.startswith("version: v0.3  # upstream file\n" + PROVIDERS + ROUTING)
    config = parse_config(text)
    assert not config.uses_embedded_default
    dep = config.deployments["primary"]
    assert (dep.artifact, dep.threads, [r.device for r in dep.effective_replicas()]) == (
        "vllm-sr/d3-edge",
        2,
        ["cpu"],
    )
