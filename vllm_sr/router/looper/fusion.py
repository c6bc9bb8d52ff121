"""The ``fusion`` looper (upstream's ``FusionLooper``): a panel of analysis models answers
the (tool-free) request at once; the judge (``model``, else the first analysis model)
compares the panel's answers (a JSON analysis: consensus, contradictions, partial_coverage,
unique_insights, blind_spots), then writes the final answer from the panel and the analysis,
with the caller's tools.

- The panel: ``analysis_models``, else the modelRefs; at most ``max_concurrent`` at once;
  it ends at ``min_successful_responses`` answers (0: the whole panel), at
  ``round_timeout_seconds`` or at the caller's deadline. ``on_error: fail`` ends the loop at a
  panel failure; ``skip`` goes on with the answers in (none: a failure).
- A failed or unparsable analysis is not fatal: the synthesis goes on without it. A failed
  synthesis fails the loop.
- ``temperature`` and ``max_completion_tokens`` (per model in ``analysis_overrides``) set the
  panel's and judge's calls; ``analysis_template`` / ``synthesis_template`` replace the
  prompts (``{{original}}``, ``{{responses}}``, ``{{analysis}}`` filled in).
- The final answer carries a ``fusion`` trace (the analysis with ``include_analysis``, the
  panel's answers with ``include_intermediate_responses``, the failed models) when any of
  those is on or a model failed."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from vllm_sr.errors import DeadlineExceeded, Unavailable, VllmSrError
from vllm_sr.router.looper.fanout import (
    RoundSpec,
    content_of,
    last_user_text,
    reasoning_of,
    tool_free,
    with_user_turn,
)
from vllm_sr.router.looper.runner import Loop, looper

if TYPE_CHECKING:
    from collections.abc import Sequence

    from vllm_sr.config.looper_fanout_settings import FusionOverride, FusionSettings
    from vllm_sr.jsontypes import JsonObject

ANALYSIS_KEYS = (
    "consensus",
    "contradictions",
    "partial_coverage",
    "unique_insights",
    "blind_spots",
)
ANALYSIS_PROMPT = (
    "You are the Fusion analysis judge. Compare the panel responses and return only valid "
    "JSON with these keys: consensus, contradictions, partial_coverage, unique_insights, "
    "blind_spots. Return compact JSON only: no markdown, no code fences, no prose before or "
    "after the JSON. Each value must be an array with at most two concise strings.\n\n"
    "Original prompt:\n{original}\n\nPanel responses:\n{responses}"
)
FINAL_PROMPT = (
    "You are the Fusion calling model. Produce the final answer for the user using the panel "
    "responses and structured analysis. Resolve contradictions explicitly and do not mention "
    "internal model names unless the user asks.\n\nRules:\n"
    "- Preserve the original output contract exactly.\n"
    "- Do not reveal hidden reasoning, scratch work, panel reasoning, tool traces, or internal "
    "deliberation.\n"
    "- Provide a concise explanation only when the original output contract asks for one.\n\n"
    "Original prompt:\n{original}\n\nStructured analysis:\n{analysis}\n\n"
    "Panel responses:\n{responses}\n\nFinal answer:"
)
NO_ANALYSIS = "No structured analysis is available. Synthesize directly from the panel responses."


def panel_text(panel: Sequence[tuple[str, JsonObject]]) -> str:
    parts = []
    for i, (model, answer) in enumerate(panel, start=1):
        parts.append(f"Response {i} ({model}):\n{content_of(answer)}\n\n")
        if reasoning_of(answer):
            parts.append(f"Reasoning {i} ({model}):\n{reasoning_of(answer)}\n\n")
    return "".join(parts).strip()


def candidates(text: str) -> list[str]:
    """Where a JSON object may be in a model's text: the whole text, a fenced block, the
    outermost braces."""
    out = [text.strip()]
    if "```" in text:
        inner = text.split("```")[1]
        out.append(inner.removeprefix("json").strip())
    if "{" in text and "}" in text:
        out.append(text[text.index("{") : text.rindex("}") + 1])
    return out


def parse_analysis(text: str) -> JsonObject | None:
    """The judge's JSON analysis (the keys upstream reads), or None."""
    for candidate in candidates(text):
        try:
            got = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(got, dict):
            return {k: got[k] for k in ANALYSIS_KEYS if isinstance(got.get(k), list)}
    return None


def render(template: str, original: str, responses: str, analysis: str) -> str:
    return (
        template.replace("{{original}}", original)
        .replace("{{responses}}", responses)
        .replace("{{analysis}}", analysis)
    )


