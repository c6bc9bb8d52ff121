"""``prompt``'s settings (upstream's ``pkg/selection/prompt.go``: a helper model asked to pick
among the modelRefs) and its load-time rules (upstream's ``pkg/config/validator_prompt.go``),
naming the field, the value and what is accepted.

Upstream's rules, kept here: the block is required when the type names it (checked by
:func:`vllm_sr.config.routing_selection.selector_block_problems`); ``model`` and
``instructions`` non-empty, ``timeout_seconds`` >= 0 (0: 5 s), ``on_error`` empty or
``fallback``, at least two modelRefs with unique models and unique effective identities
(``lora_name``, else ``model``); ``model`` a providers model (its backends) whose modelCard, if
any, is a chat text model (modality empty, text, ar, both, multimodal), and
``global.integrations.looper.endpoint`` set (upstream calls the helper through it; vllm-sr
through its own backends: docs/router.md "Model selection"). Unknown keys are refused with the
accepted ones named."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from vllm_sr.config.routing_base import Path, Strict, as_dict, as_list, is_int, problem
from vllm_sr.config.selection_checks import unknown_keys

if TYPE_CHECKING:
    from vllm_sr.config.problems import Problem
    from vllm_sr.jsontypes import JsonObject

PROMPT = "prompt"
DEFAULT_PROMPT_TIMEOUT_S = 5
CHAT_MODALITIES = ("", "text", "ar", "both", "multimodal")  # upstream's prompt helper modalities


class PromptSettings(Strict):
    """A decision's ``prompt`` block (upstream's PromptSelectionConfig)."""

    model: str = Field(min_length=1, max_length=128)
    """The helper model asked (a modelCards name with providers backends)."""

    instructions: str = Field(min_length=1, max_length=16000)
    """What the helper is told, before the candidate list."""

    timeout_seconds: int = Field(default=0, ge=0, le=3600)
    """The helper call's bound (0: 5 s), within the caller's deadline."""

    @property
    def timeout_s(self) -> float:
        return float(self.timeout_seconds or DEFAULT_PROMPT_TIMEOUT_S)


def prompt_block_problems(
    base: Path, block: JsonObject, on_error: object, on_error_path: Path
) -> list[Problem]:
    """The problems of an ``algorithm.prompt`` mapping at ``base``, and of the decision's
    ``on_error`` (at ``on_error_path``) on a prompt decision."""
    problems = unknown_keys(base, block, tuple(PromptSettings.model_fields))
    for key in ("model", "instructions"):
        value = block.get(key)
        if not isinstance(value, str) or not value.strip():
            problems.append(
                problem((*base, key), f"{value!r}; accepted: a non-empty string (required)")
            )
    timeout = block.get("timeout_seconds")
    if timeout is not None and not (is_int(timeout) and 0 <= timeout <= 3600):
        problems.append(
            problem(
                (*base, "timeout_seconds"),
                f"{timeout!r}; accepted: an integer from 0 to 3600 (0 or absent: 5)",
            )
        )
    if on_error not in (None, "", "fallback"):
        problems.append(
            problem(on_error_path, f"{on_error!r} on a prompt decision; accepted: fallback")
        )
    return problems


def prompt_problems(
    routing: object,
    providers: object,
    looper_endpoint: str,
    base: Path = ("routing",),
) -> list[Problem]:
    """Upstream's checks of each prompt decision against the rest of the config: at least two
    modelRefs with unique models and effective identities, the helper model declared in
    ``routing.modelCards`` with providers backends, and a looper endpoint."""
    rt = as_dict(routing)
    card_list = [as_dict(c) for c in as_list(rt.get("modelCards") or rt.get("model_cards"))]
    cards = {c.get("name") for c in card_list}
    modality = {c.get("name"): c.get("modality") for c in card_list}
    served = {as_dict(m).get("name") for m in as_list(as_dict(providers).get("models"))}
    problems: list[Problem] = []
    for i, dec in enumerate(as_list(rt.get("decisions"))):
        algo = as_dict(as_dict(dec).get("algorithm"))
        if algo.get("type") != PROMPT:
            continue
        path: Path = (*base, "decisions", i)
        refs = as_list(as_dict(dec).get("modelRefs"))
        if len(refs) < 2:
            problems.append(
                problem(
                    (*path, "modelRefs"),
                    f"{len(refs)} modelRef(s) on a prompt decision; accepted: at least two "
                    "(as upstream)",
                )
            )
        seen: set[object] = set()
        effective: set[object] = set()
        for j, ref in enumerate(refs):
            model = as_dict(ref).get("model")
            identity = as_dict(ref).get("lora_name") or model
            if model in seen or identity in effective:
                problems.append(
                    problem(
                        (*path, "modelRefs", j),
                        f"model {model!r} (identity {identity!r}) repeats an earlier modelRef "
                        "of a prompt decision; accepted: unique models and lora_names",
                    )
                )
            seen.add(model)
            effective.add(identity)
        helper = as_dict(algo.get("prompt")).get("model")
        if isinstance(helper, str) and helper.strip():
            name = helper.strip()
            if name not in served:
                problems.append(
                    problem(
                        (*path, "algorithm", "prompt", "model"),
                        f"{helper!r}"
                        + (" (a modelCard without providers backends)" if name in cards else "")
                        + "; accepted: a providers.models name (its backends answer the helper "
                        "call)",
                    )
                )
        kind_of = modality.get(helper) if isinstance(helper, str) else None
        if isinstance(kind_of, str) and kind_of.strip().lower() not in CHAT_MODALITIES:
            problems.append(
                problem(
                    (*path, "algorithm", "prompt", "model"),
                    f"{helper!r} has modelCards modality {kind_of!r}; accepted: a chat-capable "
                    "text model (modality empty, " + ", ".join(CHAT_MODALITIES[1:]) + ")",
                )
            )
        if not looper_endpoint:
            problems.append(
                problem(
                    (*path, "algorithm", "type"),
                    "prompt without global.integrations.looper.endpoint; accepted: a looper "
                    "endpoint (upstream calls the helper model through it; vllm-sr calls it "
                    "through its own backends, and requires the endpoint as upstream does)",
                )
            )
    return problems
