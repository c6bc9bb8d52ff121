"""The rules of the top-level ``providers:`` section on raw mappings (like
``schema.semantic_problems``, so a file gets every problem in one run, each at its YAML path):
duplicate model names, an unknown default model (defaults.model, or its 3d48f8c9 name
default_model; both given is an error) and reasoning_family, reasoning families upstream
rejects, malformed backend refs, and the refusals of what vllm-sr does not act on (see
``routing_providers`` for the models, which run these rules too)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from vllm_sr.config.renames import PROVIDER_DEFAULTS, both_names_problems, given
from vllm_sr.config.routing_base import Path, as_dict, as_list, duplicates, problem, refusal
from vllm_sr.jsontypes import JsonObject

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

# Go's duration syntax (time.ParseDuration) without the sign.
GO_UNITS_S = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ms": 1e-3, "s": 1.0}
GO_UNITS_S |= {"m": 60.0, "h": 3600.0}
GO_PART_RE = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
GO_DURATION_RE = re.compile(f"(?:{GO_PART_RE.pattern})+")

# Envoy's retry_on conditions for HTTP; vllm-sr honours the ones its HTTP/1.1 backends can
# meet (router/backend_retry.py maps its failure reasons onto them).
RETRY_ON_WORDS = ("5xx", "gateway-error", "reset", "connect-failure", "refused-stream")
ENVOY_RETRY_ON = (
    *RETRY_ON_WORDS,
    "reset-before-request",
    "envoy-ratelimited",
    "retriable-4xx",
    "retriable-status-codes",
    "retriable-headers",
    "http3-post-connect-failure",
    "cancelled",
    "deadline-exceeded",
    "internal",
    "resource-exhausted",
    "unavailable",
)


def providers_problems(providers: object) -> list[Problem]:
    """Rules inside ``providers:``: duplicate model names, the default model (either name)
    and reasoning_family unknown, a renamed field given under both names, reasoning families
    upstream rejects, malformed backend refs, and the refusals."""
    prov = as_dict(providers)
    models = as_list(prov.get("models"))
    base: Path = ("providers", "models")
    problems = duplicates(models, base, "model")
    families = as_dict(as_dict(prov.get("defaults")).get("reasoning_families"))
    problems += _family_problems(families)
    for i, model in enumerate(models):
        problems += _model_problems((*base, i), as_dict(model), families)
    names = [n for m in models if isinstance(n := as_dict(m).get("name"), str)]
    key, default = given(prov.get("defaults"), PROVIDER_DEFAULTS, "model") or ("model", None)
    if isinstance(default, str) and names and default not in names:
        problems.append(
            problem(
                (*PROVIDER_DEFAULTS, key),
                f"{default!r} names no model; accepted: one of {', '.join(names)}",
            )
        )
    return problems + both_names_problems(prov, ("providers",))


def _family_problems(families: JsonObject) -> list[Problem]:
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


FAMILY_TYPES = ("chat_template_kwargs", "reasoning_effort", "top_level_reasoning_effort")
REFUSED_REASONING = {
    "activation_parameter": "a separate reasoning on/off key",
    "effort_flags": "one flag per reasoning effort",
    "default": "the model's own default effort (providers.defaults.reasoning_effort and "
    "modelRefs' reasoning_effort decide)",
    "disabled": "a value sent to switch reasoning off",
}


def model_reasoning_problems(path: Path, model: JsonObject) -> list[Problem]:
    """v0.4's ``reasoning`` block and ``catalog`` of one provider model (see ModelReasoning)."""
    problems: list[Problem] = []
    if model.get("catalog") is not None:
        problems.append(
            refusal(
                (*path, "catalog"),
                f"the built-in model catalog entry {model['catalog']!r}",
                "the model's fields written inline (reasoning: {type, parameter})",
            )
        )
    if "reasoning" not in model or model.get("reasoning") is None:
        return problems
    r = as_dict(model.get("reasoning"))
    here = (*path, "reasoning")
    if model.get("reasoning_family") is not None:
        problems.append(
            problem(here, "reasoning and reasoning_family are both set; accepted: one of them")
        )
    inline = any(r.get(k) not in (None, [], {}) for k in ("type", "parameter"))
    if r.get("family") is not None and inline:
        problems.append(
            problem(here, "family and an inline type/parameter are both set; accepted: one")
        )
    elif r.get("family") is None and (r.get("type") is None or r.get("parameter") is None):
        problems.append(problem(here, "accepted: family, or an inline type and parameter (both)"))
    kind = r.get("type")
    if kind == "reasoning_mode":
        problems.append(
            refusal((*here, "type"), "reasoning type 'reasoning_mode'", ", ".join(FAMILY_TYPES))
        )
    elif isinstance(kind, str) and kind not in FAMILY_TYPES:
        problems.append(
            problem((*here, "type"), f"{kind!r}; accepted: one of {', '.join(FAMILY_TYPES)}")
        )
    for key, what in REFUSED_REASONING.items():
        if r.get(key) not in (None, [], {}):
            problems.append(refusal((*here, key), what, "type and parameter (as a family)"))
    return problems


