"""Refusals of upstream ``global`` settings vllm-sr does not act on (issue 24 section 1).

Each is a Problem at the setting's YAML path whose message says "not supported by vllm-sr"
and what is supported instead (``routing_base.refusal``); all are collected, so one ``config
validate`` run lists them all. The rule for what is refused: a written value that would change
routing or the request (or turn on a service an operator would rely on) and that vllm-sr does
not implement. A value that only matters to something already refused elsewhere (a plugin, a
signal family, a selector algorithm) is accepted: the refusal of that thing is what tells the
operator. docs/router.md ("Upstream fields outside routing and providers") lists every field
and its verdict. (A looper decision
that upstream would run through ``global.integrations.looper.endpoint`` is refused at the
decision by ``routing_rules.routing_problems``.)

Works on the raw mapping (wrong types tolerated: field validation reports those).
"""

from __future__ import annotations

from collections.abc import Iterator

from vllm_sr.config.fallback_policy import fallback_problems
from vllm_sr.config.learning_rules import learning_problems
from vllm_sr.config.problems import Problem
from vllm_sr.config.routing_base import as_dict, as_list, refusal
from vllm_sr.config.upstream_refusals_v04 import v04_refusals
from vllm_sr.jsontypes import JsonObject

Path = tuple[str | int, ...]


def routings(raw: JsonObject) -> Iterator[tuple[Path, JsonObject]]:
    """Every routing profile of the file with its path: the top level's, then each recipe's."""
    top = raw.get("routing")
    if isinstance(top, dict):
        yield ("routing",), top
    for i, rec in enumerate(as_list(raw.get("recipes"))):
        routing = as_dict(rec).get("routing")
        if isinstance(routing, dict):
            yield ("recipes", i, "routing"), routing


def _is_true(value: object) -> bool:
    return value is True


def global_refusals(raw: object) -> list[Problem]:
    """Every refused ``global`` setting of a raw config mapping."""
    if not isinstance(raw, dict):
        return []
    glob = as_dict(raw.get("global"))
    problems = _router_refusals(as_dict(glob.get("router")))
    problems += _service_refusals(as_dict(glob.get("services")))
    problems += _store_refusals(raw, as_dict(glob.get("stores")))
    problems += v04_refusals(raw)
    return problems + _catalog_refusals(raw, as_dict(glob.get("model_catalog")))


def _router_refusals(router: JsonObject) -> list[Problem]:
    base: Path = ("global", "router")
    problems: list[Problem] = []
    source = router.get("config_source")
    if isinstance(source, str) and source != "file":
        problems.append(
            refusal(
                (*base, "config_source"),
                f"config_source {source!r} (config from Kubernetes resources)",
                "file (vllm-sr reads config.yaml)",
            )
        )
    if _is_true(as_dict(router.get("skip_processing")).get("enabled")):
        problems.append(
            refusal(
                (*base, "skip_processing", "enabled"),
                "skip_processing enabled (x-vsr-skip-processing passes a request unrouted)",
                "false (every auto request is routed)",
            )
        )
    problems += fallback_problems((*base, "fallback"), router.get("fallback"))
    return problems + learning_problems(router.get("learning"))


def _service_refusals(services: JsonObject) -> list[Problem]:
    base: Path = ("global", "services")
    problems: list[Problem] = []
    problems += _response_api_refusals(services.get("response_api"))
    problems += _replay_refusals(as_dict(services.get("router_replay")), (*base, "router_replay"))
    if as_dict(services.get("router_replay")).get("capture_personal_data") is False:
        problems.append(
            refusal(
                (*base, "router_replay", "capture_personal_data"),
                "capture_personal_data: false (replay records with personal data left out)",
                "true or omitted (upstream's default: records keep what their capture settings "
                "say)",
            )
        )
    for key, what, supported in (
        ("ratelimit", "rate limiting", "an empty providers list (no rate limit)"),
        ("authz", "authz credential providers", "an empty providers list"),
    ):
        providers = as_list(as_dict(services.get(key)).get("providers"))
        if providers:
            types = [str(as_dict(p).get("type")) for p in providers]
            problems.append(
                refusal(
                    (*base, key, "providers"),
                    f"{what} ({', '.join(types)})",
                    supported,
                )
            )
    return problems


