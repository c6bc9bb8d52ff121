"""The routing configs and chats bench/router.py measures, one :class:`Profile` each.

- ``keyword-only``: one keyword signal, one decision (issue 15's first aim).
- ``deterministic``: every deterministic family, from upstream's own signal fragments
  (tests/fixtures/upstream/fragments/signal/{keyword,context,structure,conversation,language,
  metadata,authz}, copied unchanged from vllm-project/semantic-router), merged into one
  ``routing.signals``, with one decision naming each family. Every chat carries the identity
  headers (``x-authz-user-id``), as a deployment with role bindings requires (else 403). The
  chats mix what hits each decision with chats no decision matches; every referenced family is
  evaluated on every chat whatever matches, so the cost does not depend much on the mix. The
  32K-token chat that matches ``long_context`` is measured apart (in process only): it is not a
  typical chat, and sending 200 KB twice per sample would measure HTTP, not routing.
- ``embedding+domain``: keywords plus an embedding signal and domains, which ask the d3-edge
  deployment one bundle per chat (needs a worker: the standalone and service targets).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

FRAGMENTS_DIR = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "upstream"
FRAGMENTS = (
    "keyword/regex",
    "context/long-context",
    "structure/request-shape",
    "conversation/agentic-shape",
    "language/multilingual",
    "metadata/routing-hints",
    "authz/rbac",
)
IDENTITY = {"x-authz-user-id": "bench", "x-authz-user-groups": "staff"}
ADMIN = {**IDENTITY, "x-authz-user-groups": "platform-admins"}
SPANISH = "¿Dónde está la biblioteca? Necesito estudiar para el examen de mañana."

Chat = tuple[dict[str, Any], dict[str, str]]  # (body without "model", request headers)


@dataclass(frozen=True)
class Profile:
    name: str
    routing: dict[str, Any]
    chats: list[Chat]
    needs_worker: bool = False  # model-backed signals: asks the d3-edge deployment
    extra: dict[str, Chat] = field(default_factory=dict)  # in-process only, reported apart


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


# -- keyword-only and embedding+domain (issue 15) -------------------------------------------

TEXTS = [
    "please debug this function, it crashes",
    "I was charged twice for my order, can I get a refund?",
    "solve this integral of x squared",
    "what is a good name for a cat",
]
KEYWORD_ROUTING: dict[str, Any] = {
    "signals": {"keywords": [{"name": "code", "keywords": ["code", "debug", "function"]}]},
    "decisions": [
        {
            "name": "coding",
            "priority": 100,
            "rules": {"operator": "OR", "conditions": [{"type": "keyword", "name": "code"}]},
            "modelRefs": [{"model": "general"}],
        }
    ],
}
SEMANTIC_ROUTING: dict[str, Any] = {
    "signals": {
        "keywords": KEYWORD_ROUTING["signals"]["keywords"],
        "embeddings": [
            {
                "name": "billing",
                "threshold": 0.6,
                "candidates": ["refund my order", "I was charged twice", "billing problem"],
            }
        ],
        "domains": [
            {"name": "math", "description": "Mathematics", "examples": ["solve this integral"]},
            {"name": "other", "description": "General questions", "examples": ["tell me a story"]},
        ],
    },
    "decisions": [
        *KEYWORD_ROUTING["decisions"],
        {
            "name": "billing",
            "priority": 50,
            "rules": {"operator": "OR", "conditions": [{"type": "embedding", "name": "billing"}]},
            "modelRefs": [{"model": "general"}],
        },
        {
            "name": "maths",
            "priority": 10,
            "rules": {"operator": "OR", "conditions": [{"type": "domain", "name": "math"}]},
            "modelRefs": [{"model": "general"}],
        },
    ],
}
PLAIN_CHATS: list[Chat] = [({"messages": user(t), "max_tokens": 16}, {}) for t in TEXTS]


# -- every deterministic family, from upstream's fragments ----------------------------------


def upstream_signals() -> dict[str, Any]:
    """Upstream's signal fragments merged into one ``routing.signals`` (each family once)."""
    signals: dict[str, Any] = {}
    for name in FRAGMENTS:
        (path,) = FRAGMENTS_DIR.glob(f"**/fragments/signal/{name}.yaml")
        for family, items in yaml.safe_load(path.read_text())["routing"]["signals"].items():
            signals.setdefault(family, []).extend(items)
    return signals


def decision(name: str, priority: int, kind: str, signal: str) -> dict[str, Any]:
    return {
        "name": name,
        "priority": priority,
        "rules": {"operator": "AND", "conditions": [{"type": kind, "name": signal}]},
        "modelRefs": [{"model": "general"}],
    }


DETERMINISTIC_ROUTING: dict[str, Any] = {
    "signals": upstream_signals(),
    "decisions": [
        decision("no_consent", 100, "metadata", "consent-denied"),
        decision("admins", 90, "authz", "admin"),
        decision("long", 80, "context", "long_context"),
        decision("questions", 70, "structure", "many_questions"),
        decision("agentic", 60, "conversation", "tool_heavy"),
        decision("spanish", 50, "language", "es"),
        decision("urgent", 40, "keyword", "urgent_keywords"),
    ],
}
TOOLS = [
    {"type": "function", "function": {"name": f"tool_{i}", "parameters": {"type": "object"}}}
    for i in range(3)
]
PARAGRAPH = (
    "Our service keeps a queue of jobs per tenant and a worker pool that drains them; "
    "under load the oldest jobs of a busy tenant wait behind a newer burst of another. "
)


def _chat(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"messages": messages, "max_tokens": 16, **extra}


DETERMINISTIC_CHATS: list[Chat] = [
    (_chat(user("hello there"), metadata={"consent": "denied"}), IDENTITY),  # metadata
    (_chat(user("hello, who can see this?")), ADMIN),  # authz
    (_chat(user("Why? How? When? Where? Who?")), IDENTITY),  # structure
    (_chat(user("go"), tools=TOOLS), IDENTITY),  # conversation
    (_chat(user(SPANISH)), IDENTITY),  # language
    (_chat(user("this is urgent, the build is broken")), IDENTITY),  # keywords
    (_chat(user("tell me a story about a cat")), IDENTITY),  # nothing matches
    (
        _chat(
            [
                {"role": "system", "content": "You are a concise assistant."},
                {"role": "user", "content": "First, summarise the design."},
                {"role": "assistant", "content": "It queues jobs per tenant."},
                {"role": "user", "content": PARAGRAPH * 12 + "Then list 3 risks as a table."},
            ]
        ),
        IDENTITY,
    ),  # multi-turn, ~2 KB of text, nothing matches
]
LONG_CHAT: Chat = (_chat(user("word " * 40_000)), IDENTITY)  # ~50K tokens: long_context


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("keyword-only", KEYWORD_ROUTING, PLAIN_CHATS),
        Profile(
            "deterministic",
            DETERMINISTIC_ROUTING,
            DETERMINISTIC_CHATS,
            extra={"one 40K-word chat (long_context)": LONG_CHAT},
        ),
        Profile("embedding+domain", SEMANTIC_ROUTING, PLAIN_CHATS, needs_worker=True),
    )
}
