"""What the signals see of one request: :class:`RequestView`, built from a chat-completions body
(:meth:`RequestView.from_chat`) or from an ``/api/v1/eval`` payload (:meth:`RequestView.from_eval`),
the way upstream extracts it (``extproc/utils_fast.go``, ``req_filter_classification_signal.go``
for chats; ``services/intent_request_messages.go`` for eval).

- ``text``: the last user message with non-empty text (a string, or its text parts joined by a
  space); with none, the non-user texts joined by spaces. Keyword and structure signals read it
  whole; the model-backed and language signals a sample of at most 2048 characters
  (:meth:`RequestView.sampled_text`).
- ``prior_user_texts``: the earlier user texts; ``non_user_texts``: system, developer and
  assistant texts (tool messages excluded).
- ``context_text`` and ``context_floor``: what the context signal counts
  (:meth:`RequestView.context_tokens`, see ``context_estimate``).
- ``facts``: the conversation's shape (message counts by role, tool definitions, tool calls,
  tool results, images, the tool-loop state) for the conversation signal.
- ``metadata``: the request's ``metadata`` object (at most 32 entries, keys 1-128 bytes, string
  values of at most 1024 bytes; anything else is an :class:`InvalidRequest` naming the field).
- ``headers``: the request headers, names lowercased (the authz signal reads its identity
  headers there).
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from vllm_sr.errors import InvalidRequest
from vllm_sr.jsontypes import json_type
from vllm_sr.router.context_estimate import context_token_count, request_token_floor
from vllm_sr.router.message_text import CHAT, message_text

MAX_METADATA_ENTRIES = 32
MAX_METADATA_KEY_BYTES = 128
MAX_METADATA_VALUE_BYTES = 1024
SAMPLE_CHARS = 2048
SAMPLE_MARKER = "\n... [content sampled for routing signal evaluation] ...\n"
IMAGE_PART_TYPES = frozenset({"image_url", "input_image"})
# v0.4's input_modality: the content-part types of user messages that count as each modality
# (a non-empty string content counts as text). A chat's parts; the eval/preview request also
# reads audio_url, video_url and input_video (upstream's classify/eval decoder).
CHAT_MODALITY_PARTS = {
    "text": "text",
    "input_text": "text",
    "image_url": "image",
    "input_image": "image",
    "input_audio": "audio",
}
EVAL_MODALITY_PARTS = {
    **CHAT_MODALITY_PARTS,
    "audio_url": "audio",
    "video_url": "video",
    "input_video": "video",
}


# Built per chat, read-only by convention: slots (a misspelt attribute raises) but not frozen,
# whose __init__ sets each field through object.__setattr__ (a microsecond or two per chat).
@dataclass(slots=True)
class ConversationFacts:
    """The request's shape, as upstream's conversation signal counts it."""

    user_messages: int = 0
    assistant_messages: int = 0
    system_messages: int = 0
    tool_messages: int = 0
    has_developer_message: bool = False
    tool_definitions: int = 0  # tools + functions
    assistant_tool_calls: int = 0  # tool_calls entries of assistant messages
    tool_results: int = 0  # tool messages
    image_parts: int = 0  # image_url / input_image parts of user messages
    last_role: str = ""
    last_message_tool_result: bool = False
    last_user_after_tool_result: bool = False
    tool_choice_required: bool = False  # v0.4: tool_choice "required" or a named tool
    tool_choice_none: bool = False  # v0.4: tool_choice "none"
    input_modalities: frozenset[str] = frozenset()  # v0.4: text/image/audio/video in user turns

    @property
    def active_tool_loop(self) -> bool:
        return (
            self.last_message_tool_result
            or self.last_role == "tool"
            or self.last_user_after_tool_result
            or self.assistant_tool_calls > self.tool_results
        )


@dataclass(slots=True)  # read-only by convention, not frozen (see ConversationFacts)
class RequestView:
    text: str
    current_user_text: str = ""
    prior_user_texts: tuple[str, ...] = ()
    non_user_texts: tuple[str, ...] = ()
    context_text: str = ""
    context_floor: int = 0
    has_assistant_reply: bool = False
    facts: ConversationFacts = field(default_factory=ConversationFacts)
    metadata: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    body: Mapping[str, object] = field(default_factory=dict)

    def context_tokens(self) -> int:
        """The context signal's token count: max(ceil(context text bytes / 4), floor)."""
        return context_token_count(self.context_text, self.context_floor)

    def sampled_text(self) -> str:
        """``text`` as the model-backed and language signals see it: whole up to 2048
        characters, else its first, middle and last thirds joined by an omission marker."""
        return sample(self.text, SAMPLE_CHARS)

    @staticmethod
    def from_chat(body: Mapping[str, object], headers: Mapping[str, str]) -> RequestView:
        """The view of a chat-completions request body (already parsed JSON)."""
        metadata = chat_metadata(body)
        walk = ChatWalk()
        walk.tool_choice = body.get("tool_choice")
        messages = body.get("messages")
        if isinstance(messages, list):
            for msg in messages:
                walk.message(msg)
        tool_definitions = 0
        for key in ("tools", "functions"):
            defined = body.get(key)
            if isinstance(defined, list):
                tool_definitions += len(defined)
        current = walk.current
        non_user = tuple(walk.non_user)
        text = current if current else " ".join(non_user)
        context_text = " ".join([*non_user, current] if current else non_user)
        return RequestView(
            text=text,
            current_user_text=current,
            prior_user_texts=tuple(walk.prior),
            non_user_texts=non_user,
            context_text=context_text,
            context_floor=request_token_floor(body),
            has_assistant_reply=walk.has_assistant_reply,
            facts=walk.facts(tool_definitions),
            metadata=metadata,
            headers=lower_headers(headers),
            body=body,
        )

    @staticmethod
    def from_eval(
        payload: Mapping[str, object], headers: Mapping[str, str] | None = None
    ) -> RequestView:
        """The view of an ``/api/v1/eval`` request: ``text``, ``messages``, ``tools``,
        ``functions``, ``tool_choice``, ``function_call``, ``response_format``, ``max_tokens``,
        ``max_completion_tokens``, ``metadata``. ``messages`` take precedence; ``text`` fills in
        when they carry no text. Raises InvalidRequest for a payload with neither."""
        from vllm_sr.router.eval_view import eval_view

        return eval_view(payload, lower_headers(headers or {}))


