"""The rules of the top-level ``providers:`` section on raw mappings (like
``schema.semantic_problems``, so a file gets every problem in one run, each at its YAML path):
duplicate model names, unknown default_model and reasoning_family, reasoning families upstream
rejects, malformed backend refs, and the refusals of what vllm-sr does not act on (see
``routing_providers`` for the models, which run these rules too)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from vllm_sr.config.routing_base import Path, as_dict, as_list, duplicates, problem, refusal

if TYPE_CHECKING:
    from vllm_sr.config.problems import Problem

# [scheme://]HOST[:PORT][/path]: upstream strips the scheme (it sets the protocol) and the path.
ENDPOINT_RE = re.compile(
    r"^(?:(?P<scheme>https?)://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.\-_]+)"
    r"(?::(?P<port>[0-9]{1,5}))?(?:/\S*)?$"
)

BASE_URL_RE = re.compile(r"^https?://[^\s/]+(/\S*)?$")

DEFAULT_CHAT_PATH = "/chat/completions"

# Upstream's provider profiles; vllm-sr speaks the OpenAI-compatible chat API only.
UPSTREAM_PROVIDERS = ("openai", "anthropic", "azure-openai", "bedrock", "gemini", "vertex-ai")
SUPPORTED_PROVIDERS = ("openai",)
SUPPORTED_API_FORMATS = ("openai",)
HEALTH_SUPPORTED = (
    "vllm-sr's own backend health (GET {api}/models every 5 s while healthy; after a failure "
    "the backend is skipped and re-checked after a doubling backoff of 0.5 s to 30 s); "
    "remove the field"
)


def providers_problems(providers: Any) -> list[Problem]:
    """Rules inside ``providers:``: duplicate model names, default_model and reasoning_family
    unknown, reasoning families upstream rejects, malformed backend refs, and the refusals."""
    prov = as_dict(providers)
    models = as_list(prov.get("models"))
    base: Path = ("providers", "models")
    problems = duplicates(models, base, "model")
    families = as_dict(as_dict(prov.get("defaults")).get("reasoning_families"))
    problems += _family_problems(families)
    for i, model in enumerate(models):
        problems += _model_problems((*base, i), as_dict(model), families)
    names = [m["name"] for m in models if isinstance(as_dict(m).get("name"), str)]
    default = as_dict(prov.get("defaults")).get("default_model")
    if isinstance(default, str) and names and default not in names:
        problems.append(
            problem(
                ("providers", "defaults", "default_model"),
                f"{default!r} names no model; accepted: one of {', '.join(names)}",
            )
        )
    return problems


def _family_problems(families: dict[str, Any]) -> list[Problem]:
    problems = []
    for name, fam in families.items():
        fam = as_dict(fam)
        if fam.get("type") == "top_level_reasoning_effort" and fam.get("parameter") not in (
            None,
            "reasoning_effort",
        ):
            problems.append(
                problem(
                    ("providers", "defaults", "reasoning_families", name, "parameter"),
                    f"{fam.get('parameter')!r} with type top_level_reasoning_effort; accepted: "
                    "reasoning_effort",
                )
            )
    return problems


def _model_problems(path: Path, model: dict[str, Any], families: dict[str, Any]) -> list[Problem]:
    problems: list[Problem] = []
    family = model.get("reasoning_family")
    if isinstance(family, str) and family not in families:
        problems.append(
            problem(
                (*path, "reasoning_family"),
                f"{family!r} is not a providers.defaults.reasoning_families key; accepted: "
                f"one of {', '.join(map(str, families)) or '(no reasoning_families declared)'}",
            )
        )
    fmt = model.get("api_format")
    if isinstance(fmt, str) and fmt not in SUPPORTED_API_FORMATS:
        problems.append(
            refusal((*path, "api_format"), f"api_format {fmt!r}", ", ".join(SUPPORTED_API_FORMATS))
        )
    problems += _reliability_problems((*path, "reliability"), as_dict(model.get("reliability")))
    refs = as_list(model.get("backend_refs"))
    if model.get("backend_refs") in (None, []):
        problems.append(
            refusal(
                (*path, "backend_refs") if "backend_refs" in model else path,
                "a model with no backend_refs (a metadata-only provider model)",
                "at least one backend ref, {endpoint: HOST[:PORT]} or {base_url: URL}",
            )
        )
    problems += duplicates(refs, (*path, "backend_refs"), "backend ref")
    for j, ref in enumerate(refs):
        problems += _backend_ref_problems((*path, "backend_refs", j), as_dict(ref))
    return problems


def _reliability_problems(path: Path, rel: dict[str, Any]) -> list[Problem]:
    problems = []
    count = rel.get("retry_count")
    if isinstance(count, int) and count > 0:
        problems.append(
            refusal(
                (*path, "retry_count"),
                f"retry_count {count} (retrying a failed chat)",
                "0: a backend that cannot be reached answers 502 and is skipped until it is "
                "healthy again",
            )
        )
    for key in (
        "retry_on",
        "consecutive_5xx",
        "base_ejection_time",
        "max_ejection_percent",
        "health_check_path",
        "health_check_interval",
        "health_check_timeout",
    ):
        if rel.get(key) is not None:
            problems.append(refusal((*path, key), f"reliability.{key}", HEALTH_SUPPORTED))
    return problems


def _backend_ref_problems(path: Path, ref: dict[str, Any]) -> list[Problem]:
    problems = []
    endpoint, base_url = ref.get("endpoint"), ref.get("base_url")
    if endpoint is None and base_url is None:
        problems.append(
            problem(
                path,
                "a backend ref needs endpoint or base_url; accepted: {endpoint: HOST[:PORT]} "
                "or {base_url: http(s)://HOST[:PORT]/v1}",
            )
        )
    elif endpoint is not None and base_url is not None:
        problems.append(
            refusal(
                path,
                "a backend ref with both endpoint and base_url",
                "one of them: {endpoint: HOST[:PORT]} or {base_url: http(s)://HOST[:PORT]/v1}",
            )
        )
    if isinstance(endpoint, str) and not ENDPOINT_RE.match(endpoint):
        problems.append(
            problem(
                (*path, "endpoint"),
                f"{endpoint!r} is not HOST[:PORT]; accepted: e.g. 127.0.0.1:8000 "
                "(use base_url for a URL)",
            )
        )
    if isinstance(base_url, str) and not BASE_URL_RE.match(base_url):
        problems.append(
            problem(
                (*path, "base_url"),
                f"{base_url!r} is not a URL; accepted: http(s)://HOST[:PORT][/PATH], "
                "e.g. https://api.example.com/v1",
            )
        )
    provider = ref.get("provider")
    if isinstance(provider, str) and provider not in SUPPORTED_PROVIDERS:
        what = "provider" if provider in UPSTREAM_PROVIDERS else "unknown provider"
        problems.append(
            refusal(
                (*path, "provider"),
                f"{what} {provider!r}",
                f"{', '.join(SUPPORTED_PROVIDERS)} (an OpenAI-compatible chat API)",
            )
        )
    chat_path = ref.get("chat_path")
    if isinstance(chat_path, str) and chat_path != DEFAULT_CHAT_PATH:
        problems.append(
            refusal(
                (*path, "chat_path"),
                f"chat_path {chat_path!r}",
                f"{DEFAULT_CHAT_PATH} under the API root (put the root in base_url)",
            )
        )
    if ref.get("api_version") is not None:
        problems.append(
            refusal(
                (*path, "api_version"), "api_version", "no api_version (OpenAI-compatible APIs)"
            )
        )
    if as_dict(ref.get("extra_headers")):
        problems.append(
            refusal(
                (*path, "extra_headers"),
                "extra_headers",
                "the credential headers (auth_header, auth_prefix, api_key / api_key_env)",
            )
        )
    return problems
