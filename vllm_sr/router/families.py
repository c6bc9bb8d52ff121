"""The names each signal family goes by on the wire: the rule-leaf type (``keyword``), the key
of upstream's eval documents (``keywords``) and the word of its ``x-vsr-matched-<family>``
debug header (``keywords``). One table, so the eval answer and the headers cannot drift."""

from __future__ import annotations

# leaf type: (eval MatchedSignals key, debug header family word or None when upstream has none)
FAMILIES: dict[str, tuple[str, str | None]] = {
    "keyword": ("keywords", "keywords"),
    "embedding": ("embeddings", "embeddings"),
    "domain": ("domains", "domains"),
    "fact_check": ("fact_check", "fact-check"),
    "user_feedback": ("user_feedback", "user-feedback"),
    "reask": ("reask", "reask"),
    "preference": ("preferences", "preference"),
    "language": ("language", "language"),
    "context": ("context", "context"),
    "structure": ("structure", "structure"),
    "complexity": ("complexity", "complexity"),
    "modality": ("modality", "modality"),
    "authz": ("authz", "authz"),
    "jailbreak": ("jailbreak", "jailbreak"),
    "pii": ("pii", "pii"),
    "safety": ("safety", "safety"),
    "kb": ("kb", "kb"),
    "conversation": ("conversation", "conversation"),
    "event": ("event", "event"),
    "metadata": ("metadata", None),
    "classifier": ("classifier", None),
    "projection": ("projection", "projections"),
}

EVAL_KEY = {kind: names[0] for kind, names in FAMILIES.items()}
DEBUG_HEADER_WORD = {kind: names[1] for kind, names in FAMILIES.items() if names[1] is not None}
