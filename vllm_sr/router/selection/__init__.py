"""Model selection inside a matched decision: the selectors vllm-sr runs besides ``static``
(``latency_aware``, ``multi_factor``: :mod:`.selectors`), the per-model observations they read
(:mod:`.observations`) and the decision-level wiring with vllm-sr's health rule
(:mod:`.decide`)."""
