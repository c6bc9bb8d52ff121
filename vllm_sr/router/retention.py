"""A matched decision's retention directive (``emits: [{kind: retention, retention: {...}}]``),
as upstream's router acts on it (``X/processor_res_cache_retention.go``,
``X/processor_res_header_mutation.go``):

- ``drop: true``: the chat's answer is not written to the response cache (its lookup still
  runs; counted as ``skipped["retention.drop"]``). Nothing else is dropped: the replay record
  and the Responses API's stored conversation are kept, as upstream keeps them;
- ``ttl_turns`` > 0: the cache entry lives ``60 s`` x turns, replacing the plugin's, the
  store's and the request's ``ttl=`` lifetime (upstream applies it last);
- ``keep_current_model``, ``prefer_prefix_retention``: metadata (upstream's model-switch gate
  is not wired into its router, and the prefix hint is a header for an inference pool);
- with ``x-vsr-debug: true``, an answer from the backend carries every field the directive
  sets as ``x-vsr-retention-{drop,ttl-turns,keep-current-model,prefer-prefix}`` (unset fields
  are left out; ``ttl_turns: 0`` is shown).

The chat carries the directive on its run (vllm_sr/router/pipeline.py ``ChatRun.retention``);
the response cache reads it when it plans the chat's write."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_sr.config.routing import Emit, Retention

SECONDS_PER_TURN = 60  # upstream's retentionDefaultSecondsPerTurn
DROP_REASON = "retention.drop"  # upstream's cache-write skip reason

H_DROP = "x-vsr-retention-drop"
H_TTL_TURNS = "x-vsr-retention-ttl-turns"
H_KEEP_CURRENT_MODEL = "x-vsr-retention-keep-current-model"
H_PREFER_PREFIX = "x-vsr-retention-prefer-prefix"


def directive(emits: Sequence[Emit]) -> Retention | None:
    """A decision's retention directive: its first ``retention`` emit with a payload (the
    config allows one), None when it has none."""
    for emit in emits:
        if emit.kind == "retention" and emit.retention is not None:
            return emit.retention
    return None


def drops(retention: Retention | None) -> bool:
    """True when the chat's answer must not be written to the response cache."""
    return retention is not None and retention.drop is True


def ttl_override_s(retention: Retention | None) -> int | None:
    """The cache entry's lifetime in seconds when ``ttl_turns`` > 0, else None."""
    if retention is None or not retention.ttl_turns:
        return None
    return retention.ttl_turns * SECONDS_PER_TURN


def debug_headers(retention: Retention | None) -> dict[str, str]:
    """The ``x-vsr-retention-*`` headers of the fields the directive sets."""
    if retention is None:
        return {}
    headers: dict[str, str] = {}
    for name, value in (
        (H_DROP, retention.drop),
        (H_KEEP_CURRENT_MODEL, retention.keep_current_model),
        (H_PREFER_PREFIX, retention.prefer_prefix_retention),
    ):
        if value is not None:
            headers[name] = "true" if value else "false"
    if retention.ttl_turns is not None:
        headers[H_TTL_TURNS] = str(retention.ttl_turns)
    return headers
