"""What Router Learning reads of a chat and of a recipe's router: the conversation's facts
from the messages, recipe-scoped keys, and the models' prices."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote

from vllm_sr.router.learning.protection import Conversation
from vllm_sr.router.message_text import FINGERPRINT, message_text

if TYPE_CHECKING:
    from vllm_sr.router.route import Router


def scoped(recipe: str, name: str) -> str:
    """A conversation or decision key in its recipe's namespace (upstream's
    RoutingNamespaceKey: the default recipe's keys stay unscoped)."""
    return name if recipe == "default" else f"{quote(recipe, safe='')}::{name}"


def conversation_facts(messages: object) -> Conversation:
    """The turn number, tool-loop state and history size (characters / 4 as tokens) from the
    chat's messages."""
    msgs = [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []
    users = [i for i, m in enumerate(msgs) if m.get("role") == "user"]
    calls = sum(len(m.get("tool_calls") or []) for m in msgs if m.get("role") == "assistant")
    results = sum(1 for m in msgs if m.get("role") == "tool")
    last_role = msgs[-1].get("role") if msgs else None
    sizes = [len(message_text(m.get("content"), FINGERPRINT)) for m in msgs]
    history = sum(sizes[: users[-1]]) if users else 0
    return Conversation(
        turn_index=max(len(users) - 1, 0),
        active_tool_loop=last_role == "tool" or calls > results,
        history_tokens=history // 4,
        context_tokens=sum(sizes) // 4,
    )


def prices(router: Router) -> dict[str, float]:
    out = {}
    for m in router.providers.models:
        p = m.pricing
        out[m.name] = 0.0 if p is None else p.prompt_per_1m + p.completion_per_1m
    return out


def cache_pressure(router: Router) -> dict[str, float]:
    """Each model's cache checkout cost against the most expensive (upstream's
    modelCostPressure); 0.5 where pricing says nothing."""
    costs: dict[str, float] = {}
    for m in router.providers.models:
        p = m.pricing
        if p is None or p.prompt_per_1m <= 0:
            costs[m.name] = 0.0
            continue
        checkout = p.prompt_per_1m if p.cache_write_per_1m is None else p.cache_write_per_1m
        delta = checkout - p.cached_input_per_1m
        costs[m.name] = (
            delta if delta > 0 else (0.0 if p.cache_write_per_1m is not None else p.prompt_per_1m)
        )
    top = max(costs.values(), default=0.0)
    return {m: (c / top if top > 0 and c > 0 else 0.5) for m, c in costs.items()}
