"""The :class:`~vllm_sr.router.request_view.RequestView` of an ``/api/v1/eval`` payload, as
upstream's eval reads one (``services/intent_request_messages.go``). It differs from a chat's
in small ways upstream has too: roles are compared trimmed and lowercased, texts are trimmed,
``input_text`` parts count as text, an image-only user turn keeps the previous user text, and a
payload ``text`` fills in when the messages carry none.
"""

from __future__ import annotations

from collections.abc import Mapping

from vllm_sr.errors import InvalidRequest
from vllm_sr.jsontypes import JsonObject, json_type
from vllm_sr.router.context_estimate import request_token_floor
from vllm_sr.router.message_text import EVAL, message_text
from vllm_sr.router.request_view import (
    EVAL_MODALITY_PARTS,
    ChatWalk,
    ConversationFacts,
    RequestView,
    check_metadata,
    input_modalities,
    tool_choice_flags,
)

ESTIMATE_FIELDS = (
    "tools",
    "functions",
    "tool_choice",
    "function_call",
    "response_format",
    "max_tokens",
    "max_completion_tokens",
)
EVAL_IMAGE_TYPES = frozenset({"image_url", "input_image"})


def _parts(content: object) -> list[Mapping[str, object]]:
    if isinstance(content, list):
        return [p for p in content if isinstance(p, Mapping)]
    if isinstance(content, Mapping):
        return [content]
    return []


def _kind(part: Mapping[str, object]) -> str:
    kind = part.get("type")
    return kind.strip().lower() if isinstance(kind, str) else ""


def image_count(content: object) -> int:
    return sum(1 for p in _parts(content) if _kind(p) in EVAL_IMAGE_TYPES)


def first_data_image(content: object) -> str:
    """The first inline base64 image (a data: URI; upstream refuses fetching URLs)."""
    for part in _parts(content):
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, Mapping) else image
        if isinstance(url, str):
            u = url.strip()
            low = u.lower()
            if low.startswith("data:image/") and ";base64," in low:
                return u
    return ""


def _list(payload: Mapping[str, object], key: str) -> list[object]:
    value = payload.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequest(f"field {key} must be an array, got {json_type(value)}", field=key)
    return value


def eval_view(payload: Mapping[str, object], headers: dict[str, str]) -> RequestView:
    metadata_raw = payload.get("metadata")
    if metadata_raw is not None and not isinstance(metadata_raw, Mapping):
        raise InvalidRequest(
            f"field metadata must be an object of strings, got {json_type(metadata_raw)}",
            field="metadata",
        )
    metadata = check_metadata(metadata_raw or {})
    text_field = payload.get("text", "")
    if text_field is None:
        text_field = ""
    if not isinstance(text_field, str):
        raise InvalidRequest(
            f"field text must be a string, got {json_type(text_field)}", field="text"
        )
    messages = _list(payload, "messages")
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise InvalidRequest(
                f"field messages[{i}] must be an object, got {json_type(msg)}",
                field=f"messages[{i}]",
            )
    tool_definitions = len(_list(payload, "tools")) + len(_list(payload, "functions"))
    envelope: JsonObject = {k: payload[k] for k in ESTIMATE_FIELDS if payload.get(k) is not None}

    if messages:
        walk = _EvalWalk(tool_definitions)
        walk.tool_choice = payload.get("tool_choice")
        for msg in messages:
            walk.message(msg)
        view = walk.view(text_field, envelope, messages, metadata, headers, payload)
        if view is not None:
            return view
    if text_field == "" and not metadata:
        raise InvalidRequest(
            "the eval request needs text or messages (with text, an image or a conversation "
            "shape) or metadata",
            field="text",
        )
    extra = [{"role": "user", "content": text_field}] if text_field else []
    trimmed = text_field.strip()
    return RequestView(
        text=trimmed,
        current_user_text=text_field,
        context_text=trimmed,
        context_floor=request_token_floor({**envelope, "messages": extra}),
        facts=ConversationFacts(
            user_messages=1,
            tool_definitions=tool_definitions,
            last_role="user",
            tool_choice_required=tool_choice_flags(payload.get("tool_choice"))[0],
            tool_choice_none=tool_choice_flags(payload.get("tool_choice"))[1],
            input_modalities=frozenset({"text"} if text_field else ()),
        ),
        metadata=metadata,
        headers=headers,
        body=payload,
    )


