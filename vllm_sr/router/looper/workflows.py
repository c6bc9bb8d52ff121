"""The ``workflows`` looper (upstream's ``WorkflowsLooper``, "Router Flow"): a plan of steps,
each run by one or more worker models at once, then a final synthesis.

- The plan: ``mode: static`` turns ``roles`` into steps (id from the name, upstream's prompt
  per role name unless given); ``mode: dynamic`` asks ``planner.model`` (none given: the
  first worker, as v0.4's bundle leaves it out) for a JSON plan (upstream's planner prompt;
  ``response_format: json_object``). A plan is checked: 1 to
  ``max_steps`` steps, 1 to ``max_parallel`` models per step, each a modelRef, an
  ``access_list`` naming only earlier steps or agents, a final model among the modelRefs. A
  dynamic plan that cannot be read or fails the check is replaced, with ``on_error: skip``,
  by upstream's fallback plan (one step: the first ``max_parallel`` modelRefs solve the
  request); otherwise the chat fails.
- A step: its prompt (upstream's "Router Flow step" text, with the outputs of the earlier
  steps it may read and the original request) as a user turn after the conversation, sent
  to its models at once; it ends at ``min_successful_responses`` answers (0: all), at
  ``round_timeout_seconds`` or at the caller's deadline. A failed model is skipped
  (``fail``: the chat fails); a step with no answer fails the chat.
- The final synthesis: the plan's final model, else ``final.model``, else the planner, else
  the first worker that answered; upstream's synthesizer prompt over every step's outputs.
  If it fails, ``skip`` answers with the latest step answer that has content or reasoning,
  ``fail`` fails the chat.
- Internal calls are tool-free (upstream's tool-calling steps, pending tool state and resume
  are not run). The answer carries a ``flow`` trace (mode, template, planner, workers, failed
  models; the plan and the steps' answers with ``include_intermediate_responses``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from vllm_sr.errors import DeadlineExceeded, Unavailable, VllmSrError
from vllm_sr.router.looper.fanout import (
    Answered,
    RoundSpec,
    content_of,
    last_user_text,
    reasoning_of,
    tool_free,
    with_user_turn,
)
from vllm_sr.router.looper.fusion import candidates
from vllm_sr.router.looper.runner import Loop, looper

if TYPE_CHECKING:
    from collections.abc import Sequence

    from vllm_sr.config.looper_fanout_settings import WorkflowsSettings
    from vllm_sr.jsontypes import JsonObject

STEP_PROMPT = "Work on the original user request and provide a concise, useful result."
ROLE_PROMPTS = {
    **dict.fromkeys(
        ("thinker", "plan", "planner"),
        "Break down the request, identify constraints, and call out risks or missing assumptions.",
    ),
    **dict.fromkeys(
        ("worker", "solver"),
        "Solve the request independently with concrete reasoning, code, or evidence as needed.",
    ),
    **dict.fromkeys(
        ("verifier", "reviewer", "critic"),
        "Check prior outputs against the original request, find mistakes, and provide corrections.",
    ),
}
ROLE_PROMPT = (
    "Work on the original request according to this role and provide a concise, useful result."
)
STATIC_FINAL = (
    "Synthesize the role outputs into one final answer. Prefer correct, tested, and specific "
    "details. Do not mention internal model names unless the user asks."
)
FALLBACK_STEP = (
    "Solve the original user request directly. Preserve any required output format exactly."
)
FALLBACK_FINAL = (
    "Synthesize the worker answer into the final response. Preserve any constrained output "
    "format exactly."
)
DEFAULT_FINAL = "Synthesize the workflow outputs into the best final answer for the user."
PLANNER_PROMPT = """You are the Router Flow planner. Create a compact execution plan for a \
bounded multi-agent workflow.

Return only valid JSON. Do not include markdown, prose, XML tags, or chain-of-thought.
The first non-whitespace character must be "{{" and the last non-whitespace character must \
be "}}".

Available worker models, and the only worker models you may use:
{models}

Limits:
- steps: 1 to {max_steps}
- models per step: 1 to {max_parallel}
- every step model must exactly match one available worker model

Planning rules:
- Preserve the user's requested deliverable. If the user asks to design,
  explain, diagnose, or write code, plan work that produces that deliverable;
  do not claim that actions were already executed.
- A step may include "access_list" with earlier step ids whose outputs it may
  read. It may also include earlier agent ids using the format
  "<step-id>:<model-index>:<model-name>" when only one worker output should be
  exposed from a parallel step. Omit access_list to read all earlier step
  outputs. Use [] to isolate a step from prior outputs.
- For coding, debugging, math, or contested reasoning tasks, include a focused
  verification or synthesis instruction unless the task is trivial.

