"""The fan-out loopers' settings (``ratings``, ``remom``, ``fusion``, ``workflows``) as the
loopers run them (vllm_sr/router/looper): read from a block
:mod:`vllm_sr.config.looper_fanout_checks` accepted, with upstream's defaults and merges
(``resolveFusionExecutionConfig``, ``resolveWorkflowsExecutionConfig``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_sr.config.routing_base import as_dict, is_int, is_number

DEFAULT_JUDGE_PROMPT_VERSION = "fusion-v1"


def _int(value: object, default: int = 0) -> int:
    return value if is_int(value) else default


def _float(value: object) -> float | None:
    return float(value) if is_number(value) else None


def _str(value: object) -> str:
    return value.strip() if isinstance(value, str) else ""


@dataclass(frozen=True)
class RatingsSettings:
    max_concurrent: int = 0  # 0: every modelRef at once
    on_error: str = "skip"

    @classmethod
    def from_block(cls, block: object) -> RatingsSettings:
        got = as_dict(block)
        return cls(_int(got.get("max_concurrent")), _str(got.get("on_error")) or "skip")


@dataclass(frozen=True)
class RemomSettings:
    """Upstream's defaults when the block is absent: breadth [4], weighted, temperature 1.0,
    seed 42, intermediate responses included; with a block, its unset fields are zero."""

    breadth_schedule: tuple[int, ...] = (4,)
    model_distribution: str = "weighted"
    temperature: float = 1.0
    include_reasoning: bool = False
    compaction_strategy: str = "full"
    compaction_tokens: int = 1000
    synthesis_template: str = ""
    synthesis_model: str = ""
    max_concurrent: int = 0
    max_completion_tokens: int | None = None
    round_timeout_seconds: int = 0
    min_successful_responses: int = 0
    on_error: str = "skip"
    shuffle_seed: int = 42
    include_intermediate_responses: bool = True
    max_responses_per_round: int = 0

    @classmethod
    def from_block(cls, block: object) -> RemomSettings:
        if block is None:
            return cls()
        got = as_dict(block)
        schedule = got.get("breadth_schedule")
        tokens = got.get("max_completion_tokens")
        return cls(
            breadth_schedule=tuple(_int(b, 1) for b in schedule)
            if isinstance(schedule, list)
            else (4,),
            model_distribution=_str(got.get("model_distribution")) or "weighted",
            temperature=_float(got.get("temperature")) or 0.0,
            include_reasoning=got.get("include_reasoning") is True,
            compaction_strategy=_str(got.get("compaction_strategy")) or "full",
            compaction_tokens=_int(got.get("compaction_tokens")),
            synthesis_template=_str(got.get("synthesis_template")),
            synthesis_model=_str(got.get("synthesis_model")),
            max_concurrent=_int(got.get("max_concurrent")),
            max_completion_tokens=tokens if is_int(tokens) else None,
            round_timeout_seconds=_int(got.get("round_timeout_seconds")),
            min_successful_responses=_int(got.get("min_successful_responses")),
            on_error=_str(got.get("on_error")) or "skip",
            shuffle_seed=_int(got.get("shuffle_seed")),
            include_intermediate_responses=got.get("include_intermediate_responses") is True,
            max_responses_per_round=_int(got.get("max_responses_per_round")),
        )


@dataclass(frozen=True)
class FusionOverride:
    temperature: float | None = None
    max_completion_tokens: int = 0


@dataclass(frozen=True)
class FusionSettings:
    """The block as upstream merges it (``resolveFusionExecutionConfig``): ``analysis_models``
    else the modelRefs; ``model`` (the judge) else the first analysis model; max_concurrent
    and min_successful_responses 0 or above the panel size mean the whole panel."""

    model: str = ""
    analysis_models: tuple[str, ...] = ()
    overrides: dict[str, FusionOverride] = field(default_factory=dict)
    max_concurrent: int = 0
    max_completion_tokens: int = 0
    round_timeout_seconds: int = 0
    min_successful_responses: int = 0
    temperature: float | None = None
    include_analysis: bool = True
    include_intermediate_responses: bool = True
    on_error: str = "skip"
    analysis_template: str = ""
    synthesis_template: str = ""
    judge_prompt_version: str = DEFAULT_JUDGE_PROMPT_VERSION

    @classmethod
    def from_block(cls, block: object) -> FusionSettings:
        got = as_dict(block)
        models = got.get("analysis_models")
        overrides = {}
        items = got.get("analysis_overrides")
        for item in items if isinstance(items, list) else []:
            sub = as_dict(item)
            overrides[_str(sub.get("model"))] = FusionOverride(
                _float(sub.get("temperature")), _int(sub.get("max_completion_tokens"))
            )
        return cls(
            model=_str(got.get("model")),
            analysis_models=tuple(_str(m) for m in models) if isinstance(models, list) else (),
            overrides=overrides,
            max_concurrent=_int(got.get("max_concurrent")),
            max_completion_tokens=_int(got.get("max_completion_tokens")),
            round_timeout_seconds=_int(got.get("round_timeout_seconds")),
            min_successful_responses=_int(got.get("min_successful_responses")),
            temperature=_float(got.get("temperature")),
            include_analysis=got.get("include_analysis") is not False,
            include_intermediate_responses=got.get("include_intermediate_responses") is not False,
            on_error=_str(got.get("on_error")) or "skip",
            analysis_template=_str(got.get("analysis_template")),
            synthesis_template=_str(got.get("synthesis_template")),
            judge_prompt_version=_str(got.get("judge_prompt_version"))
            or DEFAULT_JUDGE_PROMPT_VERSION,
        )


@dataclass(frozen=True)
class WorkflowRole:
    name: str
    models: tuple[str, ...]
    prompt: str = ""
    access_list: tuple[str, ...] | None = None  # None: every earlier step's outputs


@dataclass(frozen=True)
class WorkflowsSettings:
    """The block as upstream resolves it (``resolveWorkflowsExecutionConfig``): mode static,
    template micro_agent, planner max_completion_tokens 2048, max_steps 3, max_parallel 2,
    intermediate responses included, on_error **fail**, unless the block says otherwise."""

    mode: str = "static"
    template: str = "micro_agent"
    planner_model: str = ""  # "" with mode dynamic: the first worker plans
    planner_max_completion_tokens: int = 2048
    roles: tuple[WorkflowRole, ...] = ()
    final_model: str = ""
    final_prompt: str = ""
    max_steps: int = 3
    max_parallel: int = 2
    max_completion_tokens: int = 0
    round_timeout_seconds: int = 0
    min_successful_responses: int = 0
    temperature: float | None = None
    include_intermediate_responses: bool = True
    on_error: str = "fail"

    @classmethod
    def from_block(cls, block: object) -> WorkflowsSettings:
        got = as_dict(block)
        planner, final = as_dict(got.get("planner")), as_dict(got.get("final"))
        items = got.get("roles")
        roles = []
        for item in items if isinstance(items, list) else []:
            role = as_dict(item)
            models = role.get("models")
            access = role.get("access_list")
            roles.append(
                WorkflowRole(
                    _str(role.get("name")),
                    tuple(_str(m) for m in models) if isinstance(models, list) else (),
                    _str(role.get("prompt")),
                    tuple(_str(a) for a in access) if isinstance(access, list) else None,
                )
            )
        default = cls()
        return cls(
            mode=_str(got.get("mode")) or default.mode,
            template=_str(got.get("template")) or default.template,
            planner_model=_str(planner.get("model")),
            planner_max_completion_tokens=_int(planner.get("max_completion_tokens"))
            or default.planner_max_completion_tokens,
            roles=tuple(roles),
            final_model=_str(final.get("model")),
            final_prompt=_str(final.get("prompt")),
            max_steps=_int(got.get("max_steps")) or default.max_steps,
            max_parallel=_int(got.get("max_parallel")) or default.max_parallel,
            max_completion_tokens=_int(got.get("max_completion_tokens")),
            round_timeout_seconds=_int(got.get("round_timeout_seconds")),
            min_successful_responses=_int(got.get("min_successful_responses")),
            temperature=_float(got.get("temperature")),
            include_intermediate_responses=got.get("include_intermediate_responses") is not False,
            on_error=_str(got.get("on_error")) or default.on_error,
        )
