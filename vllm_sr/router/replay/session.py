"""A chat's session metadata for its router_replay record, as upstream derives it
(``extproc/session_transition.go``, ``memory_helpers.go``, ``sessiontelemetry/derive.go``), pure.

``session_id``: the ``x-session-id`` header (upstream reads that name whatever Router
Learning's identity headers are); else Claude Code's ``x-claude-code-session-id``; else, for a
chat with messages, a digest of the caller (``x-authz-user-id``, the trusted header upstream's
production build reads) and its first user message
(``cc-<16 hex>``) or, without a caller, of every message's role and first 100 bytes
(``cc-full-<16 hex>``); else a digest of ``x-request-id`` (``rid-<16 hex>``); else none.
``turn_index``: the assistant messages before this turn (upstream's ChatTurnNumber - 1), so
a conversation's records count 0, 1, 2... The digests are upstream's byte for byte, so an
upstream router and vllm-sr sharing a store file one conversation under one id. A header id
longer than 255 characters (upstream's ``session_id VARCHAR(255)``, which would refuse the
row) is kept as ``sha256:<64 hex>`` of it."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from vllm_sr.jsontypes import JsonObject
from vllm_sr.router.message_text import FINGERPRINT, message_text

SESSION_HEADER = "x-session-id"
CLAUDE_CODE_HEADER = "x-claude-code-session-id"
REQUEST_ID_HEADER = "x-request-id"
USER_HEADER = "x-authz-user-id"
FINGERPRINT_BYTES = 100  # upstream cuts each message's content to this many bytes
MAX_SESSION_ID = 255  # upstream's column width


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _cut(text: str) -> str:
    """The first FINGERPRINT_BYTES bytes (Go slices strings by byte)."""
    return text.encode("utf-8")[:FINGERPRINT_BYTES].decode("utf-8", "ignore")


def session_id(body: Mapping[str, object], headers: Mapping[str, str]) -> str | None:
    """The chat's session id (see the module's docstring); ``headers`` keyed lower-case."""
    for name in (SESSION_HEADER, CLAUDE_CODE_HEADER):
        value = headers.get(name, "").strip()
        if len(value) > MAX_SESSION_ID:
            return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
        if value:
            return value
    messages = _messages(body)
    if messages:
        user = headers.get(USER_HEADER, "")
        if user:
            first = next(
                (
                    message_text(m.get("content"), FINGERPRINT)
                    for m in messages
                    if m.get("role") == "user"
                ),
                "",
            )
            return "cc-" + _digest(f"{user}:{_cut(first)}")
        parts = [
            f"{m.get('role', '')}:{_cut(message_text(m.get('content'), FINGERPRINT))}"
            for m in messages
        ]
        return "cc-full-" + _digest("|".join(parts))
    rid = headers.get(REQUEST_ID_HEADER, "").strip()
    return "rid-" + _digest("rid:" + rid) if rid else None


def turn_index(body: Mapping[str, object]) -> int:
    return sum(1 for m in _messages(body) if m.get("role") == "assistant")


def session_fields(body: Mapping[str, object], headers: Mapping[str, str]) -> JsonObject:
    """The record's ``session_id`` (left out when there is none, as upstream omits it) and
    ``turn_index``."""
    out: JsonObject = {}
    sid = session_id(body, headers)
    if sid is not None:
        out["session_id"] = sid
    out["turn_index"] = turn_index(body)
    return out


def _messages(body: Mapping[str, object]) -> list[JsonObject]:
    raw = body.get("messages")
    return [m for m in raw if isinstance(m, dict)] if isinstance(raw, list) else []