- The final synthesis instruction should tell the final model to check the
  worker outputs against the original request and correct contradictions.

JSON schema:
{{
  "steps": [
    {{
      "id": "short-id",
      "role": "thinker|worker|verifier",
      "models": ["one-or-more-available-worker-models"],
      "prompt": "focused instruction for this step",
      "access_list": ["optional-earlier-step-or-agent-id"]
    }}
  ],
  "final": {{
    "prompt": "instruction for final synthesis"
  }}
}}

Original user request:
{original}"""
FINAL_PROMPT = """You are the Router Flow final synthesizer.

Instruction:
{instruction}

Rules:
- Answer the original user request directly; do not describe internal workflow execution.
- Treat workflow outputs as evidence, not authority. Check math, code, and logic
  against the original request and correct contradictions.
- Preserve any constrained output format exactly. If the user asks for only a
  letter, option, JSON object, code block, patch, or other strict format, output
  only that format.
- Do not reveal hidden reasoning, scratch work, panel reasoning, tool traces,
  workflow traces, or internal deliberation. Provide a concise explanation only
  when the original output contract asks for one.
- Preserve requested deliverables such as code, tests, diagnosis, interval
  reasoning, or a workflow design.
- If a worker output is truncated or incomplete, complete the answer from the
  original request and the usable evidence.
- Do not mention internal model names or workflow steps unless the user asks.

Original user request:
{original}

Workflow outputs:
{outputs}

Final answer:"""


@dataclass(frozen=True)
class Step:
    id: str
    role: str
    models: tuple[str, ...]
    prompt: str
    access_list: tuple[str, ...] | None = None

    def agent(self, model: str) -> str:
        """Upstream's agent id: ``<step-id>:<model-index>:<model>``."""
        index = self.models.index(model) if model in self.models else 0
        return f"{self.id}:{index}:{model}"

    def trace(self) -> dict[str, object]:
        out: dict[str, object] = {
            "id": self.id,
            "role": self.role,
            "models": list(self.models),
            "prompt": self.prompt,
        }
        if self.access_list is not None:
            out["access_list"] = list(self.access_list)
        return out


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    final_model: str = ""
    final_prompt: str = ""


@dataclass
class StepResult:
    step: Step
    answers: list[Answered]
    failed: list[tuple[str, str]]


def static_plan(settings: WorkflowsSettings) -> Plan:
    steps = []
    for i, role in enumerate(settings.roles):
        step_id = role.name.lower().replace(" ", "-").replace("_", "-") or f"role-{i + 1}"
        prompt = role.prompt or ROLE_PROMPTS.get(role.name.lower(), ROLE_PROMPT)
        steps.append(Step(step_id, role.name, role.models, prompt, role.access_list))
    return Plan(tuple(steps), settings.final_model, settings.final_prompt or STATIC_FINAL)


def fallback_plan(workers: Sequence[str], settings: WorkflowsSettings) -> Plan:
    models = tuple(workers[: settings.max_parallel] if settings.max_parallel else workers)
    return Plan((Step("fallback_solve", "worker", models, FALLBACK_STEP),), "", FALLBACK_FINAL)


