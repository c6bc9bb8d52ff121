"""What a response-cache entry is keyed on, and the request's cache controls (upstream's
``X/req_filter_cache*.go``, ``X/semantic_cache_scope.go``, ``X/req_filter_cache_control.go``).

- Scope identity: ``global`` needs none; ``user`` is ``x-authz-user-id`` (or the configured
  ``global.services.authz.identity.user_id_header``); ``team`` is ``x-authz-team-id``, else the
  first ``x-authz-user-groups`` entry; ``tenant`` is ``x-authz-tenant-id``. No identity -> the
  chat is not cached at all (never shared by accident).
- Partition (in every key): recipe, decision, the request's ``model``, the selected model, the
  scope and its identity, the decision's ``revision`` strings, and a fingerprint of the
  decision's policy (its modelRefs and plugins). One partition never sees another's entries.
- Exact key: SHA-256 of the partition and the whole request JSON (sorted keys) without
  ``stream`` / ``stream_options``. Upstream also splits streamed from non-streamed answers;
  vllm-sr stores one normalised answer and replays it either way (a streamed answer serves a
  later JSON caller and the reverse), so those two fields are left out.
- Semantic group: SHA-256 of the partition and the request with ``model``, ``stream``,
  ``stream_options`` removed and the last user text replaced by a placeholder (so history,
  system prompt, tools and parameters must all match); within a group the last user text's
  embedding is compared by cosine.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_sr.config.plugin_cache import CacheRequestControls, ResponseCachePlugin

if TYPE_CHECKING:
    from vllm_sr.config.routing import Decision

DEFAULT_CONTROL_HEADER = "x-vsr-cache-control"
DEFAULT_ALLOWED = ("no-cache", "no-store", "bypass")
TEAM_HEADER = "x-authz-team-id"
TENANT_HEADER = "x-authz-tenant-id"
PLACEHOLDER = "\x00vsr-semantic-query\x00"
UNKEYED = ("stream", "stream_options")


def scope_identity(
    scope: str, headers: Mapping[str, str], user_id_header: str, user_groups_header: str
) -> str | None:
    """The identity entries are shared under (``headers`` lower-cased), or None: not cacheable."""
    if scope == "global":
        return "*"
    if scope == "user":
        value = headers.get(user_id_header.lower(), "").strip()
    elif scope == "team":
        value = headers.get(TEAM_HEADER, "").strip()
        if not value:
            groups = headers.get(user_groups_header.lower(), "")
            value = next((g.strip() for g in groups.split(",") if g.strip()), "")
    else:
        value = headers.get(TENANT_HEADER, "").strip()
    return value or None


@dataclass(frozen=True)
class Controls:
    """What the request's cache-control header asked (only the allowed directives count)."""

    read: bool = True
    write: bool = True
    max_age_s: int | None = None
    ttl_s: int | None = None


def parse_controls(config: CacheRequestControls, headers: Mapping[str, str]) -> Controls:
    if not config.enabled:
        return Controls()
    header = (config.header or "").strip().lower() or DEFAULT_CONTROL_HEADER
    allowed = {a.strip().lower() for a in (config.allowed or DEFAULT_ALLOWED)}
    read, write = True, True
    max_age: int | None = None
    ttl: int | None = None
    for raw in headers.get(header, "").lower().split(","):
        name, has_value, value = raw.strip().partition("=")
        if name not in allowed:
            continue
        if name == "no-cache":
            read = False
        elif name == "no-store":
            write = False
        elif name == "bypass":
            read = write = False
        elif name == "max-age" and has_value:
            max_age = _non_negative(value)
        elif name == "ttl" and has_value:
            ttl = _non_negative(value)
            if ttl is not None and config.max_ttl_seconds is not None:
                ttl = min(ttl, config.max_ttl_seconds)
    return Controls(read, write, max_age, ttl)


def _non_negative(value: str) -> int | None:
    try:
        n = int(value.strip())
    except ValueError:
        return None
    return n if n >= 0 else None


def effective_ttl(configured_s: int, requested_s: int | None) -> int:
    """Upstream's rule: a requested TTL below the configured one (or any, when none is
    configured) wins."""
    if requested_s is None:
        return configured_s
    if configured_s <= 0 or requested_s < configured_s:
        return requested_s
    return configured_s


def _digest(*parts: object) -> str:
    raw = json.dumps(parts, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()


def policy_fingerprint(decision: Decision) -> str:
    """The decision's modelRefs and plugins: a changed policy does not reuse old answers."""
    refs = [r.model_dump(mode="json", exclude_none=True) for r in decision.model_refs or []]
    plugins = [p.model_dump(mode="json", exclude_none=True) for p in decision.plugins]
    return _digest(decision.name, refs, plugins)


def partition(
    *,
    recipe: str,
    decision: str,
    request_model: str,
    selected_model: str,
    scope: str,
    identity: str,
    plugin: ResponseCachePlugin,
    policy: str,
) -> str:
    rev = plugin.revision.model_dump() if plugin.revision is not None else {}
    return _digest(recipe, decision, request_model, selected_model, scope, identity, rev, policy)


def exact_key(part: str, body: Mapping[str, object]) -> str:
    keyed = {k: v for k, v in body.items() if k not in UNKEYED}
    return _digest(part, keyed)


def semantic_group(part: str, body: Mapping[str, object]) -> str | None:
    """The semantic tier's group, or None when the last user message has no text part (upstream
    skips the semantic tier then)."""
    shaped = {k: copy.deepcopy(v) for k, v in body.items() if k not in (*UNKEYED, "model")}
    messages = shaped.get("messages")
    if not isinstance(messages, list):
        return None
    for msg in reversed(messages):
        if not isinstance(msg, dict) or msg.get("role") != "user":
            continue
        content = msg.get("content")
        if isinstance(content, str):
            if not content.strip():
                return None
            msg["content"] = PLACEHOLDER
            return _digest(part, shaped)
        if isinstance(content, list):
            texts = [p for p in content if isinstance(p, dict) and p.get("type") == "text"]
            if not texts:
                return None
            msg["content"] = [
                p for p in content if not (isinstance(p, dict) and p.get("type") == "text")
            ] + [{"type": "text", "text": PLACEHOLDER}]
            return _digest(part, shaped)
        return None
    return None
