"""Reasoning mode: how a routed chat's body changes before it goes to the backend, exactly as
the upstream vLLM Semantic Router does it (its ``req_filter_reason.go`` and
``req_filter_provider_dialect.go``; ROUTER-REFERENCE §6).

Only auto-routed chats whose decision matched are shaped; the caller decides that and calls
:func:`apply_reasoning` with the decision's chosen modelRef (``None`` when the decision has no
modelRefs and the default model serves it: reasoning is then off). Nothing here does I/O.

The rules, in upstream's order:

1. The client's top-level ``reasoning_effort`` is always removed first, and remembered
   ("low" when it was absent).
2. The family is the served model's ``reasoning_family`` looked up in
   ``providers.defaults.reasoning_families``; a model without one (or naming a family that is
   not declared) gets nothing more.
3. The backend's dialect: a backend ref whose ``provider`` is ``openai`` and whose
   ``base_url`` host is ``api.openai.com`` or ``openrouter.ai`` takes ``reasoning_effort`` as
   a top-level field; ``api.deepseek.com`` takes DeepSeek's own ``thinking`` switch; every
   other backend is vLLM-style (effort inside ``chat_template_kwargs``).
4. The family's ``type`` and ``parameter`` (one literal JSON key) decide the fields:

   ====================== ==================================== ===============================
   family type            use_reasoning true                   use_reasoning false
   ====================== ==================================== ===============================
   chat_template_kwargs   ``chat_template_kwargs[P] = true``   ``chat_template_kwargs[P] =
                                                               false``
   reasoning_effort       top-level dialect: ``body[P] =       top-level dialect: the client's
                          effort``; else                       value restored only if sent;
                          ``chat_template_kwargs[P] = effort`` else ``chat_template_kwargs[P]
                                                               = client value or "low"``
   top_level_reasoning_   ``chat_template_kwargs[P]`` removed, the same removal; the client's
   effort                 ``body[P] = effort``                 value restored only if sent
   any, at DeepSeek       ``chat_template_kwargs`` removed,    ``chat_template_kwargs``
                          ``thinking = {type: enabled}``,      removed, ``thinking = {type:
                          ``reasoning_effort = effort``        disabled}``
   ====================== ==================================== ===============================

   Other ``chat_template_kwargs`` keys are kept.
5. The effort is the ``reasoning_effort`` of the *first* decision modelRef whose ``model``
   names the model the body is sent as (its name, or one of its external ids); else
   ``providers.defaults.default_reasoning_effort``; else ``medium``. A modelRef that names a
   base model with a ``lora_name`` sends the LoRA's name, which is not a providers model: as
   upstream, such a request takes the default effort even if that modelRef sets one.

One deliberate difference: upstream shapes the body for the model's primary backend (the
highest ``weight``, first on ties) while Envoy may deliver it to another; vllm-sr sends each
chat to one backend it picked itself, so the caller passes that backend's ref and the body is
shaped for where it actually goes (:func:`primary_ref` gives upstream's choice).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar
from urllib.parse import urlsplit

from vllm_sr.jsontypes import JsonObject

DEFAULT_EFFORT = "medium"
ABSENT_CLIENT_EFFORT = "low"  # what a disabled reasoning_effort family passes on when none was sent
CHAT_TEMPLATE_KWARGS = "chat_template_kwargs"
TOP_LEVEL_EFFORT_HOSTS = frozenset({"api.openai.com", "openrouter.ai"})
DEEPSEEK_HOST = "api.deepseek.com"

FAMILY_CHAT_TEMPLATE_KWARGS = "chat_template_kwargs"
FAMILY_REASONING_EFFORT = "reasoning_effort"
FAMILY_TOP_LEVEL_REASONING_EFFORT = "top_level_reasoning_effort"


# -- what is read from the config (the pydantic models satisfy these) ------------------------


class ModelRefLike(Protocol):
    @property
    def model(self) -> str: ...
    @property
    def lora_name(self) -> str | None: ...
    @property
    def use_reasoning(self) -> bool | None: ...
    @property
    def reasoning_effort(self) -> str | None: ...


class ReasoningFamilyLike(Protocol):
    @property
    def type(self) -> str: ...
    @property
    def parameter(self) -> str: ...


class ProviderModelLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def provider_model_id(self) -> str | None: ...
    @property
    def external_model_ids(self) -> Mapping[str, str] | None: ...
    @property
    def reasoning_family(self) -> str | None: ...


class ProviderDefaultsLike(Protocol):
    @property
    def default_reasoning_effort(self) -> str | None: ...
    @property
    def reasoning_families(self) -> Mapping[str, ReasoningFamilyLike] | None: ...


class BackendRefLike(Protocol):
    @property
    def provider(self) -> str | None: ...
    @property
    def base_url(self) -> str | None: ...


# -- the dialect -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dialect:
    """How a backend takes reasoning fields (upstream's ``openAIBackendDialect``)."""

    kind: str  # "vllm", "official_openai", "openrouter", "official_deepseek", "generic"
    top_level_effort: bool = False
    deepseek_thinking: bool = False


VLLM = Dialect("vllm")


def dialect_of(ref: BackendRefLike | None) -> Dialect:
    """The dialect of the backend a chat goes to. Only ``provider: openai`` with a ``base_url``
    at one of the hosts upstream knows gets top-level fields; anything else (no provider, a
    local server, another provider) is vLLM-style for reasoning."""
    if ref is None or (ref.provider or "").lower() != "openai":
        return VLLM
    host = _host(ref.base_url)
    if host == "api.openai.com":
        return Dialect("official_openai", top_level_effort=True)
    if host == "openrouter.ai":
        return Dialect("openrouter", top_level_effort=True)
    if host == DEEPSEEK_HOST:
        return Dialect("official_deepseek", top_level_effort=True, deepseek_thinking=True)
    return Dialect("generic")


def _host(url: str | None) -> str:
    if not url:
        return ""
    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""


class _Weighted(Protocol):
    @property
    def weight(self) -> int | None: ...


_R = TypeVar("_R", bound=_Weighted)


# -- lookups -----------------------------------------------------------------------------------


def reasoning_enabled(model_ref: ModelRefLike | None) -> bool:
    """Whether the chosen modelRef turns reasoning on (``use_reasoning``, default off)."""
    return model_ref is not None and bool(model_ref.use_reasoning)


def external_ids(model: ProviderModelLike) -> frozenset[str]:
    """The names the model is known by at its backends: ``external_model_ids``' values when
    set (they replace ``provider_model_id``), else ``provider_model_id``."""
    ids = model.external_model_ids or {}
    if ids:
        return frozenset(v for v in ids.values() if v)
    return frozenset({model.provider_model_id}) if model.provider_model_id else frozenset()


def family_of(
    model: ProviderModelLike, defaults: ProviderDefaultsLike
) -> ReasoningFamilyLike | None:
    """The model's reasoning family, or None when it has none or names an undeclared one
    (v0.4's ``reasoning`` block: its inline family, or its ``family`` name)."""
    inline = getattr(model, "inline_family", None)
    if inline is not None:
        return inline
    name = getattr(model, "family_name", None) or model.reasoning_family
    if not name:
        return None
    return (defaults.reasoning_families or {}).get(name)


def sent_name(model_ref: ModelRefLike | None, model: ProviderModelLike) -> str:
    """The model name the request goes upstream as: the modelRef's LoRA, or the model."""
    if model_ref is not None and model_ref.lora_name:
        return model_ref.lora_name
    return model_ref.model if model_ref is not None else model.name


def effort_for(
    decision_refs: Sequence[ModelRefLike],
    sent: str,
    model: ProviderModelLike,
    defaults: ProviderDefaultsLike,
) -> str:
    """The effort: the first decision modelRef naming the sent model (directly, or both
    naming the same providers model through its name or external ids), else the defaults'
    ``default_reasoning_effort``, else ``medium``. The first such ref decides even when its
    effort is empty (then the default applies), as upstream."""
    names = {model.name} | external_ids(model)
    sent_is_model = sent in names
    for ref in decision_refs:
        if ref.model == sent or (sent_is_model and ref.model in names):
            if ref.reasoning_effort:
                return ref.reasoning_effort
            break
    return defaults.default_reasoning_effort or DEFAULT_EFFORT


def primary_ref(refs: Sequence[_R]) -> _R | None:
    """Upstream's shaping backend: the highest weight (0 counts as 1), first on ties."""
    best: _R | None = None
    for ref in refs:
        if best is None or _weight(ref) > _weight(best):
            best = ref
    return best


def _weight(ref: _Weighted) -> int:
    return ref.weight or 1


# -- the mutation ------------------------------------------------------------------------------


def apply_reasoning(
    body: Mapping[str, object],
    model_ref: ModelRefLike | None,
    model: ProviderModelLike,
    defaults: ProviderDefaultsLike,
    backend: BackendRefLike | None,
    *,
    decision_refs: Sequence[ModelRefLike] | None = None,
) -> JsonObject:
    """The body to send for a chat whose decision matched. ``model_ref``: the decision's chosen
    modelRef (None: the decision had none, reasoning off); ``model``: the providers model that
    serves it (a LoRA's base); ``backend``: the ref of the backend it goes to;
    ``decision_refs``: every modelRef of the decision, in order, for the effort lookup
    (default: the chosen one alone). Returns a new dict; ``body`` is not changed."""
    out = dict(body)
    has_client_effort = "reasoning_effort" in out
    client_effort = out.pop("reasoning_effort", ABSENT_CLIENT_EFFORT)
    family = family_of(model, defaults)
    if family is None:
        return out
    kwargs = _Kwargs(out)
    enabled = reasoning_enabled(model_ref)
    refs = decision_refs if decision_refs is not None else ([model_ref] if model_ref else [])

    def effort() -> str:
        return effort_for(refs, sent_name(model_ref, model), model, defaults)

    dialect = dialect_of(backend)
    parameter = family.parameter
    if dialect.deepseek_thinking:
        out.pop(CHAT_TEMPLATE_KWARGS, None)
        out["thinking"] = {"type": "enabled" if enabled else "disabled"}
        if enabled:
            out["reasoning_effort"] = effort()
        else:
            out.pop("reasoning_effort", None)
        return out
    if family.type == FAMILY_CHAT_TEMPLATE_KWARGS:
        kwargs.set(parameter, enabled)
    elif family.type == FAMILY_REASONING_EFFORT:
        if dialect.top_level_effort:
            if enabled:
                out[parameter] = effort()
            elif has_client_effort:
                out[parameter] = client_effort
        else:
            kwargs.set(parameter, effort() if enabled else client_effort)
    elif family.type == FAMILY_TOP_LEVEL_REASONING_EFFORT:
        kwargs.remove(parameter)
        if enabled:
            out[parameter] = effort()
        elif has_client_effort:
            out[parameter] = client_effort
    kwargs.write()
    return out


class _Kwargs:
    """``chat_template_kwargs`` being edited: a copy of the client's object (anything else
    counts as empty), written back only when changed; emptied by a removal, it is dropped."""

    def __init__(self, body: JsonObject) -> None:
        self._body = body
        current = body.get(CHAT_TEMPLATE_KWARGS)
        self._kwargs: JsonObject = dict(current) if isinstance(current, dict) else {}
        self._dirty = False

    def set(self, key: str, value: object) -> None:
        self._kwargs[key] = value
        self._dirty = True

    def remove(self, key: str) -> None:
        if key not in self._kwargs:
            return
        del self._kwargs[key]
        if not self._kwargs:
            self._body.pop(CHAT_TEMPLATE_KWARGS, None)
            self._dirty = False
        else:
            self._dirty = True

    def write(self) -> None:
        if self._dirty:
            self._body[CHAT_TEMPLATE_KWARGS] = self._kwargs
