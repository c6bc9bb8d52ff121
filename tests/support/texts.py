"""A few hundred varied English texts, made deterministically (no data set to download): short
questions, statements and long multi-clause requests, 3 to ~100 tokens, for tests that compare
answers across precisions."""

from __future__ import annotations

import random

SUBJECTS = (
    "my order",
    "the invoice",
    "our quarterly report",
    "the new laptop",
    "this recipe",
    "the train to Berlin",
    "a python script",
    "the hotel booking",
    "my password",
    "the weather in Paris",
    "the election results",
    "a broken washing machine",
    "the kubernetes cluster",
    "her thesis",
    "the football match",
    "an insurance claim",
)
VERBS = (
    "has not arrived",
    "was charged twice",
    "keeps crashing",
    "needs a refund",
    "looks wrong",
    "was cancelled",
    "should be translated",
    "must be reviewed today",
    "is slower than expected",
    "cannot be opened",
    "was delivered to the wrong address",
    "needs more memory",
    "is due next week",
    "got great reviews",
)
TAILS = (
    "Can you help me?",
    "What should I do now?",
    "Please explain why.",
    "I would like to speak to a manager.",
    "Thanks in advance!",
    "Is there a workaround?",
    "How long will it take?",
    "Does this happen often?",
    "",
)
EXTRA = (
    "def add(a, b): return a + b",
    "SELECT * FROM users WHERE id = 7;",
    "Der Zug ist spät.",
    "¿Dónde está la estación?",
    "100% of 42 is 42",
    "e = mc^2",
    "hello",
    "ok",
)


def varied_texts(n: int = 300, seed: int = 26) -> list[str]:
    rng = random.Random(seed)
    out: list[str] = []
    for i in range(n):
        if i % 10 == 0:
            out.append(rng.choice(EXTRA))
            continue
        clauses = rng.choice((1, 1, 2, 3, 5, 8, 12))
        parts = [
            f"{rng.choice(SUBJECTS).capitalize()} {rng.choice(VERBS)}." for _ in range(clauses)
        ]
        out.append(" ".join([*parts, rng.choice(TAILS)]).strip())
    return out