def sample(text: str, limit: int) -> str:
    if limit <= 0 or len(text) <= limit:
        return text
    head = limit // 3
    middle = limit // 3
    tail = limit - head - middle
    start = (len(text) - middle) // 2
    return (
        text[:head]
        + SAMPLE_MARKER
        + text[start : start + middle]
        + SAMPLE_MARKER
        + text[len(text) - tail :]
    )


def lower_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): v for k, v in headers.items()}


def chat_metadata(body: Mapping[str, object]) -> dict[str, str]:
    """The body's ``metadata`` object, checked as upstream does (400 otherwise)."""
    if "metadata" not in body:
        return {}
    raw = body["metadata"]
    if not isinstance(raw, Mapping):
        raise InvalidRequest(
            f"field metadata must be an object of strings, got {json_type(raw)}",
            field="metadata",
        )
    return check_metadata(raw)


def check_metadata(raw: Mapping[object, object]) -> dict[str, str]:
    values: dict[str, str] = {}
    for key, value in raw.items():
        if len(values) >= MAX_METADATA_ENTRIES:
            raise InvalidRequest(
                f"metadata cannot contain more than {MAX_METADATA_ENTRIES} entries",
                field="metadata",
            )
        if not isinstance(value, str):
            raise InvalidRequest(
                f"field metadata.{key} must be a string, got {json_type(value)}",
                field=f"metadata.{key}",
            )
        key_bytes = len(str(key).encode("utf-8"))
        if key_bytes == 0 or key_bytes > MAX_METADATA_KEY_BYTES:
            raise InvalidRequest(
                f"metadata key {key!r}: length must be between 1 and {MAX_METADATA_KEY_BYTES} "
                f"bytes (got {key_bytes})",
                field="metadata",
            )
        if len(value.encode("utf-8")) > MAX_METADATA_VALUE_BYTES:
            raise InvalidRequest(
                f"metadata value for key {key!r} exceeds {MAX_METADATA_VALUE_BYTES} bytes",
                field=f"metadata.{key}",
            )
        values[str(key)] = value
    return values


