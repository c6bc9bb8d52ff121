"""The ``prompt`` selector (upstream's ``pkg/selection/prompt.go`` and
``pkg/extproc/req_filter_prompt_selector.go`` at 3d48f8c9): a helper LLM picks one of the
decision's candidates.

The helper call: system = the block's ``instructions``, then ``Choose exactly one candidate
from this list:`` and a line ``- <model>[: <modelCard description>]`` per candidate, then
``Return only JSON: {"selected_model":"<exact candidate name>","rationale":"<short reason>"}.``;
user = the request's text; ``temperature: 0``, ``max_completion_tokens: 512``,
``response_format: {"type": "json_object"}``, and for a model whose name contains ``qwen`` or
``qwq`` ``chat_template_kwargs: {"enable_thinking": false}``.

Upstream sends it to its looper endpoint (its own proxy). vllm-sr is the proxy, so it sends it
to the helper model's backends itself: the same outbound client, backend pick, retries on the
model's other backends and ejection as any chat (``BackendSet.proxy``), the caller's credential
when the backend has none, within ``timeout_seconds`` (0: 5 s) and what is left of the
caller's deadline (``X-Request-Timeout-Ms``), whichever ends first. It is no chat of its own:
no routing, no plugins, no response cache, no replay record (its latency is observed for the
helper model, as any answer of it is).

The answer must be a JSON object with exactly ``selected_model`` and ``rationale``, both
non-empty, naming a candidate's ``model``; anything else fails the selection, and the chat goes
to the first candidate (``selection_status`` would say fallback; the reason is logged as
upstream's ``selector_invocation_failed``, ``selector_timeout``, ``selector_invalid_output``
or ``selector_undeclared_candidate``)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_sr.errors import DeadlineExceeded, VllmSrError
from vllm_sr.httpserver import Request, Response
from vllm_sr.jsontypes import JsonObject, json_object, json_str
from vllm_sr.router.backend_proxy import AttemptFailed, Exchange
from vllm_sr.router.selection.selectors import Selection

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from vllm_sr.config.routing import ModelRef
    from vllm_sr.config.selection_prompt import PromptSettings
    from vllm_sr.router.backends import BackendSet

MAX_COMPLETION_TOKENS = 512
CHAT_PATH = "/v1/chat/completions"


class PromptFailed(Exception):
    """The helper could not choose; ``reason`` is upstream's fallback reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


@dataclass(frozen=True)
class HelperUsage:
    model: str
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    latency_ms: int


def system_prompt(
    instructions: str, refs: Sequence[ModelRef], descriptions: Mapping[str, str]
) -> str:
    lines = [instructions.strip(), "", "Choose exactly one candidate from this list:"]
    for ref in refs:
        description = descriptions.get(ref.model, "").strip()
        lines.append(f"- {ref.model}: {description}" if description else f"- {ref.model}")
    text = "\n".join(lines) + "\n"
    return (
        text + 'Return only JSON: {"selected_model":"<exact candidate name>",'
        '"rationale":"<short reason>"}.'
    )


def helper_body(settings: PromptSettings, system: str, query: str) -> JsonObject:
    body: JsonObject = {
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": query},
        ],
        "max_completion_tokens": MAX_COMPLETION_TOKENS,
        "temperature": 0,
        "response_format": {"type": "json_object"},
        "stream": False,
    }
    name = settings.model.lower()
    if "qwen" in name or "qwq" in name:
        body["chat_template_kwargs"] = {"enable_thinking": False}
    return body


def parse_choice(content: str) -> tuple[str, str]:
    """(selected_model, rationale) from the helper's reply; PromptFailed otherwise."""
    try:
        doc = json.loads(content.strip())
    except ValueError:
        raise PromptFailed("selector_invalid_output", "JSON decode failed") from None
    obj = json_object(doc)
    if obj is None or set(obj) != {"selected_model", "rationale"}:
        raise PromptFailed("selector_invalid_output", "unexpected response fields")
    model, rationale = json_str(obj["selected_model"]), json_str(obj["rationale"])
    if model is None or rationale is None:
        raise PromptFailed("selector_invalid_output", "response decode failed")
    if not model.strip() or not rationale.strip():
        raise PromptFailed("selector_invalid_output", "empty required field")
    return model.strip(), rationale.strip()


def pick(refs: Sequence[ModelRef], model: str, rationale: str) -> Selection:
    for ref in refs:
        if ref.model == model:
            scores = {r.model: 1.0 if r.model == model else 0.0 for r in refs}
            return Selection(ref, "prompt", f"prompt: {rationale}", scores)
    raise PromptFailed("selector_undeclared_candidate", f"{model!r} is not a candidate")


def answer_content(raw: bytes) -> tuple[str, JsonObject]:
    """The first choice's message content and the usage of a chat answer."""
    try:
        doc = json_object(json.loads(raw))
    except ValueError:
        doc = None
    if doc is None:
        raise PromptFailed("selector_invocation_failed", "the helper's answer is not JSON")
    choices = doc.get("choices")
    first = json_object(choices[0]) if isinstance(choices, list) and choices else None
    message = json_object(first.get("message")) if first is not None else None
    content = json_str(message.get("content")) if message is not None else None
    if content is None:
        raise PromptFailed("selector_invocation_failed", "the helper's answer has no content")
    return content, json_object(doc.get("usage")) or {}


async def ask_helper(
    backends: BackendSet,
    settings: PromptSettings,
    body: JsonObject,
    caller_headers: Mapping[str, str],
    deadline: float | None,
) -> tuple[str, HelperUsage]:
    """The helper's reply content, through the helper model's backends (retried on its other
    backends as a chat is), by ``deadline`` (a clock time: the earlier of the block's timeout
    and the caller's deadline)."""
    from vllm_sr.router.fallback import Attempts  # fallback imports route, which imports us

    attempts = Attempts([(settings.model, None)], backends, deadline)
    request = Request("POST", CHAT_PATH, "", dict(caller_headers), b"")
    started = time.perf_counter()
    while (step := attempts.next()) is not None:
        _, model, _, backend = step
        left = attempts.remaining()
        if left is not None and left <= 0:
            break
        try:
            exchange = Exchange(
                dict(body),
                request,
                {},
                early_failure=attempts.more_after(backend),
                first_byte_timeout_s=left,
            )
            answer = await backends.proxy(backend, exchange)
        except AttemptFailed as exc:
            attempts.record(backend, exc)
            continue
        except DeadlineExceeded as exc:  # the last backend's own failure
            raise PromptFailed("selector_timeout", exc.message) from None
        except VllmSrError as exc:
            raise PromptFailed("selector_invocation_failed", exc.message) from None
        if not isinstance(answer, Response) or answer.status >= 400:
            raise PromptFailed(
                "selector_invocation_failed",
                f"the helper {model} answered {answer.status}"
                + ("" if isinstance(answer, Response) else " as a stream"),
            )
        content, usage = answer_content(answer.body)
        elapsed_ms = int((time.perf_counter() - started) * 1000)
        return content, HelperUsage(
            model,
            _int(usage.get("prompt_tokens")),
            _int(usage.get("completion_tokens")),
            _int(usage.get("total_tokens")),
            elapsed_ms,
        )
    last = attempts.last
    if attempts.remaining() is not None and (attempts.remaining() or 0.0) <= 0:
        raise PromptFailed("selector_timeout", "the helper did not answer in time")
    raise PromptFailed(
        "selector_invocation_failed",
        f"the helper {settings.model} failed: {last.reason if last else 'no backend'}",
    )


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