def _names(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(dict.fromkeys(v.strip() for v in value if isinstance(v, str) and v.strip()))


def parse_plan(text: str) -> Plan | None:
    """The planner's JSON plan (upstream's ``workflowPlan``), or None."""
    for candidate in candidates(text):
        try:
            got = json.loads(candidate)
        except ValueError:
            continue
        if not isinstance(got, dict) or not isinstance(got.get("steps"), list):
            continue
        steps = []
        for item in got["steps"]:
            raw = item if isinstance(item, dict) else {}
            access = raw.get("access_list")
            steps.append(
                Step(
                    str(raw.get("id") or "").strip(),
                    str(raw.get("role") or "").strip(),
                    _names(raw.get("models")),
                    str(raw.get("prompt") or "").strip(),
                    _names(access) if isinstance(access, list) else None,
                )
            )
        final = got.get("final") if isinstance(got.get("final"), dict) else {}
        assert isinstance(final, dict)
        return Plan(
            tuple(steps),
            str(final.get("model") or "").strip(),
            str(final.get("prompt") or "").strip(),
        )
    return None


def checked_plan(plan: Plan, workers: Sequence[str], settings: WorkflowsSettings) -> Plan:
    """Upstream's ``validateWorkflowPlan``, filling in step ids, roles and prompts; raises
    Unavailable naming what is wrong."""
    if not plan.steps:
        raise Unavailable("workflows plan must include at least one step")
    if len(plan.steps) > settings.max_steps:
        raise Unavailable(
            f"workflows plan has {len(plan.steps)} steps, exceeding max_steps={settings.max_steps}"
        )
    seen: set[str] = set()
    steps = []
    for i, step in enumerate(plan.steps):
        step = replace(
            step,
            id=step.id or f"step-{i + 1}",
            role=step.role or "worker",
            prompt=step.prompt or STEP_PROMPT,
        )
        if not step.models:
            raise Unavailable(f"workflows plan step {step.id!r} must include at least one model")
        if len(step.models) > settings.max_parallel:
            raise Unavailable(
                f"workflows plan step {step.id!r} has {len(step.models)} models, exceeding "
                f"max_parallel={settings.max_parallel}"
            )
        for model in step.models:
            if model not in workers:
                raise Unavailable(
                    f"workflows plan step {step.id!r} references model {model!r} outside "
                    "decision modelRefs"
                )
        for ref in step.access_list or ():
            if ref not in seen:
                raise Unavailable(
                    f"workflows plan step {step.id!r} access_list references unknown or future "
                    f"step/agent {ref!r}"
                )
        seen.add(step.id)
        seen.update(step.agent(m) for m in step.models)
        steps.append(step)
    if plan.final_model and plan.final_model not in workers:
        raise Unavailable(
            f"workflows final model {plan.final_model!r} is outside decision modelRefs"
        )
    return replace(plan, steps=tuple(steps))


def outputs_text(results: Sequence[StepResult]) -> str:
    lines = []
    for result in results:
        lines.append(f"Step {result.step.id} ({result.step.role}):")
        for got in result.answers:
            lines.append(
                f"- {result.step.agent(got.model)} [{got.model}]: {content_of(got.answer)}"
            )
            if reasoning_of(got.answer):
                lines.append(f"  reasoning: {reasoning_of(got.answer)}")
    return "\n".join(lines).strip()


def visible(step: Step, previous: Sequence[StepResult]) -> list[StepResult]:
    """The earlier steps' outputs a step may read (its access_list; None: all)."""
    if step.access_list is None:
        return list(previous)
    allowed = set(step.access_list)
    out = []
    for result in previous:
        if result.step.id in allowed:
            out.append(result)
            continue
        answers = [a for a in result.answers if result.step.agent(a.model) in allowed]
        if answers:
            out.append(StepResult(result.step, answers, result.failed))
    return out


def step_prompt(step: Step, previous: Sequence[StepResult], original: str) -> str:
    text = f'Router Flow step "{step.id}" ({step.role}).\n\nInstruction:\n{step.prompt}\n'
    shown = visible(step, previous)
    if shown:
        text += f"\nAccessible prior step outputs:\n{outputs_text(shown)}\n"
    if original:
        text += f"\nOriginal user request:\n{original}\n"
    return text


def _asked(body: JsonObject, settings: WorkflowsSettings, planner: str = "") -> JsonObject:
    """The body of a step or final call; of the planner's call when ``planner`` names it."""
    out = dict(body)
    if settings.temperature is not None:
        out["temperature"] = settings.temperature
    if settings.max_completion_tokens > 0:
        out["max_completion_tokens"] = settings.max_completion_tokens
    if planner:
        out["max_completion_tokens"] = settings.planner_max_completion_tokens
        out["response_format"] = {"type": "json_object"}
        name = planner.lower()
        kwargs = {}
        if "qwen" in name or "qwq" in name:
            kwargs["enable_thinking"] = False
        if "deepseek" in name:
            kwargs["thinking"] = False
        if kwargs:
            out["chat_template_kwargs"] = kwargs
    return out


@looper("workflows")
async def run_workflows(
    loop: Loop, workers: Sequence[str], body: JsonObject, settings: WorkflowsSettings
) -> None:
    result = loop.result
    original = last_user_text(body)
    plain = tool_free(body)
    planner_used = False
    dynamic = settings.mode == "dynamic"
    planner = settings.planner_model or (workers[0] if dynamic and workers else "")
    if dynamic:
        prompt = PLANNER_PROMPT.format(
            models="\n".join(workers),
            max_steps=settings.max_steps,
            max_parallel=settings.max_parallel,
            original=original,
        )
        asked = _asked(with_user_turn(plain, prompt), settings, planner=planner)
        try:
            planned = await loop.ask(planner, asked)
        except VllmSrError as exc:
            raise Unavailable(f"workflow planner {planner!r} failed: {exc}") from None
        planner_used = True
        plan = parse_plan(content_of(planned.answer)) or parse_plan(reasoning_of(planned.answer))
    else:
        plan = static_plan(settings)
    plan = _with_final(plan, settings) if plan is not None else None
    try:
        if plan is None:
            raise Unavailable(f"workflow planner {planner!r} returned invalid plan")
        plan = checked_plan(plan, workers, settings)
    except Unavailable:
        if not dynamic or settings.on_error != "skip":
            raise
        plan = checked_plan(
            _with_final(fallback_plan(workers, settings), settings), workers, settings
        )
    results = await _steps(loop, plan, plain, original, settings)
    final_model = plan.final_model or settings.final_model or planner or results[0].answers[0].model
    prompt = FINAL_PROMPT.format(
        instruction=plan.final_prompt or DEFAULT_FINAL,
        original=original,
        outputs=outputs_text(results),
    )
    final = await _final(loop, final_model, with_user_turn(plain, prompt), settings)
    if final is None:  # skip: the latest step answer with content or reasoning
        final = fallback_answer(results)
    result.answer, result.model = final.answer, final.model
    failed = [{"model": m, "error": e} for r in results for m, e in r.failed]
    result.iterations = 1 + planner_used + sum(len(r.answers) + len(r.failed) for r in results)
    used = [planner] if planner else []
    used += [a.model for r in results for a in r.answers] + [final.model]
    result.models_used = list(dict.fromkeys(used))
    if settings.include_intermediate_responses or failed:
        trace: dict[str, object] = {
            "mode": settings.mode,
            "template": settings.template,
            "worker_models": list(workers),
        }
        if planner:
            trace["planner_model"] = planner
        if settings.include_intermediate_responses:
            trace["plan"] = {
                "steps": [s.trace() for s in plan.steps],
                "final": {"model": plan.final_model, "prompt": plan.final_prompt},
            }
            trace["steps"] = [
                {
                    **r.step.trace(),
                    "responses": [
                        {
                            "agent_id": r.step.agent(a.model),
                            "model": a.model,
                            "content": content_of(a.answer),
                        }
                        for a in r.answers
                    ],
                }
                for r in results
            ]
        if failed:
            trace["failed_models"] = failed
        result.extra["flow"] = trace


def fallback_answer(results: Sequence[StepResult]) -> Answered:
    """Upstream's ``workflowFallbackFinalResponse``: the latest step answer with content or
    reasoning (its usage already counted with its step)."""
    for result in reversed(results):
        for got in reversed(result.answers):
            if content_of(got.answer).strip() or reasoning_of(got.answer).strip():
                return Answered(got.index, got.model, {**got.answer, "usage": {}})
    raise Unavailable("workflow final synthesis failed and no step answer has content")


def _with_final(plan: Plan, settings: WorkflowsSettings) -> Plan:
    """The configured ``final`` overrides the plan's (upstream's applyConfiguredWorkflowFinal)."""
    return replace(
        plan,
        final_model=settings.final_model or plan.final_model,
        final_prompt=settings.final_prompt or plan.final_prompt,
    )


async def _steps(
    loop: Loop, plan: Plan, plain: JsonObject, original: str, settings: WorkflowsSettings
) -> list[StepResult]:
    results: list[StepResult] = []
    for step in plan.steps:
        asked = _asked(with_user_turn(plain, step_prompt(step, results, original)), settings)
        spec = RoundSpec(
            max_concurrent=settings.max_parallel,
            quorum=settings.min_successful_responses,
            timeout_s=settings.round_timeout_seconds,
            on_error=settings.on_error,
        )
        running = loop.round([(m, asked) for m in step.models], spec)  # the deadline: as is
        try:
            done = await running
        except VllmSrError as exc:
            raise Unavailable(f"workflow step {step.id!r} failed: {exc}") from None
        if not done.answers or (done.cut_short and settings.on_error == "fail"):
            if done.cut_short == "deadline":
                raise DeadlineExceeded(f"workflow step {step.id!r}: the deadline passed")
            raise Unavailable(f"workflow step {step.id!r} failed: all models failed")
        results.append(StepResult(step, done.answers, done.failures))
    return results


async def _final(
    loop: Loop, model: str, asked: JsonObject, settings: WorkflowsSettings
) -> Answered | None:
    """The final synthesis, its answer counted (None: it failed and ``skip`` takes the
    fallback answer)."""
    try:
        spec = RoundSpec(timeout_s=settings.round_timeout_seconds, on_error="fail")
        done = await loop.round([(model, _asked(asked, settings))], spec)
        if done.answers:
            return done.answers[0]
        error: VllmSrError = Unavailable(f"workflow final synthesis {done.cut_short}")
    except VllmSrError as exc:
        error = exc
    if settings.on_error == "skip":
        return None
    raise Unavailable(f"workflow final synthesis failed for model {model!r}: {error}")