TEXT_ONLY = frozenset({"text"})
NO_MODALITY: frozenset[str] = frozenset()


def input_modalities(content: object, parts: Mapping[str, str]) -> AbstractSet[str]:
    """The modalities one user message's content carries (``parts``: part type -> modality)."""
    if isinstance(content, str):  # the usual chat: shared constants, nothing built
        return TEXT_ONLY if content else NO_MODALITY
    if not isinstance(content, list):
        return NO_MODALITY
    found = set()
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if isinstance(kind, str) and kind in parts:
            text = part.get("text")
            if parts[kind] != "text" or (isinstance(text, str) and text):
                found.add(parts[kind])
    return found


def tool_choice_flags(tool_choice: object) -> tuple[bool, bool]:
    """(required, none) of a request's ``tool_choice``: "required" or a named tool object
    requires a tool call; "none" forbids one."""
    if tool_choice is None:  # the usual chat (and a cheap answer: no Mapping check)
        return False, False
    required = tool_choice == "required" or (
        isinstance(tool_choice, Mapping) and tool_choice.get("type") in ("function", "tool")
    )
    return required, tool_choice == "none"


def image_parts(content: object) -> int:
    if not isinstance(content, list):
        return 0
    return sum(1 for p in content if isinstance(p, Mapping) and p.get("type") in IMAGE_PART_TYPES)


class ChatWalk:
    """Upstream's single pass over a chat's messages (``consumeFastExtractMessage``); its
    state is shared with the eval request's walk (``eval_view``), whose rules differ."""

    def __init__(self) -> None:
        self.current = ""
        self.prior: list[str] = []
        self.non_user: list[str] = []
        self.has_assistant_reply = False
        self.counts = {"user": 0, "assistant": 0, "system": 0, "tool": 0}
        self.developer = False
        self.tool_calls = 0
        self.images = 0
        self.last_role = ""
        self.last_tool_result = False
        self.last_user_after_tool = False
        self.modalities: set[str] = set()
        self.tool_choice: object = None  # the request's tool_choice (set before facts())

    def message(self, msg: object) -> None:
        previous_was_tool = self.last_tool_result or self.last_role == "tool"
        msg = msg if isinstance(msg, Mapping) else {}
        role = msg.get("role")
        role = role if isinstance(role, str) else ""
        content = msg.get("content")
        text = message_text(content, CHAT)
        self.last_role = role
        self.last_tool_result = False
        self.last_user_after_tool = False
        if role == "user":
            self.counts["user"] += 1
            self.last_user_after_tool = previous_was_tool
            self.images += image_parts(content)
            self.modalities |= input_modalities(content, CHAT_MODALITY_PARTS)
            if text:
                if self.current:
                    self.prior.append(self.current)
                self.current = text
        elif role in ("system", "assistant", "developer"):
            if role == "developer":
                self.developer = True
            else:
                self.counts[role] += 1
            if text:
                self.non_user.append(text)
                if role == "assistant":
                    self.has_assistant_reply = True
            if role == "assistant":
                calls = msg.get("tool_calls")
                if isinstance(calls, list):
                    self.tool_calls += len(calls)
        elif role == "tool":
            self.counts["tool"] += 1
            self.last_tool_result = True

    def facts(self, tool_definitions: int) -> ConversationFacts:
        required, none = tool_choice_flags(self.tool_choice)
        return ConversationFacts(
            user_messages=self.counts["user"],
            assistant_messages=self.counts["assistant"],
            system_messages=self.counts["system"],
            tool_messages=self.counts["tool"],
            has_developer_message=self.developer,
            tool_definitions=tool_definitions,
            assistant_tool_calls=self.tool_calls,
            tool_results=self.counts["tool"],
            image_parts=self.images,
            last_role=self.last_role,
            last_message_tool_result=self.last_tool_result,
            last_user_after_tool_result=self.last_user_after_tool,
            tool_choice_required=required,
            tool_choice_none=none,
            input_modalities=frozenset(self.modalities),
        )