def _response_api_refusals(block: object) -> list[Problem]:
    """The Responses API is served with a memory or a standalone Redis store (without
    ``redis.address``: ``localhost:6379``); a written block that leaves ``enabled`` unset is on
    (upstream's default)."""
    if not isinstance(block, dict) or block.get("enabled", True) is False:
        return []
    base: Path = ("global", "services", "response_api")
    if block.get("store_backend", "redis") != "redis":
        return []
    redis = as_dict(block.get("redis"))
    problems = []
    for key, what, supported in (
        ("cluster_mode", "Redis Cluster for the Responses API store", "false (one Redis)"),
        ("tls_enabled", "TLS to the Responses API's Redis", "false"),
    ):
        if _is_true(redis.get(key)):
            problems.append(refusal((*base, "redis", key), what, supported))
    if redis.get("config_path"):
        problems.append(
            refusal(
                (*base, "redis", "config_path"),
                "an external Redis settings file for the Responses API store",
                "the settings inline under response_api.redis",
            )
        )
    return problems


def _has_decisions(raw: JsonObject) -> bool:
    return any(as_list(rt.get("decisions")) for _, rt in routings(raw))


def _replay_refusals(replay: JsonObject, base: Path) -> list[Problem]:
    """router_replay's store: memory, redis and postgres are kept; milvus and qdrant refused
    (written, or inferred from their block alone as upstream infers the store)."""
    backend = replay.get("store_backend")
    where: Path = (*base, "store_backend")
    if backend is None:
        blocks = ("postgres", "redis", "milvus", "qdrant")
        written = [k for k in blocks if replay.get(k) is not None]
        backend = written[0] if written else None
        where = (*base, backend) if backend is not None else where
    if backend in ("milvus", "qdrant"):
        return [
            refusal(
                where,
                f"the router_replay store {backend!r}",
                "memory (the default), redis, postgres",
            )
        ]
    return []


def _store_refusals(raw: JsonObject, stores: JsonObject) -> list[Problem]:
    base: Path = ("global", "stores")
    problems: list[Problem] = []
    for key, what in (("memory", "agentic memory"), ("vector_store", "the vector store")):
        if _is_true(as_dict(stores.get(key)).get("enabled")):
            problems.append(refusal((*base, key, "enabled"), what, "false"))
    backend = as_dict(stores.get("response_cache")).get("backend_type")
    if backend not in (None, "memory", "redis"):
        problems.append(
            refusal(
                (*base, "response_cache", "backend_type"),
                f"the response-cache store {backend!r}",
                "memory (the default), redis",
            )
        )
    if _is_true(as_dict(stores.get("response_cache")).get("enabled")) and not _has_decisions(raw):
        # With decisions, upstream caches only through a decision's response_cache plugin
        # (acted on); with none, the global switch caches every request (not done here).
        problems.append(
            refusal(
                (*base, "response_cache", "enabled"),
                "the response cache without decisions (upstream then caches every request)",
                "false",
            )
        )
    return problems


def _catalog_refusals(raw: JsonObject, catalog: JsonObject) -> list[Problem]:
    base: Path = ("global", "model_catalog")
    problems: list[Problem] = []
    comp = as_dict(as_dict(catalog.get("modules")).get("prompt_compression"))
    max_tokens = comp.get("max_tokens")
    if _is_true(comp.get("enabled")) and isinstance(max_tokens, int) and max_tokens > 0:
        problems.append(
            refusal(
                (*base, "modules", "prompt_compression", "enabled"),
                "prompt compression (signals would see a compressed text)",
                "false (signals see the request's text)",
            )
        )
    pref = as_dict(as_dict(as_dict(catalog.get("modules")).get("classifier")).get("preference"))
    uses_preferences = any(
        as_list(as_dict(rt.get("signals")).get("preferences")) for _, rt in routings(raw)
    )
    if pref.get("use_contrastive") is False and uses_preferences:
        problems.append(
            refusal(
                (*base, "modules", "classifier", "preference", "use_contrastive"),
                "preferences judged by an external LLM (use_contrastive: false)",
                "true (contrastive prototype scores on the decision deployment)",
            )
        )
    return problems
