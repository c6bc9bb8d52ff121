"""Refusals of upstream v0.4's new ``global`` and ``listeners`` settings that would change
routing, the request or a service an operator relies on, and that vllm-sr does not implement
(the rule of ``upstream_refusals``). Works on the raw mapping."""

from __future__ import annotations

from vllm_sr.config.problems import Problem
from vllm_sr.config.routing_base import as_dict, as_list, refusal

POLARITY_OFF = ("off", "disabled", "none", "")


def v04_refusals(raw: object) -> list[Problem]:
    if not isinstance(raw, dict):
        return []
    glob = as_dict(raw.get("global"))
    catalog = as_dict(glob.get("model_catalog"))
    problems: list[Problem] = []
    if as_dict(catalog.get("admission")):
        problems.append(
            refusal(
                ("global", "model_catalog", "admission"),
                "per-deployment admission limits (upstream's runtime queue)",
                "a deployment's engine_args (max_num_seqs, max_num_batched_tokens) and the "
                "worker pool's own bounds",
            )
        )
    backend = as_dict(as_dict(catalog.get("modules")).get("complexity")).get("backend")
    if backend is not None:
        problems.append(
            refusal(
                ("global", "model_catalog", "modules", "complexity", "backend"),
                "a remote complexity classifier",
                "complexity from prototype margins on the decision deployment (no backend)",
            )
        )
    gate = as_dict(
        as_dict(as_dict(as_dict(glob.get("router")).get("learning")).get("protection")).get(
            "tuning"
        )
    ).get("progress_gate")
    if as_dict(gate).get("enabled") is True:
        problems.append(
            refusal(
                ("global", "router", "learning", "protection", "tuning", "progress_gate"),
                "Router Learning's progress gate",
                "enabled: false (protection's switch_margin and stability_weight apply)",
            )
        )
    profiling = as_dict(
        as_dict(as_dict(glob.get("services")).get("observability")).get("profiling")
    )
    if profiling.get("enabled") is True:
        problems.append(
            refusal(
                ("global", "services", "observability", "profiling", "enabled"),
                "a pprof profiling server",
                "false (vllm-sr serves /metrics and the inventory)",
            )
        )
    guard = as_dict(
        as_dict(as_dict(glob.get("stores")).get("response_cache")).get("polarity_guard")
    )
    mode = guard.get("mode")
    if isinstance(mode, str) and mode.strip().lower() not in POLARITY_OFF:
        problems.append(
            refusal(
                ("global", "stores", "response_cache", "polarity_guard", "mode"),
                f"the response cache's polarity guard (mode {mode!r}, an NLI model)",
                "off (a semantic hit needs its similarity threshold only)",
            )
        )
    for i, listener in enumerate(as_list(raw.get("listeners"))):
        if as_list(as_dict(listener).get("api_keys")):
            problems.append(
                refusal(
                    ("listeners", i, "api_keys"),
                    "listener API keys (upstream's native /v1/systemone API)",
                    "no api_keys (vllm-sr serves no native API; chats carry the backend's "
                    "credential)",
                )
            )
    return problems