def _asked(
    body: JsonObject, settings: FusionSettings, override: FusionOverride | None
) -> JsonObject:
    out = dict(body)
    temperature = override.temperature if override is not None else None
    if temperature is None:
        temperature = settings.temperature
    if temperature is not None:
        out["temperature"] = temperature
    tokens = override.max_completion_tokens if override is not None else 0
    tokens = tokens or settings.max_completion_tokens
    if tokens > 0:
        out["max_completion_tokens"] = tokens
    return out


@looper("fusion")
async def run_fusion(
    loop: Loop, refs: Sequence[str], body: JsonObject, settings: FusionSettings
) -> None:
    result = loop.result
    panel_models = list(dict.fromkeys(settings.analysis_models or refs))
    if not panel_models:
        raise Unavailable("fusion: no analysis models")
    judge = settings.model or panel_models[0]
    original = last_user_text(body)
    plain = tool_free(body)
    n = len(panel_models)
    spec = RoundSpec(
        max_concurrent=settings.max_concurrent,
        quorum=settings.min_successful_responses,
        timeout_s=settings.round_timeout_seconds,
        on_error=settings.on_error,
    )
    done = await loop.round(
        [(m, _asked(plain, settings, settings.overrides.get(m))) for m in panel_models], spec
    )
    failed: list[object] = [{"model": m, "error": e} for m, e in done.failures]
    if done.cut_short:
        failed.append({"model": "panel", "error": done.cut_short})
        if settings.on_error == "fail" or not done.answers:
            raise (DeadlineExceeded if done.cut_short == "deadline" else Unavailable)(
                f"fusion panel: {done.cut_short} before any answer"
                if not done.answers
                else f"fusion panel: {done.cut_short}"
            )
    if not done.answers:
        raise Unavailable(f"fusion panel failed: all {n} analysis models failed")
    panel = [(g.model, g.answer) for g in done.answers]
    responses = panel_text(panel)
    analysis = await _analysis(loop, plain, settings, judge, original, responses)
    if analysis is None or analysis.get("parse_failed"):
        analysis_text = NO_ANALYSIS
    else:
        analysis_text = json.dumps(analysis, indent=2)
    if settings.synthesis_template:
        prompt = render(settings.synthesis_template, original, responses, analysis_text)
    else:
        prompt = FINAL_PROMPT.format(original=original, analysis=analysis_text, responses=responses)
    loop.check_deadline()  # the deadline passed: no synthesis starts
    final_body = _asked(with_user_turn({**body, "stream": False}, prompt), settings, None)
    final_body.pop("stream_options", None)
    try:
        final = await loop.ask(judge, final_body)
    except VllmSrError as exc:
        raise Unavailable(
            f"fusion final synthesis failed for judge model {judge!r}: {exc}"
        ) from None
    result.answer, result.model = final.answer, final.model
    result.iterations = n + 2  # as upstream: the panel, the analysis, the synthesis
    result.models_used = list(dict.fromkeys([*panel_models, judge]))
    if settings.include_analysis or settings.include_intermediate_responses or failed:
        trace: dict[str, object] = {
            "judge_model": judge,
            "analysis_models": panel_models,
            "prompt_version": settings.judge_prompt_version,
        }
        if failed:
            trace["failed_models"] = failed
        if settings.include_analysis and analysis is not None:
            trace["analysis"] = analysis
        if settings.include_intermediate_responses:
            trace["responses"] = [
                {"model": m, "content": content_of(a)}
                | ({"reasoning": reasoning_of(a)} if reasoning_of(a) else {})
                for m, a in panel
            ]
        result.extra["fusion"] = trace


async def _analysis(
    loop: Loop,
    plain: JsonObject,
    settings: FusionSettings,
    judge: str,
    original: str,
    responses: str,
) -> JsonObject | None:
    """The judge's analysis of the panel (None: the call failed; ``parse_failed`` with the
    raw text: not JSON)."""
    if settings.analysis_template:
        prompt = render(settings.analysis_template, original, responses, "")
    else:
        prompt = ANALYSIS_PROMPT.format(original=original, responses=responses)
    try:
        got = await loop.ask(judge, _asked(with_user_turn(plain, prompt), settings, None))
    except VllmSrError:
        return None
    text = content_of(got.answer)
    parsed = parse_analysis(text)
    return parsed if parsed is not None else {"raw": text, "parse_failed": True}
