"""The checks of the fan-out loopers' blocks (``ratings``, ``remom``, ``fusion``) and of
``workflows``', as upstream makes them (``pkg/config``: ``ValidateReMoMAlgorithmConfig`` and
``ValidateReMoMModelRefs``, ``ValidateFusionAlgorithmConfig``,
``ValidateWorkflowsAlgorithmConfig``; ratings' ``on_error``). Each error names the field, the
value and what is accepted. Counts upstream reads as "unset" at 0 are accepted at 0 (its
default then applies); a negative count is refused, as upstream refuses it.

What vllm-sr runs (vllm_sr/router/looper): ratings, remom, fusion and workflows with every
field below, except fusion's ``grounding`` when enabled (upstream scores the panel with local
hallucination and NLI encoders) and a remom ``synthesis_template`` with Go template actions,
both refused by name where the looper would run. The settings an accepted block gives the
loopers: :mod:`vllm_sr.config.looper_fanout_settings`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_sr.config.routing_base import is_int, is_number, not_accepted, refusal
from vllm_sr.config.routing_base import problem as _problem

if TYPE_CHECKING:
    from collections.abc import Sequence

    from vllm_sr.config.problems import Problem
    from vllm_sr.config.routing_base import Path

ON_ERROR = ("skip", "fail")
RATINGS_FIELDS = ("max_concurrent", "on_error")
REMOM_FIELDS = (
    "breadth_schedule",
    "model_distribution",
    "temperature",
    "include_reasoning",
    "compaction_strategy",
    "compaction_tokens",
    "synthesis_template",
    "synthesis_model",
    "max_concurrent",
    "max_completion_tokens",
    "round_timeout_seconds",
    "min_successful_responses",
    "on_error",
    "shuffle_seed",
    "include_intermediate_responses",
    "max_responses_per_round",
)
DISTRIBUTIONS = ("weighted", "equal", "round_robin", "first_only")
COMPACTIONS = ("full", "last_n_tokens")
FUSION_FIELDS = (
    "model",
    "analysis_models",
    "analysis_overrides",
    "max_concurrent",
    "max_completion_tokens",
    "round_timeout_seconds",
    "min_successful_responses",
    "temperature",
    "include_analysis",
    "on_error",
    "analysis_template",
    "synthesis_template",
    "judge_prompt_version",
    "include_intermediate_responses",
    "grounding",
)
OVERRIDE_FIELDS = ("model", "temperature", "max_completion_tokens")
GROUNDING_FIELDS = (
    "enabled",
    "reference",
    "policy",
    "min_score",
    "min_keep",
    "nli_contradiction_penalty",
    "on_error",
)
WORKFLOWS_FIELDS = (
    "mode",
    "template",
    "roles",
    "final",
    "planner",
    "max_steps",
    "max_parallel",
    "max_completion_tokens",
    "round_timeout_seconds",
    "min_successful_responses",
    "temperature",
    "include_intermediate_responses",
    "on_error",
)
ROLE_FIELDS = ("name", "models", "prompt", "access_list")
FINAL_FIELDS = ("model", "prompt")
PLANNER_FIELDS = ("model", "max_completion_tokens")


def _mapping(value: object) -> dict[str, object]:
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {}


class _Checker:
    """Collects the problems of one block at ``base``."""

    def __init__(self, base: Path, block: object, fields: Sequence[str]) -> None:
        self.base = base
        self.problems: list[Problem] = []
        if block is not None and not isinstance(block, dict):
            self.problems.append(not_accepted(base, block, f"a mapping of {', '.join(fields)}"))
        self.got = _mapping(block)
        for key in self.got:
            if key not in fields:
                self.problems.append(
                    _problem((*base, key), f"unknown field {key!r}; accepted: {', '.join(fields)}")
                )

    def present(self, key: str) -> object:
        value = self.got.get(key)
        return None if value is None else value

    def count(self, key: str, minimum: int = 1) -> None:
        """A whole number >= ``minimum`` when set (0 or absent: upstream's default)."""
        value = self.present(key)
        if value is None:
            return
        if not is_int(value) or (value != 0 and value < minimum):
            accepted = f"a whole number >= {minimum} (0 or absent: the default)"
            if minimum == 0:
                accepted = "a whole number >= 0"
            self.problems.append(not_accepted((*self.base, key), value, accepted))

    def non_negative(self, key: str) -> None:
        value = self.present(key)
        if value is not None and not (is_number(value) and float(value) >= 0):
            self.problems.append(not_accepted((*self.base, key), value, "a number >= 0"))

    def unit(self, key: str) -> None:
        value = self.present(key)
        if value is not None and not (is_number(value) and 0 <= float(value) <= 1):
            self.problems.append(not_accepted((*self.base, key), value, "a number within 0-1"))

    def one_of(self, key: str, accepted: Sequence[str]) -> None:
        value = self.present(key)
        if value not in (None, "", *accepted):
            self.problems.append(not_accepted((*self.base, key), value, ", ".join(accepted)))

    def flag(self, key: str) -> None:
        value = self.present(key)
        if value is not None and not isinstance(value, bool):
            self.problems.append(not_accepted((*self.base, key), value, "true or false"))

    def text(self, key: str) -> None:
        value = self.present(key)
        if value is not None and not isinstance(value, str):
            self.problems.append(not_accepted((*self.base, key), value, "a string"))

    def names(self, key: str) -> list[str]:
        """A list of non-empty, distinct names."""
        value = self.present(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self.problems.append(not_accepted((*self.base, key), value, "a list of model names"))
            return []
        out: list[str] = []
        for i, name in enumerate(value):
            if not isinstance(name, str) or not name.strip():
                self.problems.append(
                    not_accepted((*self.base, key, i), name, "a non-empty model name")
                )
            elif name.strip() in out:
                self.problems.append(not_accepted((*self.base, key, i), name, "each model once"))
            else:
                out.append(name.strip())
        return out


def ratings_problems(base: Path, block: object) -> list[Problem]:
    """Upstream's ratings fields: ``max_concurrent`` (>= 1 when set; default: every
    modelRef at once) and ``on_error`` (skip, fail)."""
    check = _Checker(base, block, RATINGS_FIELDS)
    check.count("max_concurrent")
    check.one_of("on_error", ON_ERROR)
    return check.problems


REMOM_TEMPLATE_FIELD = "{{.OriginalContent}}"


def remom_problems(
    base: Path, block: object, ref_models: Sequence[str], runs: bool = False
) -> list[Problem]:
    """``ValidateReMoMAlgorithmConfig`` then ``ValidateReMoMModelRefs`` (synthesis_model must
    be one of the decision's modelRefs); when the looper runs, a ``synthesis_template`` with
    Go template actions other than ``{{.OriginalContent}}`` is refused by name."""
    check = _Checker(base, block, REMOM_FIELDS)
    if block is None:
        return check.problems
    template = check.got.get("synthesis_template")
    if runs and isinstance(template, str) and "{{" in template.replace(REMOM_TEMPLATE_FIELD, ""):
        check.problems.append(
            refusal(
                (*base, "synthesis_template"),
                "a synthesis_template with Go template actions (range, if, Reference fields)",
                f"plain text, with {REMOM_TEMPLATE_FIELD} for the original problem",
            )
        )
    schedule = check.present("breadth_schedule")
    if not isinstance(schedule, list) or not schedule:
        check.problems.append(
            not_accepted(
                (*base, "breadth_schedule"), schedule, "a non-empty list of whole numbers >= 1"
            )
        )
    else:
        for i, breadth in enumerate(schedule):
            if not is_int(breadth) or breadth < 1:
                check.problems.append(
                    not_accepted((*base, "breadth_schedule", i), breadth, "a whole number >= 1")
                )
    check.one_of("model_distribution", DISTRIBUTIONS)
    check.non_negative("temperature")
    check.one_of("compaction_strategy", COMPACTIONS)
    check.count("compaction_tokens", minimum=0)
    for key in ("max_concurrent", "round_timeout_seconds", "min_successful_responses"):
        check.count(key)
    check.count("max_responses_per_round")
    tokens = check.present("max_completion_tokens")
    if tokens is not None and not (is_int(tokens) and tokens >= 1):
        check.problems.append(
            not_accepted((*base, "max_completion_tokens"), tokens, "a whole number >= 1")
        )
    check.one_of("on_error", ON_ERROR)
    for key in ("include_reasoning", "include_intermediate_responses"):
        check.flag(key)
    for key in ("synthesis_template", "synthesis_model"):
        check.text(key)
    if not is_int(check.present("shuffle_seed") or 0):
        check.problems.append(
            not_accepted((*base, "shuffle_seed"), check.present("shuffle_seed"), "a whole number")
        )
    synthesis = check.present("synthesis_model")
    if isinstance(synthesis, str) and synthesis.strip() and synthesis not in ref_models:
        check.problems.append(
            not_accepted(
                (*base, "synthesis_model"),
                synthesis,
                "one of the decision's modelRefs: " + (", ".join(ref_models) or "(none)"),
            )
        )
    return check.problems


def fusion_problems(base: Path, block: object, runs: bool) -> list[Problem]:
    """``ValidateFusionAlgorithmConfig``; when the looper runs, ``grounding.enabled`` is refused
    by name."""
    check = _Checker(base, block, FUSION_FIELDS)
    check.one_of("on_error", ON_ERROR)
    for key in (
        "max_concurrent",
        "max_completion_tokens",
        "round_timeout_seconds",
        "min_successful_responses",
    ):
        check.count(key)
    check.non_negative("temperature")
    for key in ("include_analysis", "include_intermediate_responses"):
        check.flag(key)
    for key in ("model", "analysis_template", "synthesis_template", "judge_prompt_version"):
        check.text(key)
    check.names("analysis_models")
    overrides = check.present("analysis_overrides")
    if overrides is not None and not isinstance(overrides, list):
        check.problems.append(
            not_accepted(
                (*base, "analysis_overrides"),
                overrides,
                "a list of {model, temperature, max_completion_tokens}",
            )
        )
    seen: list[str] = []
    for i, item in enumerate(overrides if isinstance(overrides, list) else []):
        sub = _Checker((*base, "analysis_overrides", i), item, OVERRIDE_FIELDS)
        name = sub.present("model")
        if not isinstance(name, str) or not name.strip():
            sub.problems.append(not_accepted((*sub.base, "model"), name, "a non-empty model name"))
        elif name.strip() in seen:
            sub.problems.append(not_accepted((*sub.base, "model"), name, "each model once"))
        else:
            seen.append(name.strip())
        sub.non_negative("temperature")
        sub.count("max_completion_tokens")
        check.problems += sub.problems
    grounding = check.present("grounding")
    if grounding is not None:
        sub = _Checker((*base, "grounding"), grounding, GROUNDING_FIELDS)
        sub.flag("enabled")
        sub.one_of("reference", ("hybrid", "context", "panel"))
        sub.one_of("policy", ("weight", "annotate", "filter"))
        sub.unit("min_score")
        sub.count("min_keep", minimum=0)
        sub.non_negative("nli_contradiction_penalty")
        sub.one_of("on_error", ON_ERROR)
        check.problems += sub.problems
        if runs and not check.problems and _mapping(grounding).get("enabled") is True:
            check.problems.append(
                refusal(
                    (*base, "grounding", "enabled"),
                    "fusion grounding (upstream scores the panel with local hallucination and "
                    "NLI encoder models)",
                    "grounding.enabled: false",
                )
            )
    return check.problems


def workflows_problems(base: Path, block: object, ref_models: Sequence[str]) -> list[Problem]:
    """``ValidateWorkflowsAlgorithmConfig`` (except its ``planner.model`` requirement for mode
    dynamic, which v0.4's bundle does not meet) and the decision rule that static roles' models
    and ``final.model`` are modelRefs."""
    check = _Checker(base, block, WORKFLOWS_FIELDS)
    if block is not None:
        _workflows_block(check, ref_models)
    return check.problems


def _workflows_block(check: _Checker, ref_models: Sequence[str]) -> None:
    base = check.base
    check.one_of("mode", ("static", "dynamic"))
    mode = check.present("mode") or "static"
    planner = _Checker((*base, "planner"), check.present("planner"), PLANNER_FIELDS)
    planner.text("model")
    planner.count("max_completion_tokens")
    final = _Checker((*base, "final"), check.present("final"), FINAL_FIELDS)
    final.text("model")
    final.text("prompt")
    check.problems += planner.problems + final.problems
    for key in (
        "max_steps",
        "max_parallel",
        "max_completion_tokens",
        "round_timeout_seconds",
        "min_successful_responses",
    ):
        check.count(key)
    check.non_negative("temperature")
    check.flag("include_intermediate_responses")
    check.text("template")
    check.one_of("on_error", ON_ERROR)
    roles = check.present("roles")
    # mode dynamic without planner.model: the planner is the decision's first worker (upstream
    # v0.4's own bundle omits it; 3d48f8c9's Go validator required it)
    if mode == "dynamic" and roles:
        check.problems.append(not_accepted((*base, "roles"), roles, "no roles with mode dynamic"))
    if mode == "static":
        if not isinstance(roles, list) or not roles:
            check.problems.append(
                not_accepted((*base, "roles"), roles, "a non-empty list of roles with mode static")
            )
        for i, role in enumerate(roles if isinstance(roles, list) else []):
            sub = _Checker((*base, "roles", i), role, ROLE_FIELDS)
            name = sub.present("name")
            if not isinstance(name, str) or not name.strip():
                sub.problems.append(
                    not_accepted((*sub.base, "name"), name, "a non-empty role name")
                )
            models = sub.names("models")
            if not models and not sub.problems:
                sub.problems.append(not_accepted((*sub.base, "models"), None, "at least one model"))
            for j, model in enumerate(models):
                if model not in ref_models:
                    sub.problems.append(
                        not_accepted(
                            (*sub.base, "models", j), model, "one of the decision's modelRefs"
                        )
                    )
            check.problems += sub.problems
    final_model = final.got.get("model")
    if isinstance(final_model, str) and final_model.strip() and final_model not in ref_models:
        check.problems.append(
            not_accepted((*base, "final", "model"), final_model, "one of the decision's modelRefs")
        )