def _model_problems(path: Path, model: JsonObject, families: JsonObject) -> list[Problem]:
    problems: list[Problem] = []
    problems += model_reasoning_problems(path, model)
    family = model.get("reasoning_family")
    where: Path = (*path, "reasoning_family")
    reasoning = as_dict(model.get("reasoning"))
    if family is None and isinstance(reasoning.get("family"), str):
        family, where = reasoning["family"], (*path, "reasoning", "family")
    if isinstance(family, str) and family not in families:
        problems.append(
            problem(
                where,
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


def _reliability_problems(path: Path, rel: JsonObject) -> list[Problem]:
    """Upstream's checks (retry_count 0-5 with retry_on, Go durations, a path starting with
    /), each naming the field, the value and what is accepted; and the retry_on words vllm-sr
    cannot honour, refused by name."""
    problems: list[Problem] = []
    count, retry_on = rel.get("retry_count"), rel.get("retry_on")
    if (
        isinstance(count, int)
        and count > 0
        and not (isinstance(retry_on, str) and retry_on.strip())
    ):
        problems.append(
            problem(
                (*path, "retry_on"),
                f"retry_count {count} needs retry_on; accepted: a comma list of "
                f"{', '.join(RETRY_ON_WORDS)}",
            )
        )
    if isinstance(retry_on, str):
        for word in retry_on_words(retry_on):
            if word not in RETRY_ON_WORDS:
                what = "retry_on condition" if word in ENVOY_RETRY_ON else "unknown retry_on word"
                problems.append(
                    refusal(
                        (*path, "retry_on"),
                        f"{what} {word!r}",
                        f"{', '.join(RETRY_ON_WORDS)} (comma-separated, as Envoy's)",
                    )
                )
    for key in ("base_ejection_time", "health_check_interval", "health_check_timeout"):
        value = rel.get(key)
        if isinstance(value, str) and not go_duration_s(value):  # Envoy wants them > 0
            what = "is not a duration" if go_duration_s(value) is None else "is no time"
            problems.append(
                problem(
                    (*path, key),
                    f"{value!r} {what}; accepted: above 0 in Go's syntax, a number and a unit "
                    "(ns, us, ms, s, m, h), e.g. 500ms, 30s, 1m30s",
                )
            )
    hc_path = rel.get("health_check_path")
    if isinstance(hc_path, str) and not hc_path.startswith("/"):
        problems.append(
            problem(
                (*path, "health_check_path"),
                f"{hc_path!r} does not start with /; accepted: a path on the backend's server, "
                "e.g. /health",
            )
        )
    return problems


def retry_on_words(retry_on: str) -> list[str]:
    """Envoy's comma list as words (blanks around them dropped, empty ones skipped)."""
    return [w.strip() for w in retry_on.split(",") if w.strip()]


def go_duration_s(text: str) -> float | None:
    """Go's ``time.ParseDuration`` for what a timeout can be: ``0`` or a sequence of a decimal
    number and a unit (``1m30s``, ``1.5h``, ``500ms``) -> seconds; None when ``text`` is not
    one (a sign is not accepted: a negative time means nothing here)."""
    if text == "0":
        return 0.0
    if not GO_DURATION_RE.fullmatch(text):
        return None
    return sum(float(n) * GO_UNITS_S[unit] for n, unit in GO_PART_RE.findall(text))


def _backend_ref_problems(path: Path, ref: JsonObject) -> list[Problem]:
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
