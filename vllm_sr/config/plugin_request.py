"""The models of the decision plugins that shape what reaches the backend (upstream's
``C/plugin_config.go``, ``C/plugin_masking.go`` and their fragments,
``config/fragments/plugin``), with upstream's names and defaults: ``fast_response`` (a canned
answer, no backend), ``system_prompt``, ``header_mutation``, ``request_params``, the ``tools``
policy, ``tool_selection`` and ``masking``. The plugins that run them: vllm_sr/router/plugins
(``shapers.py``, ``fast_response.py``, ``tool_selection.py``, ``masking.py``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from vllm_sr.config.routing_base import Strict
from vllm_sr.jsontypes import JsonObject

MASK_INDEX = "{index}"


class SystemPromptPlugin(Strict):
    enabled: bool | None = None
    """Unset: on when ``system_prompt`` is set."""

    system_prompt: str | None = None
    """The prompt."""

    mode: str | None = None
    """``insert`` (default): the prompt, a blank line, then the existing system text; any
    other value (``replace``, even ``append``): the prompt replaces it (upstream's rule)."""

    @property
    def active(self) -> bool:
        on = self.enabled if self.enabled is not None else bool(self.system_prompt)
        return on and bool(self.system_prompt)


class HeaderPair(Strict):
    name: str = Field(min_length=1)
    value: str = ""


class HeaderMutationPlugin(Strict):
    add: list[HeaderPair] = Field(default_factory=list)
    """Headers set on the request to the backend."""

    update: list[HeaderPair] = Field(default_factory=list)
    """Also set (upstream treats add and update alike)."""

    delete: list[str] = Field(default_factory=list)
    """Headers removed from the request to the backend."""


class RequestParamsPlugin(Strict):
    blocked_params: list[str] = Field(default_factory=list)
    """Body keys removed."""

    max_tokens_limit: int | None = Field(default=None, ge=0)
    """An integer ``max_tokens`` above this is lowered to it."""

    max_n: int | None = Field(default=None, ge=0)
    """An integer ``n`` above this is lowered to it."""

    strip_unknown: bool = False
    """Keep only upstream's known chat parameters."""

    default_max_tokens: Annotated[int, Field(ge=1, strict=True)] | Literal["auto"] | None = None
    """v0.4: ``max_tokens`` set to this when the request gives neither ``max_tokens`` nor
    ``max_completion_tokens`` (then capped by ``max_tokens_limit``). ``auto`` is refused."""


class FastResponsePlugin(Strict):
    message: str = Field(min_length=1)
    """The canned answer; no backend is called."""


class ToolsPlugin(Strict):
    enabled: bool = False
    """The policy applies only when true (upstream's default is off)."""

    mode: Literal["passthrough", "filtered", "none"] | None = None
    """passthrough (default): tools as sent; filtered: allow_tools/block_tools applied; none:
    every tool control removed (tools, tool_choice, functions, function_call,
    parallel_tool_calls, web_search_options)."""

    allow_tools: list[str] = Field(default_factory=list)
    """filtered: only these function names are kept (empty: all)."""

    block_tools: list[str] = Field(default_factory=list)
    """filtered: these function names are removed (wins over allow_tools)."""

    strip_tool_history: bool = False
    """none: also remove tool/function messages and assistant tool calls from the history."""

    semantic_selection: bool | None = None
    """Upstream: semantic selection from the tools database (``integrations.tools``, which
    vllm-sr does not have): no effect (metadata)."""

    strategy: str | None = None
    """Upstream: the tools database's retrieval strategy (metadata)."""

    dynamic_retrieval: JsonObject | None = None
    """Upstream: the tools database's history-aware retrieval (metadata)."""


class ToolSelectionPlugin(Strict):
    enabled: bool = False
    """Selection runs only when true."""

    mode: Literal["add", "filter"] | None = None
    """filter: keep the request's tools relevant to the query. add (upstream's default, from a
    tools database file) is refused: vllm-sr has no tools database."""

    relevance_threshold: float | None = Field(default=None, ge=0, le=1)
    """filter: a tool is kept when the cosine of its ``name description`` to the query is at
    least this (default 0.25)."""

    preserve_count: int = Field(default=0, ge=0)
    """filter: keep at least this many tools (the best scored), whatever their score."""

    fallback_to_empty: bool | None = None
    """Upstream: what an empty selection sends; vllm-sr removes ``tools`` (and ``tool_choice``)
    either way, since an empty tools list is not a valid request."""

    tools_db_path: str | None = None
    """add mode's database (refused with add)."""

    top_k: int | None = Field(default=None, ge=0)
    """add mode (refused)."""

    similarity_threshold: float | None = Field(default=None, ge=0, le=1)
    """add mode (refused)."""

    advanced_filtering: JsonObject | None = None
    """add mode (refused)."""

    strategy: str | None = None
    """add mode's retrieval strategy (refused)."""


class MaskingPlugin(Strict):
    """Upstream's ``masking`` (``C/plugin_masking.go``): detected PII in the request to the
    backend is replaced by placeholders. It fails closed: a detector failure answers 503,
    never the unmasked request."""

    enabled: bool = False
    """Masking runs only when true."""

    threshold: float = Field(default=0.0, ge=0, le=1)
    """Least detector score for a span to be masked (0: the detector's own floor,
    vllm_sr/router/plugins/masking.py)."""

    entity_types: list[str] = Field(default_factory=list, max_length=64)
    """Only these types are masked (an include list; empty: every detected type)."""

    placeholders: dict[str, str] = Field(default_factory=dict)
    """Entity type -> template containing ``{index}`` (unset: ``[TYPE_{index}]``)."""

    @field_validator("placeholders")
    @classmethod
    def _templates_have_index(cls, value: dict[str, str]) -> dict[str, str]:
        for kind, template in value.items():
            if MASK_INDEX not in template:
                raise ValueError(
                    f"placeholder {template!r} for {kind!r} has no {MASK_INDEX}; accepted: a "
                    f"template containing {MASK_INDEX} (distinct values need distinct "
                    "placeholders)"
                )
        return value

    def template(self, entity_type: str) -> str:
        return self.placeholders.get(entity_type) or f"[{entity_type}_{MASK_INDEX}]"