class _EvalWalk(ChatWalk):
    def __init__(self, tool_definitions: int) -> None:
        super().__init__()
        self.tool_definitions = tool_definitions
        self.current_raw = ""
        self.current_image = ""

    def message(self, msg: object) -> None:
        if not isinstance(msg, Mapping):
            return  # eval_view refused it already
        role_raw = msg.get("role")
        role = role_raw.strip().lower() if isinstance(role_raw, str) else ""
        content = msg.get("content")
        raw = message_text(content, EVAL)
        text = raw.strip()
        if role == "user":
            if raw:
                self.current_raw = raw
            self.images += image_count(content)
            self.modalities |= input_modalities(content, EVAL_MODALITY_PARTS)
        previous_was_tool = self.last_tool_result
        self.last_role = role
        self.last_tool_result = False
        self.last_user_after_tool = False
        if role in self.counts:
            self.counts[role] += 1
        if role == "user":
            self.last_user_after_tool = previous_was_tool
        elif role == "assistant":
            calls = msg.get("tool_calls")
            self.tool_calls += len(calls) if isinstance(calls, list) else 0
        elif role == "developer":
            self.developer = True
        elif role == "tool":
            self.last_tool_result = True
        if role == "user":
            image = first_data_image(content)
            if text == "" and image == "":
                return
            if text == "":
                self.current_image = image
                return
            if self.current:
                self.prior.append(self.current)
            self.current = text
            self.current_image = image
            return
        if text and role in ("system", "developer", "assistant"):
            self.non_user.append(text)
            self.has_assistant_reply = self.has_assistant_reply or role == "assistant"

    def facts(self, tool_definitions: int | None = None) -> ConversationFacts:
        return super().facts(
            self.tool_definitions if tool_definitions is None else tool_definitions
        )

    def view(
        self,
        text_field: str,
        envelope: JsonObject,
        messages: list[object],
        metadata: dict[str, str],
        headers: dict[str, str],
        payload: Mapping[str, object],
    ) -> RequestView | None:
        """The view, or None when the messages carry nothing to evaluate (upstream then falls
        back to ``text``)."""
        facts = self.facts()
        evaluation = self.current
        context = " ".join(self.non_user)
        current_text = self.current_raw
        if evaluation == "" and self.current_image == "" and self.non_user:
            evaluation = " ".join(self.non_user)
            context = evaluation
        if self.current:
            context = " ".join([*self.non_user, self.current])
        shape = (
            facts.user_messages
            or facts.assistant_messages
            or facts.system_messages
            or facts.tool_messages
            or facts.image_parts
            or facts.tool_definitions
            or facts.assistant_tool_calls
            or facts.tool_results
            or facts.has_developer_message
        )
        if not (evaluation.strip() or current_text or self.current_image or shape):
            return None
        fallback = text_field != "" and evaluation.strip() == ""
        if fallback:
            trimmed = text_field.strip()
            evaluation = trimmed
            if context.strip() == "":
                context = trimmed
            if current_text == "":
                current_text = text_field
        extra = [{"role": "user", "content": text_field}] if fallback else []
        return RequestView(
            text=evaluation,
            current_user_text=current_text,
            prior_user_texts=tuple(self.prior),
            non_user_texts=tuple(self.non_user),
            context_text=context,
            context_floor=request_token_floor({**envelope, "messages": [*messages, *extra]}),
            has_assistant_reply=self.has_assistant_reply,
            facts=facts,
            metadata=metadata,
            headers=headers,
            body=payload,
        )
